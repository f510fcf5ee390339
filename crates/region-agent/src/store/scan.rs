//! A bounded listing of string records by key pattern: what `leasehold
//! lease list` reads the Region's block-lease records with
//! ([`crate::lease::list`]). Inspection only: nothing is written, and a
//! record changing while the listing runs may be seen in either state or
//! (as with Redis's SCAN) missed.
//!
//! How each store walks its keys:
//! - one Redis node (`RedisStore::scan_node`): `SCAN cursor MATCH
//!   <pattern> COUNT n TYPE string`, then one pipeline of `TIME` and a
//!   `GET` per key found, so each record is judged on the store's clock
//!   read with it;
//! - a Redis Cluster: the same on every primary of the slot map, in
//!   parallel ([`crate::store::cluster`]);
//! - the in-memory store: its expiry index in chunks, each under its lock
//!   ([`crate::store::keyspace::Keyspace::scan_expiring`]): only keys with
//!   an expiry are found there (every record listed has one).
//!
//! Bounds, each ending the listing with `truncated` and its reason
//! ([`ScanStop`]): at most `max_kept` records kept (over all shards: a
//! shared budget, so memory stays at `max_kept` records whatever the
//! shard count), at most `max_calls_per_shard` SCAN calls (or index
//! chunks) of `keys_per_call` keys per shard, and one deadline over all
//! of it. A shard that fails is named in `shard_errors` and the others
//! still answer.

use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::time::Instant;

use crate::store::StoreError;

/// What to list and how far to go.
#[derive(Debug, Clone)]
pub struct ScanRequest<'a> {
    /// Redis MATCH pattern; `*` is the only wildcard ([`check_pattern`]).
    pub pattern: &'a str,
    /// Most records kept, over all shards.
    pub max_kept: usize,
    /// Most SCAN calls (in-memory: index chunks) per shard.
    pub max_calls_per_shard: usize,
    /// SCAN's COUNT hint (in-memory: index entries per chunk).
    pub keys_per_call: usize,
    /// Past it no further call starts.
    pub deadline: Instant,
}

/// One string record found, with the store's clock when it was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScannedRecord {
    pub key: String,
    pub value: String,
    pub now_ms: i64,
}

/// Which records the caller keeps (the others count for nothing but
/// `matched_keys`).
pub type Keep<'a> = &'a (dyn Fn(&ScannedRecord) -> bool + Send + Sync);

/// Why a listing stopped before it had seen every key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ScanStop {
    /// `max_kept` records were kept and more matched.
    MaxKept,
    /// A shard made `max_calls_per_shard` calls and had keys left.
    MaxCalls,
    /// The deadline passed.
    Deadline,
    /// A shard could not be read (named in `shard_errors`).
    ShardFailed,
}

impl ScanStop {
    pub fn name(self) -> &'static str {
        match self {
            ScanStop::MaxKept => "max_records",
            ScanStop::MaxCalls => "scan_budget",
            ScanStop::Deadline => "deadline",
            ScanStop::ShardFailed => "shard_unavailable",
        }
    }
}

/// What a listing found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScanOutcome {
    pub kept: Vec<ScannedRecord>,
    /// Keys the pattern matched (kept or not).
    pub matched_keys: u64,
    /// Matched keys whose value could not be read (a GET refused: a slot
    /// moving, a key of another type).
    pub unreadable_keys: u64,
    /// Shards (primaries) asked.
    pub shards: u32,
    /// Why the listing is incomplete, in [`ScanStop`] order; empty when
    /// every key was seen.
    pub stopped: Vec<ScanStop>,
    /// One line per shard that failed: its name and the error.
    pub shard_errors: Vec<String>,
}

/// Why nothing could be listed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScanError {
    #[error("the {store} store cannot list its records")]
    Unsupported { store: &'static str },
    #[error("scan pattern {0:?}: `*` is the only wildcard")]
    Pattern(String),
    #[error("{0}")]
    Store(#[from] StoreError),
}

/// Refuses a pattern with a glob character other than `*` (`?`, `[`, `]`,
/// `\`): the in-memory store matches `*` only, and both stores must list
/// the same keys.
pub fn check_pattern(pattern: &str) -> Result<(), ScanError> {
    match pattern.contains(['?', '[', ']', '\\']) {
        true => Err(ScanError::Pattern(pattern.to_string())),
        false => Ok(()),
    }
}

/// Whether `key` matches `pattern`, `*` matching any run of bytes (what
/// Redis's MATCH does for a pattern [`check_pattern`] accepts).
pub fn glob_matches(pattern: &str, key: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = key.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        // No `*`: the whole key.
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// The records all shards may keep together: `max_kept + 1`, the one more
/// telling that the listing is truncated.
#[derive(Debug)]
pub struct KeptBudget {
    taken: AtomicUsize,
    max_kept: usize,
}

impl KeptBudget {
    pub fn new(max_kept: usize) -> Self {
        KeptBudget {
            taken: AtomicUsize::new(0),
            max_kept,
        }
    }

    /// True when one more record may be kept.
    pub fn take(&self) -> bool {
        self.taken.fetch_add(1, Ordering::Relaxed) <= self.max_kept
    }
}

/// One shard's part of a listing.
#[derive(Debug, Default)]
pub struct ShardScan {
    pub kept: Vec<ScannedRecord>,
    pub matched_keys: u64,
    pub unreadable_keys: u64,
    pub stopped: Option<ScanStop>,
}

impl ShardScan {
    /// Judges one record found: kept when `keep` says so and the shared
    /// budget allows; false once the budget is spent (stop this shard).
    pub fn offer(&mut self, record: ScannedRecord, keep: Keep<'_>, budget: &KeptBudget) -> bool {
        self.matched_keys += 1;
        if !keep(&record) {
            return true;
        }
        if !budget.take() {
            self.stopped = Some(ScanStop::MaxKept);
            return false;
        }
        self.kept.push(record);
        true
    }
}

/// The shards' parts as one outcome: a failed shard is named (`name`,
/// its error); every shard failing is the first one's error. Keeps at most
/// `max_kept` records (one more was found: truncated).
pub fn merge(
    shards: Vec<(String, Result<ShardScan, StoreError>)>,
    max_kept: usize,
) -> Result<ScanOutcome, ScanError> {
    let mut outcome = ScanOutcome {
        shards: shards.len() as u32,
        ..ScanOutcome::default()
    };
    let mut first_error = None;
    let mut answered = 0;
    for (name, shard) in shards {
        match shard {
            Ok(shard) => {
                answered += 1;
                outcome.kept.extend(shard.kept);
                outcome.matched_keys += shard.matched_keys;
                outcome.unreadable_keys += shard.unreadable_keys;
                outcome.stopped.extend(shard.stopped);
            }
            Err(error) => {
                outcome.shard_errors.push(format!("{name}: {error}"));
                outcome.stopped.push(ScanStop::ShardFailed);
                first_error.get_or_insert(error);
            }
        }
    }
    if answered == 0 {
        if let Some(error) = first_error {
            return Err(error.into());
        }
    }
    if outcome.kept.len() > max_kept {
        outcome.kept.truncate(max_kept);
        outcome.stopped.push(ScanStop::MaxKept);
    }
    outcome.stopped.sort();
    outcome.stopped.dedup();
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASES: &str = "lh:v1:{*}:_lease:*";

    #[test]
    fn star_is_the_only_wildcard_and_matches_any_run() {
        assert!(check_pattern(LEASES).is_ok());
        for bad in ["a?", "a[bc]", "a\\*"] {
            assert!(check_pattern(bad).is_err(), "{bad}");
        }
        for key in [
            "lh:v1:{atlas}:_lease:0123456789abcdef:l-1",
            "lh:v1:{g-api}:_lease:b:x:y",
            "lh:v1:{}:_lease:",
        ] {
            assert!(glob_matches(LEASES, key), "{key}");
        }
        for key in [
            "lh:v1:{atlas}:p-hot:0123456789abcdef",
            "lh:v1:atlas:_lease:b:l",
            "lh:v2:{atlas}:_lease:b:l",
            "xlh:v1:{atlas}:_lease:b:l",
        ] {
            assert!(!glob_matches(LEASES, key), "{key}");
        }
        assert!(glob_matches("exact", "exact") && !glob_matches("exact", "exactly"));
        assert!(glob_matches("a*a", "aa") && !glob_matches("aa*aa", "aaa"));
        assert!(glob_matches("*", "") && glob_matches("a**b", "ab"));
    }

    fn record(n: usize) -> ScannedRecord {
        ScannedRecord {
            key: format!("k{n}"),
            value: "v".into(),
            now_ms: 0,
        }
    }

    #[test]
    fn the_kept_budget_is_shared_and_one_more_marks_truncation() {
        let budget = KeptBudget::new(2);
        let keep_all: Keep<'_> = &|_| true;
        let (mut a, mut b) = (ShardScan::default(), ShardScan::default());
        assert!(a.offer(record(1), keep_all, &budget));
        assert!(b.offer(record(2), keep_all, &budget));
        assert!(a.offer(record(3), keep_all, &budget));
        assert!(!b.offer(record(4), keep_all, &budget));
        assert_eq!(b.stopped, Some(ScanStop::MaxKept));
        let skip: Keep<'_> = &|_| false;
        assert!(
            b.offer(record(5), skip, &budget),
            "not kept: no budget used"
        );
        let merged = merge(vec![("a".into(), Ok(a)), ("b".into(), Ok(b))], 2).unwrap();
        assert_eq!(merged.kept.len(), 2);
        assert_eq!(merged.matched_keys, 5);
        assert_eq!(merged.stopped, vec![ScanStop::MaxKept]);
    }

    #[test]
    fn a_failed_shard_is_named_and_only_all_failing_is_an_error() {
        let down = || Err(StoreError::Ambiguous("no reply".into()));
        let merged = merge(
            vec![
                ("slots-0".into(), Ok(ShardScan::default())),
                ("slots-5461".into(), down()),
            ],
            10,
        )
        .unwrap();
        assert_eq!(merged.shard_errors, vec!["slots-5461: ambiguous: no reply"]);
        assert_eq!(merged.stopped, vec![ScanStop::ShardFailed]);
        assert!(merge(vec![("slots-0".into(), down())], 10).is_err());
    }
}
