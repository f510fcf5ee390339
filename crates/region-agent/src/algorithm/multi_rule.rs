//! Twin of `lua/multi_rule.lua`: up to [`MAX_RULES`] token buckets sharing
//! one hash tag, charged all or none, with an optional idempotency record.
//!
//! KEYS = decision record, then the n bucket hashes {tokens, ts}. ARGV =
//! slack_ms, decision_ttl_ms (0 = no record), then capacity, refill,
//! period_ms, cost per bucket. Reply `{allowed, denied_by, retry_after_ms,
//! remaining_1 .. remaining_n, now_ms}`; denied_by is the first denying rule
//! (1-based, 0 = none), retry -1 = some rule can never succeed.
//!
//! The record is the decision without `now_ms`, as comma-separated decimal
//! integers; a replay returns it with the current `now_ms` and touches nothing.

use super::bucket::{self, BucketParams, BucketState};
use crate::args;
use crate::keyspace::Keyspace;
use crate::script::ScriptError;

/// Most rules one request may carry (ARCHITECTURE §3.6).
pub const MAX_RULES: usize = 8;

/// One rule: a bucket's rate and what this request costs against it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    pub params: BucketParams,
    pub cost_millitokens: u64,
}

/// Validated arguments of one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MultiArgs {
    pub slack_ms: u64,
    /// 0 = no idempotency record.
    pub decision_ttl_ms: u64,
    pub rules: Vec<Rule>,
}

/// Validates keys and arguments exactly in the script's order: rule count
/// (`rules`), distinct keys (`keys`), slack_ms, decision_ttl_ms, then each
/// rule's capacity, refill, period_ms, cost. Reads no state.
pub fn parse(keys: &[String], argv: &[String]) -> Result<MultiArgs, ScriptError> {
    let n = keys.len().saturating_sub(1);
    if !(1..=MAX_RULES).contains(&n) || argv.len() != 2 + 4 * n {
        return Err(ScriptError::InvalidArgument("rules".into()));
    }
    for (i, key) in keys.iter().enumerate() {
        if keys[i + 1..].contains(key) {
            return Err(ScriptError::InvalidArgument("keys".into()));
        }
    }
    let slack_ms = args::non_negative("slack_ms", argv.first())?;
    let decision_ttl_ms = args::non_negative("decision_ttl_ms", argv.get(1))?;
    let rules = (0..n)
        .map(|i| {
            let at = 2 + 4 * i;
            let params = BucketParams::parse(argv, at)?;
            let cost_millitokens = args::positive("cost", argv.get(at + 3))?;
            Ok(Rule {
                params,
                cost_millitokens,
            })
        })
        .collect::<Result<Vec<_>, ScriptError>>()?;
    Ok(MultiArgs {
        slack_ms,
        decision_ttl_ms,
        rules,
    })
}

/// The decision of one multi-rule call (before `now_ms` is appended).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MultiDecision {
    pub allowed: bool,
    /// First denying rule, 1-based; 0 when allowed.
    pub denied_by: usize,
    /// 0 when allowed; -1 when some rule's cost exceeds its capacity;
    /// otherwise the longest wait over the denying rules.
    pub retry_after_ms: i64,
    /// Each bucket after refill, and after the debit when allowed.
    pub remaining_millitokens: Vec<u64>,
}

impl MultiDecision {
    /// The reply without `now_ms`; also what the record stores.
    pub fn values(&self) -> Vec<i64> {
        let mut values = vec![
            i64::from(self.allowed),
            self.denied_by as i64,
            self.retry_after_ms,
        ];
        values.extend(self.remaining_millitokens.iter().map(|&r| r as i64));
        values
    }
}

/// Pure decision over all rules. Keeps "all or none": the states to store
/// are returned only when every rule allows (None: write no bucket).
/// `stored[i]` is bucket i's state as read (None: missing, i.e. full).
pub fn decide(
    stored: &[Option<BucketState>],
    rules: &[Rule],
    now_ms: i64,
) -> (MultiDecision, Option<Vec<BucketState>>) {
    let mut denied_by = 0;
    let mut retry: i64 = 0;
    let mut states = Vec::with_capacity(rules.len());
    for (i, rule) in rules.iter().enumerate() {
        let state = BucketState::refilled(stored.get(i).copied().flatten(), &rule.params, now_ms);
        let wait = if rule.cost_millitokens > rule.params.capacity_millitokens {
            Some(-1)
        } else if state.tokens_millitokens < rule.cost_millitokens {
            let deficit = rule.cost_millitokens - state.tokens_millitokens;
            Some(rule.params.retry_after_ms(deficit) as i64)
        } else {
            None
        };
        if let Some(wait) = wait {
            if denied_by == 0 {
                denied_by = i + 1;
            }
            // -1 ("never") dominates every finite wait.
            retry = if wait == -1 || retry == -1 {
                -1
            } else {
                retry.max(wait)
            };
        }
        states.push(state);
    }
    if denied_by != 0 {
        let decision = MultiDecision {
            allowed: false,
            denied_by,
            retry_after_ms: retry,
            remaining_millitokens: states.iter().map(|s| s.tokens_millitokens).collect(),
        };
        return (decision, None);
    }
    let after: Vec<BucketState> = states
        .iter()
        .zip(rules)
        .map(|(state, rule)| BucketState {
            tokens_millitokens: state.tokens_millitokens - rule.cost_millitokens,
            ..*state
        })
        .collect();
    let decision = MultiDecision {
        allowed: true,
        denied_by: 0,
        retry_after_ms: 0,
        remaining_millitokens: after.iter().map(|s| s.tokens_millitokens).collect(),
    };
    (decision, Some(after))
}

/// The record's text: the decision's integers joined by commas.
pub fn record_text(values: &[i64]) -> String {
    values
        .iter()
        .map(|v| v.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// Parses a stored record for `n` rules as the script does: exactly 3 + n
/// comma-separated integers (optional '-', digits, at most 17 characters,
/// magnitude ≤ 2^52); anything else is `InvalidArgument("decision_record")`.
pub fn parse_record(text: &str, n: usize) -> Result<Vec<i64>, ScriptError> {
    let malformed = || ScriptError::InvalidArgument("decision_record".into());
    let values = text
        .split(',')
        .map(|piece| {
            let digits = piece.strip_prefix('-').unwrap_or(piece);
            if piece.len() > 17 || digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit())
            {
                return Err(malformed());
            }
            let v: i64 = piece.parse().map_err(|_| malformed())?;
            if v.unsigned_abs() > args::MAX_PRODUCT {
                return Err(malformed());
            }
            Ok(v)
        })
        .collect::<Result<Vec<_>, ScriptError>>()?;
    if values.len() != 3 + n {
        return Err(malformed());
    }
    Ok(values)
}

/// Runs the script's logic on the keyspace, exactly as the Lua does on Redis.
pub fn eval(
    space: &mut Keyspace,
    keys: &[String],
    argv: &[String],
    now_ms: i64,
) -> Result<Vec<i64>, ScriptError> {
    let parsed = parse(keys, argv)?;
    let record_key = &keys[0];
    let bucket_keys = &keys[1..];
    if parsed.decision_ttl_ms > 0 {
        if let Some(prior) = space.get(record_key, now_ms).map_err(bucket::wrong_type)? {
            let mut values = parse_record(&prior, parsed.rules.len())?;
            values.push(now_ms);
            return Ok(values);
        }
    }
    let stored = bucket_keys
        .iter()
        .map(|key| bucket::load(space, key, now_ms))
        .collect::<Result<Vec<_>, ScriptError>>()?;
    let (decision, write) = decide(&stored, &parsed.rules, now_ms);
    if let Some(states) = write {
        for ((key, state), rule) in bucket_keys.iter().zip(states).zip(&parsed.rules) {
            let ttl = rule.params.full_refill_ms() + parsed.slack_ms;
            bucket::store(space, key, state, ttl, now_ms)?;
        }
    }
    let mut values = decision.values();
    if parsed.decision_ttl_ms > 0 {
        space.set(
            record_key,
            record_text(&values),
            Some(parsed.decision_ttl_ms as i64),
            now_ms,
        );
    }
    values.push(now_ms);
    Ok(values)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryStore;
    use crate::script::{ScriptCall, ScriptKind};

    const USER: BucketParams = BucketParams {
        capacity_millitokens: 20_000,
        refill_millitokens: 2_000,
        period_ms: 1_000,
    };
    const TENANT: BucketParams = BucketParams {
        capacity_millitokens: 1_000_000,
        refill_millitokens: 1_000_000,
        period_ms: 60_000,
    };

    fn rules(cost: u64) -> [Rule; 2] {
        [
            Rule {
                params: USER,
                cost_millitokens: cost,
            },
            Rule {
                params: TENANT,
                cost_millitokens: cost,
            },
        ]
    }

    fn holding(tokens: u64) -> Option<BucketState> {
        Some(BucketState {
            tokens_millitokens: tokens,
            ts_ms: 0,
        })
    }

    #[test]
    fn walk_through_allows_and_debits_every_bucket() {
        let (d, write) = decide(&[holding(1_000), holding(639_000)], &rules(1_000), 0);
        assert_eq!(d.values(), vec![1, 0, 0, 0, 638_000]);
        let write = write.unwrap();
        assert_eq!(write[0].tokens_millitokens, 0);
        assert_eq!(write[1].tokens_millitokens, 638_000);
    }

    #[test]
    fn denied_request_debits_no_bucket() {
        let (d, write) = decide(&[holding(0), holding(639_000)], &rules(1_000), 0);
        assert_eq!(d.values(), vec![0, 1, 500, 0, 639_000]);
        assert!(write.is_none());
    }

    #[test]
    fn retry_is_the_longest_wait_and_denied_by_the_first_denier() {
        let (d, _) = decide(&[holding(20_000), holding(3_000)], &rules(10_000), 0);
        assert_eq!(d.values(), vec![0, 2, 420, 20_000, 3_000]);
        // Both short: rule 1 named, the longer wait (rule 2's 420 vs 5,000) wins.
        let (d, _) = decide(&[holding(0), holding(3_000)], &rules(10_000), 0);
        assert_eq!((d.denied_by, d.retry_after_ms), (1, 5_000));
    }

    #[test]
    fn a_rule_that_can_never_succeed_dominates_the_retry() {
        let mut r = rules(1_000).to_vec();
        r.push(Rule {
            params: USER,
            cost_millitokens: 20_001,
        });
        let (d, write) = decide(&[holding(0), holding(0), None], &r, 0);
        assert_eq!((d.denied_by, d.retry_after_ms), (1, -1));
        assert_eq!(d.remaining_millitokens, vec![0, 0, 20_000]);
        assert!(write.is_none());
    }

    #[test]
    fn record_round_trips_and_rejects_malformed_text() {
        let values = vec![0, 2, -1, 0, 1 << 40];
        assert_eq!(parse_record(&record_text(&values), 2), Ok(values));
        for bad in [
            "",
            "1,0,0",
            "1,0,0,5,6,7",
            "1,0,0,,6",
            "1,0,0,5,x",
            "1,0,0,5,1e3",
            "1,0,0,5, 6",
            "1,0,0,5,+6",
            "1,0,0,5,4503599627370497",
        ] {
            assert_eq!(
                parse_record(bad, 2),
                Err(ScriptError::InvalidArgument("decision_record".into())),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn duplicate_keys_and_bad_rule_counts_are_refused() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let argv = s(&["0", "0", "10", "1", "1", "1"]);
        assert_eq!(
            parse(
                &s(&["d", "a", "a"]),
                &s(&["0", "0", "10", "1", "1", "1", "10", "1", "1", "1"])
            ),
            Err(ScriptError::InvalidArgument("keys".into()))
        );
        assert_eq!(
            parse(&s(&["a", "a"]), &argv),
            Err(ScriptError::InvalidArgument("keys".into()))
        );
        assert_eq!(
            parse(&s(&["d"]), &s(&["0", "0"])),
            Err(ScriptError::InvalidArgument("rules".into()))
        );
        assert_eq!(
            parse(&s(&["d", "a"]), &argv[..5]),
            Err(ScriptError::InvalidArgument("rules".into()))
        );
        assert!(parse(&s(&["d", "a"]), &argv).is_ok());
    }

    fn call(keys: &[&str], slack: u64, dec_ttl: u64, rules: &[(u64, u64, u64, u64)]) -> ScriptCall {
        let mut c = ScriptCall::new(ScriptKind::MultiRule);
        for k in keys {
            c = c.key(*k);
        }
        c = c.arg(slack).arg(dec_ttl);
        for (capacity, refill, period, cost) in rules {
            c = c.arg(capacity).arg(refill).arg(period).arg(cost);
        }
        c
    }

    fn ts_of(store: &MemoryStore, key: &str, now: i64) -> Vec<Option<String>> {
        store.with_keyspace(|s| s.hmget(key, &["tokens", "ts"], now).unwrap())
    }

    #[test]
    fn clock_back_gives_no_refill_and_ts_never_moves_back() {
        let store = MemoryStore::default();
        let c = call(&["d", "a", "b"], 0, 0, &[(20_000, 2_000, 1_000, 5_000); 2]);
        assert_eq!(
            store.eval_at(&c, 10_000).unwrap().values,
            vec![1, 0, 0, 15_000, 15_000, 10_000]
        );
        let back = store.eval_at(&c, 4_000).unwrap().values;
        assert_eq!(back, vec![1, 0, 0, 10_000, 10_000, 4_000]);
        assert_eq!(
            ts_of(&store, "a", 4_000),
            vec![Some("10000".into()), Some("10000".into())]
        );
    }

    #[test]
    fn far_forward_refills_at_most_a_full_bucket() {
        let store = MemoryStore::default();
        // Slack 2^40: nothing expires, so the stored state is what refills.
        let c = call(
            &["d", "a", "b"],
            1 << 40,
            0,
            &[(20_000, 2_000, 1_000, 20_000), (5_000, 1, 1, 1)],
        );
        assert_eq!(
            store.eval_at(&c, 0).unwrap().values[..5],
            [1, 0, 0, 0, 4_999]
        );
        let far = 1 << 45;
        assert_eq!(
            store.eval_at(&c, far).unwrap().values[..5],
            [1, 0, 0, 0, 4_999]
        );
        assert_eq!(
            ts_of(&store, "b", far),
            vec![Some("4999".into()), Some(far.to_string())]
        );
    }

    #[test]
    fn lowered_capacity_is_clamped_on_the_next_call() {
        let store = MemoryStore::default();
        let c = call(&["d", "a"], 0, 0, &[(20_000, 1, 1_000_000, 1_000)]);
        assert_eq!(
            store.eval_at(&c, 0).unwrap().values,
            vec![1, 0, 0, 19_000, 0]
        );
        let lower = call(&["d", "a"], 0, 0, &[(5_000, 1, 1_000_000, 1_000)]);
        assert_eq!(
            store.eval_at(&lower, 1).unwrap().values,
            vec![1, 0, 0, 4_000, 1]
        );
    }

    #[test]
    fn replay_returns_the_stored_decision_and_debits_once() {
        let store = MemoryStore::default();
        let c = call(&["d", "a"], 0, 60_000, &[(20_000, 1, 1_000_000, 1_000)]);
        assert_eq!(
            store.eval_at(&c, 0).unwrap().values,
            vec![1, 0, 0, 19_000, 0]
        );
        assert_eq!(
            store.eval_at(&c, 5).unwrap().values,
            vec![1, 0, 0, 19_000, 5]
        );
        assert_eq!(ts_of(&store, "a", 5)[0].as_deref(), Some("19000"));
        // After the record expires the same id decides afresh.
        assert_eq!(
            store.eval_at(&c, 60_001).unwrap().values,
            vec![1, 0, 0, 18_000, 60_001]
        );
    }
}
