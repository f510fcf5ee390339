//! Twin of `lua/multi_rule.lua`: up to [`MAX_RULES`] token buckets sharing
//! one hash tag, the enforcing ones charged all or none and the shadow ones
//! each on its own, with an optional idempotency record bound to a digest of
//! the enforcing charges.
//!
//! KEYS = decision record, then the n enforcing and the m shadow bucket
//! hashes {tokens, ts}. ARGV = slack_ms, decision_ttl_ms (0 = no record),
//! request_digest (32 lowercase hex, [`request_digest`]), shadow_count m,
//! then capacity, refill, period_ms, cost per bucket. Reply `{allowed,
//! denied_by, retry_after_ms, remaining_1 .. remaining_n, shadow_1 ..
//! shadow_m, replayed, now_ms}`; denied_by is the first denying enforcing
//! rule (1-based, 0 = none), retry -1 = some rule can never succeed;
//! shadow_i is 1 (charged), 0 (would have refused) or -1 (not evaluated:
//! a replay); replayed is 1 when the record answered.
//!
//! The record is `digest:` then the enforcing decision without `now_ms`, as
//! comma-separated decimal integers. A replay under the same digest returns
//! it with the current `now_ms` and touches nothing: no enforcing bucket and
//! no shadow bucket, so a retried request never counts twice. Under another
//! digest (the id reused with other principals, rules or costs) it is
//! refused with `Refused { request_id, reused }` and touches nothing either.
//!
//! **Records without a digest** (`allowed,denied_by,…`: written by the
//! version before digests) predate the binding: for their TTL (at most the
//! rules' `idempotent_ttl_ms`) they are trusted and replayed as that version
//! would have, unless their length shows another rule count, which proves
//! another request (refused as reused). See [`parse_record`].
//!
//! Shadow rules are not in the digest on purpose: a shadow rule never
//! refuses, so adding or removing one (a reload between a request and its
//! retry) must not turn the retry into a refused reuse.

use super::bucket::{self, BucketParams, BucketState};
use crate::args;
use crate::store::keyspace::Keyspace;
use crate::store::script::ScriptError;

/// Most rules one request may carry (ARCHITECTURE §3.6).
pub const MAX_RULES: usize = 8;

/// One rule: a bucket's rate and what this request costs against it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    pub params: BucketParams,
    pub cost_millitokens: u64,
}

/// Length of a request digest in lowercase hex characters (128 bits).
pub const DIGEST_HEX_LEN: usize = 32;

/// The digest a decision record is bound to: the first 128 bits of
/// SHA-256 over every (bucket key, cost in millitokens) of the request, in
/// rule order, each field length-prefixed so no two requests share an
/// encoding. Bucket keys carry the hash tag, the rule ids and the principal
/// hashes, so another principal, rule set or cost gives another digest.
/// Rates are left out on purpose: a retry across a policy reload that only
/// changed a rate is still the same request.
pub fn request_digest<'a>(charges: impl IntoIterator<Item = (&'a str, u64)>) -> String {
    use sha2::Digest;
    let mut hasher = sha2::Sha256::new();
    hasher.update(b"leasehold-decision-v1");
    for (key, cost_millitokens) in charges {
        hasher.update((key.len() as u64).to_be_bytes());
        hasher.update(key.as_bytes());
        hasher.update(cost_millitokens.to_be_bytes());
    }
    hex::encode(&hasher.finalize()[..DIGEST_HEX_LEN / 2])
}

/// Validated arguments of one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MultiArgs {
    pub slack_ms: u64,
    /// 0 = no idempotency record.
    pub decision_ttl_ms: u64,
    /// What a record is bound to (see [`request_digest`]).
    pub request_digest: String,
    /// Enforcing rules, charged all or none (at least one).
    pub rules: Vec<Rule>,
    /// Shadow rules, each charged on its own when it holds its cost.
    pub shadow: Vec<Rule>,
}

/// A digest as the script accepts it: exactly 32 lowercase hex characters.
fn is_digest(text: &str) -> bool {
    text.len() == DIGEST_HEX_LEN && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Most shadow rules one call carries: every rule but one enforcing rule.
pub const MAX_SHADOW_RULES: usize = MAX_RULES - 1;

/// Validates keys and arguments exactly in the script's order: shadow
/// count and rule count (`rules`), distinct keys (`keys`), slack_ms,
/// decision_ttl_ms, request_digest, then each rule's capacity, refill,
/// period_ms, cost. Reads no state.
pub fn parse(keys: &[String], argv: &[String]) -> Result<MultiArgs, ScriptError> {
    let total = keys.len().saturating_sub(1);
    let shadow_count = args::int("rules", argv.get(3), 0, MAX_SHADOW_RULES as u64)? as usize;
    if total <= shadow_count || total > MAX_RULES || argv.len() != 4 + 4 * total {
        return Err(ScriptError::InvalidArgument("rules".into()));
    }
    for (i, key) in keys.iter().enumerate() {
        if keys[i + 1..].contains(key) {
            return Err(ScriptError::InvalidArgument("keys".into()));
        }
    }
    let slack_ms = args::non_negative("slack_ms", argv.first())?;
    let decision_ttl_ms = args::non_negative("decision_ttl_ms", argv.get(1))?;
    let request_digest = argv[2].clone();
    if !is_digest(&request_digest) {
        return Err(ScriptError::InvalidArgument("request_digest".into()));
    }
    let mut rules = (0..total)
        .map(|i| {
            let at = 4 + 4 * i;
            let params = BucketParams::parse(argv, at)?;
            let cost_millitokens = args::positive("cost", argv.get(at + 3))?;
            Ok(Rule {
                params,
                cost_millitokens,
            })
        })
        .collect::<Result<Vec<_>, ScriptError>>()?;
    let shadow = rules.split_off(total - shadow_count);
    Ok(MultiArgs {
        slack_ms,
        decision_ttl_ms,
        request_digest,
        rules,
        shadow,
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

/// The record's text: the digest, ':', then the decision's integers joined
/// by commas.
pub fn record_text(digest: &str, values: &[i64]) -> String {
    let values = values
        .iter()
        .map(|v| v.to_string())
        .collect::<Vec<_>>()
        .join(",");
    format!("{digest}:{values}")
}

/// Parses a stored record for a request of `n` enforcing rules under
/// `digest` as the script does, into the decision it replays (without
/// `now_ms`):
/// - `digest:values`: the digest must be 32 lowercase hex (else
///   `InvalidArgument("decision_record")`) and equal `digest` (else
///   `Refused { request_id, reused }`);
/// - `values` alone (no ':'): a record from before digests, trusted for its
///   TTL; a well-formed one of another length (at least one rule) is
///   another request, `Refused { request_id, reused }`;
/// - values: exactly 3 + n comma-separated integers (optional '-', digits,
///   at most 17 characters, magnitude ≤ 2^52); anything else
///   `InvalidArgument("decision_record")`.
pub fn parse_record(text: &str, digest: &str, n: usize) -> Result<Vec<i64>, ScriptError> {
    let malformed = || ScriptError::InvalidArgument("decision_record".into());
    let reused = || ScriptError::Refused {
        field: "request_id".into(),
        reason: "reused".into(),
    };
    // Lua's '^([0-9a-f]+):(.*)$' takes the longest hex run before the first ':'.
    let (bound, body) = match text.split_once(':') {
        Some((stored, body)) => {
            if !is_digest(stored) {
                return Err(malformed());
            }
            if stored != digest {
                return Err(reused());
            }
            (true, body)
        }
        None => (false, text),
    };
    let values = body
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
        return Err(if !bound && values.len() >= 4 {
            reused()
        } else {
            malformed()
        });
    }
    Ok(values)
}

/// A shadow bucket decided alone: charged (and its state to store
/// returned) only when it holds the cost; never refused by another rule.
pub fn decide_shadow(
    stored: Option<BucketState>,
    rule: &Rule,
    now_ms: i64,
) -> (bool, Option<BucketState>) {
    let state = BucketState::refilled(stored, &rule.params, now_ms);
    let holds = rule.cost_millitokens <= rule.params.capacity_millitokens
        && state.tokens_millitokens >= rule.cost_millitokens;
    if !holds {
        return (false, None);
    }
    let after = BucketState {
        tokens_millitokens: state.tokens_millitokens - rule.cost_millitokens,
        ..state
    };
    (true, Some(after))
}

/// Shadow outcome in a reply: not evaluated (a replay).
pub const SHADOW_NOT_EVALUATED: i64 = -1;

/// Runs the script's logic on the keyspace, exactly as the Lua does on Redis.
pub fn eval(
    space: &mut Keyspace,
    keys: &[String],
    argv: &[String],
    now_ms: i64,
) -> Result<Vec<i64>, ScriptError> {
    let parsed = parse(keys, argv)?;
    let record_key = &keys[0];
    let (bucket_keys, shadow_keys) = keys[1..].split_at(parsed.rules.len());
    if parsed.decision_ttl_ms > 0 {
        if let Some(prior) = space.get(record_key, now_ms).map_err(bucket::wrong_type)? {
            // A replay touches nothing, shadow buckets included.
            let mut values = parse_record(&prior, &parsed.request_digest, parsed.rules.len())?;
            values.extend(std::iter::repeat_n(
                SHADOW_NOT_EVALUATED,
                parsed.shadow.len(),
            ));
            values.extend([1, now_ms]);
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
            record_text(&parsed.request_digest, &values),
            Some(parsed.decision_ttl_ms as i64),
            now_ms,
        );
    }
    for (key, rule) in shadow_keys.iter().zip(&parsed.shadow) {
        let (charged, write) = decide_shadow(bucket::load(space, key, now_ms)?, rule, now_ms);
        if let Some(state) = write {
            let ttl = rule.params.full_refill_ms() + parsed.slack_ms;
            bucket::store(space, key, state, ttl, now_ms)?;
        }
        values.push(i64::from(charged));
    }
    values.extend([0, now_ms]);
    Ok(values)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::MemoryStore;
    use crate::store::script::{ScriptCall, ScriptKind};

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

    const D: &str = "0123456789abcdef0123456789abcdef";
    const OTHER: &str = "fedcba9876543210fedcba9876543210";

    #[test]
    fn record_round_trips_and_rejects_malformed_text() {
        let values = vec![0, 2, -1, 0, 1 << 40];
        assert_eq!(parse_record(&record_text(D, &values), D, 2), Ok(values));
        for bad in [
            "",
            "1,0,0",
            "1,0,0,x,6",
            ":1,0,0,5,6",
            "0123456789abcdef:1,0,0,5,6",
            "0123456789ABCDEF0123456789ABCDEF:1,0,0,5,6",
            "0123456789abcdef0123456789abcdef0:1,0,0,5,6",
        ]
        .into_iter()
        .map(String::from)
        .chain(
            [
                "1,0,0",
                "1,0,0,5,6,7",
                "1,0,0,,6",
                "1,0,0,5,x",
                "1,0,0,5,1e3",
                "1,0,0,5, 6",
                "1,0,0,5,+6",
                "1,0,0,5:6",
                "1,0,0,5,4503599627370497",
            ]
            .map(|body| format!("{D}:{body}")),
        ) {
            assert_eq!(
                parse_record(&bad, D, 2),
                Err(ScriptError::InvalidArgument("decision_record".into())),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn record_without_digest_is_trusted_unless_its_length_shows_another_request() {
        // The format before digests: replayed as that version would have.
        assert_eq!(parse_record("0,1,500,0,5", D, 2), Ok(vec![0, 1, 500, 0, 5]));
        for other in ["1,0,0,5", "1,0,0,5,6,7"] {
            assert_eq!(
                parse_record(other, D, 2),
                Err(ScriptError::Refused {
                    field: "request_id".into(),
                    reason: "reused".into()
                }),
                "{other:?}"
            );
        }
    }

    #[test]
    fn shadow_rules_charge_alone_and_never_on_a_replay() {
        let store = MemoryStore::default();
        // One enforcing rule that denies (cost above what it holds after the
        // first call), two shadow rules: one holds its cost, one never can.
        let mut c = ScriptCall::new(ScriptKind::MultiRule)
            .key("d")
            .key("e")
            .key("s1")
            .key("s2")
            .arg(0)
            .arg(60_000)
            .arg(D)
            .arg(2);
        for (capacity, refill, period, cost) in [
            (20_000, 1, 1_000_000, 15_000),
            (20_000, 1, 1_000_000, 1_000),
            (500, 1, 1_000_000, 1_000),
        ] {
            c = c.arg(capacity).arg(refill).arg(period).arg(cost);
        }
        assert_eq!(
            store.eval_at(&c, 0).unwrap().values,
            vec![1, 0, 0, 5_000, 1, 0, 0, 0]
        );
        assert_eq!(ts_of(&store, "s1", 0)[0].as_deref(), Some("19000"));
        assert!(!store.with_keyspace(|s| s.exists("s2", 0)));
        // The replay: the record's answer, shadows not evaluated, nothing written.
        assert_eq!(
            store.eval_at(&c, 5).unwrap().values,
            vec![1, 0, 0, 5_000, -1, -1, 1, 5]
        );
        assert_eq!(ts_of(&store, "s1", 5)[0].as_deref(), Some("19000"));
        // A fresh id: the enforcing rule denies, the shadow still decides alone.
        let mut fresh = c.clone();
        fresh.keys[0] = "d2".into();
        assert_eq!(
            store.eval_at(&fresh, 6).unwrap().values,
            vec![0, 1, 10_000_000_000, 5_000, 1, 0, 0, 6]
        );
        assert_eq!(ts_of(&store, "s1", 6)[0].as_deref(), Some("18000"));
    }

    #[test]
    fn record_of_another_request_is_refused_as_reused() {
        let text = record_text(OTHER, &[1, 0, 0, 5, 6]);
        assert_eq!(
            parse_record(&text, D, 2),
            Err(ScriptError::Refused {
                field: "request_id".into(),
                reason: "reused".into()
            })
        );
    }

    #[test]
    fn digest_changes_with_every_key_and_cost_and_with_their_order() {
        let base = request_digest([("lh:v1:{t}:r:a", 1_000), ("lh:v1:{t}:s:_", 1_000)]);
        assert_eq!(base.len(), DIGEST_HEX_LEN);
        assert!(is_digest(&base));
        assert_eq!(
            base,
            request_digest([("lh:v1:{t}:r:a", 1_000), ("lh:v1:{t}:s:_", 1_000)])
        );
        for other in [
            request_digest([("lh:v1:{t}:r:b", 1_000), ("lh:v1:{t}:s:_", 1_000)]),
            request_digest([("lh:v1:{t}:r:a", 2_000), ("lh:v1:{t}:s:_", 1_000)]),
            request_digest([("lh:v1:{t}:r:a", 1_000)]),
            request_digest([("lh:v1:{t}:s:_", 1_000), ("lh:v1:{t}:r:a", 1_000)]),
            // Length prefixes: moving bytes between keys changes the digest.
            request_digest([("lh:v1:{t}:r:a", 1_000), ("lh:v1:{t}:s:", 1_000)]),
        ] {
            assert_ne!(base, other);
        }
    }

    #[test]
    fn duplicate_keys_and_bad_rule_counts_are_refused() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let argv = s(&["0", "0", D, "0", "10", "1", "1", "1"]);
        assert_eq!(
            parse(
                &s(&["d", "a", "a"]),
                &s(&["0", "0", D, "0", "10", "1", "1", "1", "10", "1", "1", "1"])
            ),
            Err(ScriptError::InvalidArgument("keys".into()))
        );
        assert_eq!(
            parse(&s(&["a", "a"]), &argv),
            Err(ScriptError::InvalidArgument("keys".into()))
        );
        assert_eq!(
            parse(&s(&["d"]), &s(&["0", "0", D, "0"])),
            Err(ScriptError::InvalidArgument("rules".into()))
        );
        assert_eq!(
            parse(&s(&["d", "a"]), &argv[..7]),
            Err(ScriptError::InvalidArgument("rules".into()))
        );
        assert!(parse(&s(&["d", "a"]), &argv).is_ok());
        // Shadow count: at least one enforcing rule stays, at most 7 shadows.
        for shadows in ["1", "8", "x", "-1"] {
            let mut bad = argv.clone();
            bad[3] = shadows.to_string();
            assert_eq!(
                parse(&s(&["d", "a"]), &bad),
                Err(ScriptError::InvalidArgument("rules".into())),
                "{shadows:?}"
            );
        }
        let mut bad = argv.clone();
        for digest in [
            "",
            "0123",
            &D.to_uppercase(),
            &format!("{D}0"),
            &D.replace('0', "g"),
        ] {
            bad[2] = digest.to_string();
            assert_eq!(
                parse(&s(&["d", "a"]), &bad),
                Err(ScriptError::InvalidArgument("request_digest".into())),
                "{digest:?}"
            );
        }
    }

    fn call(keys: &[&str], slack: u64, dec_ttl: u64, rules: &[(u64, u64, u64, u64)]) -> ScriptCall {
        let mut c = ScriptCall::new(ScriptKind::MultiRule);
        for k in keys {
            c = c.key(*k);
        }
        c = c.arg(slack).arg(dec_ttl).arg(D).arg(0);
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
            vec![1, 0, 0, 15_000, 15_000, 0, 10_000]
        );
        let back = store.eval_at(&c, 4_000).unwrap().values;
        assert_eq!(back, vec![1, 0, 0, 10_000, 10_000, 0, 4_000]);
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
            vec![1, 0, 0, 19_000, 0, 0]
        );
        let lower = call(&["d", "a"], 0, 0, &[(5_000, 1, 1_000_000, 1_000)]);
        assert_eq!(
            store.eval_at(&lower, 1).unwrap().values,
            vec![1, 0, 0, 4_000, 0, 1]
        );
    }

    #[test]
    fn replay_returns_the_stored_decision_and_debits_once() {
        let store = MemoryStore::default();
        let c = call(&["d", "a"], 0, 60_000, &[(20_000, 1, 1_000_000, 1_000)]);
        assert_eq!(
            store.eval_at(&c, 0).unwrap().values,
            vec![1, 0, 0, 19_000, 0, 0]
        );
        assert_eq!(
            store.eval_at(&c, 5).unwrap().values,
            vec![1, 0, 0, 19_000, 1, 5]
        );
        assert_eq!(ts_of(&store, "a", 5)[0].as_deref(), Some("19000"));
        // After the record expires the same id decides afresh.
        assert_eq!(
            store.eval_at(&c, 60_001).unwrap().values,
            vec![1, 0, 0, 18_000, 0, 60_001]
        );
    }
}
