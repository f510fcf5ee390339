//! The cold path's compact pack (issue 29, "a leaner cold-key script").
//!
//! A Check of one token-bucket rule is planned as a `multi_rule` call of
//! one enforcing rule, no shadow and no record. Sent as such (alone, or as a
//! `multi_decision` sub-call) Redis spends most of a decision marshalling
//! and validating its twelve keys and arguments. [`bucket_pack_call`] sends
//! a pack of such calls as one `bucket_pack` call instead: the bucket keys,
//! each distinct rule once, and a rule index per call only when there are
//! several. [`split_reply`] turns its reply back into the replies the
//! `multi_rule` calls would have given, so nothing above the store sees the
//! difference.
//!
//! Only calls the `multi_rule` script would accept are translated (checked
//! with its twin's parser), so no refusal moves from one script to another;
//! anything else goes as before.

use crate::algorithm::multi_rule;
use crate::store::script::{ScriptCall, ScriptError, ScriptKind, MULTI_DECISION_MAX_CALLS};

/// Values per decision in a `bucket_pack` reply: allowed, retry, remaining.
const PER_CALL: usize = 3;

/// One `bucket_pack` call answering every call of `calls` in order, when
/// each is a valid single-rule `multi_rule` call without record or shadow
/// and there are at most [`MULTI_DECISION_MAX_CALLS`]; `None` otherwise.
pub fn bucket_pack_call(calls: &[ScriptCall]) -> Option<ScriptCall> {
    if calls.is_empty() || calls.len() > MULTI_DECISION_MAX_CALLS {
        return None;
    }
    // Distinct rules as (capacity, refill, period_ms, cost, slack_ms), in
    // first-use order; at most one per call, so at most 64.
    let mut rules: Vec<[&str; 5]> = Vec::new();
    let mut which = Vec::with_capacity(calls.len());
    for call in calls {
        let rule = single_rule(call)?;
        let index = match rules.iter().position(|r| *r == rule) {
            Some(index) => index,
            None => {
                rules.push(rule);
                rules.len() - 1
            }
        };
        which.push(index + 1);
    }
    let mut pack = ScriptCall::new(ScriptKind::BucketPack).arg(rules.len());
    pack.keys
        .extend(calls.iter().map(|call| call.keys[1].clone()));
    for rule in &rules {
        pack.args.extend(rule.iter().map(|a| a.to_string()));
    }
    if rules.len() > 1 {
        pack.args.extend(which.iter().map(usize::to_string));
    }
    Some(pack)
}

/// The rule of a single-rule `multi_rule` call without record or shadow
/// that the script accepts; `None` for any other call.
fn single_rule(call: &ScriptCall) -> Option<[&str; 5]> {
    let args = &call.args;
    let plain = call.kind == ScriptKind::MultiRule
        && call.keys.len() == 2
        && args.len() == 8
        && args[1] == "0"
        && args[3] == "0";
    if !plain || multi_rule::parse(&call.keys, args).is_err() {
        return None;
    }
    Some([
        args[4].as_str(),
        args[5].as_str(),
        args[6].as_str(),
        args[7].as_str(),
        args[0].as_str(),
    ])
}

/// One call's answer in a pack: its `multi_rule` reply, or its own error.
pub type CallReply = Result<Vec<i64>, ScriptError>;

/// The `calls` replies of a `bucket_pack` reply, each as its `multi_rule`
/// call answers: `{allowed, denied_by, retry_after_ms, remaining, replayed
/// = 0, now_ms}`, or, for a bucket key holding another type, that call's
/// error. A reply of any other shape, or whose decision is not one the
/// script can give (an allow with a retry, a refusal without one), is
/// malformed: a store fault for every call, never an allow.
pub fn split_reply(values: &[i64], calls: usize) -> Result<Vec<CallReply>, ScriptError> {
    let malformed = |detail: String| ScriptError::MalformedReply {
        script: ScriptKind::BucketPack.name(),
        detail,
    };
    let Some((&now_ms, decisions)) = values.split_last() else {
        return Err(malformed("empty".into()));
    };
    if decisions.len() != PER_CALL * calls {
        return Err(malformed(format!(
            "{} values for {calls} calls",
            values.len()
        )));
    }
    decisions
        .chunks_exact(PER_CALL)
        .map(|d| {
            let (allowed, retry, remaining) = (d[0], d[1], d[2]);
            let consistent = match allowed {
                1 => retry == 0,
                0 => retry == -1 || retry > 0,
                -1 => retry == 0 && remaining == 0,
                _ => false,
            };
            if !consistent || remaining < 0 {
                return Err(malformed(format!("decision {d:?}")));
            }
            if allowed == -1 {
                return Ok(Err(wrong_type()));
            }
            Ok(Ok(vec![allowed, 1 - allowed, retry, remaining, 0, now_ms]))
        })
        .collect()
}

/// A bucket key holding another type: what Redis answers the command.
pub fn wrong_type() -> ScriptError {
    crate::algorithm::bucket::wrong_type(crate::store::keyspace::WrongType)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "0123456789abcdef0123456789abcdef";

    fn single(bucket: &str, rate: [u64; 3], cost: u64, slack: u64) -> ScriptCall {
        ScriptCall::new(ScriptKind::MultiRule)
            .key("lh:v1:{t}:decision:d")
            .key(bucket)
            .arg(slack)
            .arg(0)
            .arg(DIGEST)
            .arg(0)
            .arg(rate[0])
            .arg(rate[1])
            .arg(rate[2])
            .arg(cost)
    }

    #[test]
    fn one_rule_is_sent_once_and_needs_no_indices() {
        let calls = [
            single("lh:v1:{t}:r:a", [20_000, 2_000, 1_000], 1_000, 5),
            single("lh:v1:{t}:r:b", [20_000, 2_000, 1_000], 1_000, 5),
        ];
        let pack = bucket_pack_call(&calls).expect("eligible");
        assert_eq!(pack.kind, ScriptKind::BucketPack);
        assert_eq!(pack.keys, ["lh:v1:{t}:r:a", "lh:v1:{t}:r:b"]);
        assert_eq!(pack.args, ["1", "20000", "2000", "1000", "1000", "5"]);
    }

    #[test]
    fn several_rules_are_indexed_per_call() {
        let calls = [
            single("lh:v1:{t}:r:a", [20_000, 2_000, 1_000], 1_000, 5),
            single("lh:v1:{t}:r:b", [20_000, 2_000, 1_000], 2_000, 5),
            single("lh:v1:{t}:r:a", [20_000, 2_000, 1_000], 1_000, 5),
        ];
        let pack = bucket_pack_call(&calls).expect("eligible");
        assert_eq!(pack.keys.len(), 3);
        assert_eq!(
            pack.args,
            [
                "2", "20000", "2000", "1000", "1000", "5", "20000", "2000", "1000", "2000", "5",
                "1", "2", "1"
            ]
        );
    }

    #[test]
    fn anything_but_a_valid_plain_single_rule_call_goes_as_before() {
        let plain = single("lh:v1:{t}:r:a", [20_000, 2_000, 1_000], 1_000, 5);
        let mut recorded = plain.clone();
        recorded.args[1] = "60000".into();
        let mut shadowed = plain.clone();
        shadowed.args[3] = "1".into();
        let mut bad_digest = plain.clone();
        bad_digest.args[2] = "xyz".into();
        let mut bad_rate = plain.clone();
        bad_rate.args[5] = "0".into();
        let mut same_key = plain.clone();
        same_key.keys[0] = same_key.keys[1].clone();
        let token_bucket = ScriptCall::new(ScriptKind::TokenBucket).key("k").arg(1);
        for other in [
            recorded,
            shadowed,
            bad_digest,
            bad_rate,
            same_key,
            token_bucket,
        ] {
            assert_eq!(bucket_pack_call(&[plain.clone(), other.clone()]), None);
            assert_eq!(bucket_pack_call(&[other]), None);
        }
        assert_eq!(bucket_pack_call(&[]), None);
        let too_many = vec![plain; MULTI_DECISION_MAX_CALLS + 1];
        assert_eq!(bucket_pack_call(&too_many), None);
    }

    #[test]
    fn a_reply_splits_into_multi_rule_replies() {
        let replies = split_reply(&[1, 0, 19_000, 0, 500, 0, 0, -1, 7, -1, 0, 0, 42], 4).unwrap();
        assert_eq!(
            replies,
            [
                Ok(vec![1, 0, 0, 19_000, 0, 42]),
                Ok(vec![0, 1, 500, 0, 0, 42]),
                Ok(vec![0, 1, -1, 7, 0, 42]),
                Err(wrong_type()),
            ]
        );
    }

    #[test]
    fn a_malformed_reply_is_never_an_allow() {
        for bad in [
            &[][..],
            &[1, 0, 5][..],
            &[1, 0, 5, 0, 0, 5, 42][..],
            &[1, 3, 5, 42][..],
            &[0, 0, 5, 42][..],
            &[2, 0, 5, 42][..],
            &[1, 0, -5, 42][..],
            &[-1, 5, 0, 42][..],
        ] {
            assert!(
                matches!(split_reply(bad, 1), Err(ScriptError::MalformedReply { .. })),
                "{bad:?}"
            );
        }
    }
}
