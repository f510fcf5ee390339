//! The answer to one ShouldRateLimit as envoyproxy/ratelimit gives it
//! (`src/service/ratelimit.go`, `src/limiter/base_limiter.go`), pure: per
//! descriptor status, the overall code, the hit statistics and the
//! response headers. Time and counts come in as arguments.

use super::unit::Unit;

/// A descriptor's or the request's code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    Ok,
    OverLimit,
}

/// The limit a status reports (`current_limit`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CurrentLimit {
    pub requests_per_unit: u32,
    pub unit: Unit,
    pub name: String,
}

/// What happened to one descriptor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// No rule matched (or it was replaced, or the domain is unknown).
    NoLimit,
    /// An `unlimited` rule matched.
    Unlimited,
    /// A counted limit: the count in its window after this request's hits.
    Counted {
        limit: CurrentLimit,
        hits: u64,
        count_after: u64,
        now_ms: u64,
        shadow_mode: bool,
    },
    /// A Leasehold counter (a pool, or a `leasehold.algorithm` rule): its
    /// verdict, whole tokens left and seconds until it holds the hits again
    /// (refused) or is full (a bucket), or its window ends.
    Bucket {
        limit: CurrentLimit,
        allowed: bool,
        remaining_tokens: u64,
        reset_s: u64,
        shadow_mode: bool,
    },
    /// The store or the pool could not answer; the rule's fail mode did.
    FailMode { limit: CurrentLimit, allowed: bool },
}

/// One descriptor's status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    pub code: Code,
    pub current_limit: Option<CurrentLimit>,
    pub limit_remaining: u32,
    /// Seconds to the window's end, in [1, unit]; None without a limit.
    pub duration_until_reset_s: Option<u64>,
    /// Over the limit, answered OK by `shadow_mode`.
    pub shadowed: bool,
    /// The limit is in `quota_mode` (set by the caller, which knows it).
    pub quota_mode: bool,
}

/// Upstream's status of an outcome. Over iff the count after the hits is
/// above the limit (so hits past the limit are counted too, and 0 hits
/// is over only once the window is already over).
pub fn status(outcome: &Outcome) -> Status {
    match outcome {
        Outcome::NoLimit => Status {
            code: Code::Ok,
            current_limit: None,
            limit_remaining: 0,
            duration_until_reset_s: None,
            shadowed: false,
            quota_mode: false,
        },
        Outcome::Unlimited => Status {
            code: Code::Ok,
            current_limit: None,
            limit_remaining: u32::MAX,
            duration_until_reset_s: None,
            shadowed: false,
            quota_mode: false,
        },
        Outcome::Counted {
            limit,
            count_after,
            now_ms,
            shadow_mode,
            ..
        } => {
            let cap = u64::from(limit.requests_per_unit);
            let over = *count_after > cap;
            let remaining = if over { 0 } else { cap - count_after };
            Status {
                code: if over && !shadow_mode {
                    Code::OverLimit
                } else {
                    Code::Ok
                },
                current_limit: Some(limit.clone()),
                // remaining ≤ cap ≤ u32::MAX.
                limit_remaining: u32::try_from(remaining).unwrap_or(u32::MAX),
                duration_until_reset_s: Some(limit.unit.seconds_to_reset(*now_ms)),
                shadowed: over && *shadow_mode,
                quota_mode: false,
            }
        }
        Outcome::Bucket {
            limit,
            allowed,
            remaining_tokens,
            reset_s,
            shadow_mode,
        } => Status {
            code: if *allowed || *shadow_mode {
                Code::Ok
            } else {
                Code::OverLimit
            },
            current_limit: Some(limit.clone()),
            limit_remaining: u32::try_from(*remaining_tokens).unwrap_or(u32::MAX),
            // A bucket may take longer than a unit to be full again (a
            // burst above requests_per_unit): its time, at least 1 s.
            duration_until_reset_s: Some((*reset_s).max(1)),
            shadowed: !*allowed && *shadow_mode,
            quota_mode: false,
        },
        Outcome::FailMode { limit, allowed } => Status {
            code: if *allowed { Code::Ok } else { Code::OverLimit },
            current_limit: Some(limit.clone()),
            limit_remaining: 0,
            duration_until_reset_s: None,
            shadowed: false,
            quota_mode: false,
        },
    }
}

/// OVER_LIMIT iff any status not in `quota_mode` is, or every status in
/// `quota_mode` is (and there is one), as upstream's `ratelimit.go`;
/// `global_shadow` (upstream's `SHADOW_MODE`) answers OK whatever the
/// statuses say (they keep their codes).
pub fn overall(statuses: &[Status], global_shadow: bool) -> Code {
    let over = |s: &&Status| s.code == Code::OverLimit;
    let (quota, rate): (Vec<&Status>, Vec<&Status>) = statuses.iter().partition(|s| s.quota_mode);
    let refused = rate.iter().any(over) || (!quota.is_empty() && quota.iter().all(over));
    if !global_shadow && refused {
        Code::OverLimit
    } else {
        Code::Ok
    }
}

/// Which matched limits `replaces` drops: the names every matched limit
/// (unlimited ones included) replaces, within this request only. Input: per
/// descriptor, the matched limit's (name, replaces), None when nothing
/// matched. Output: true where the limit is dropped.
pub fn replaced(matched: &[Option<(&str, &[String])>]) -> Vec<bool> {
    let replacing: Vec<&str> = matched
        .iter()
        .flatten()
        .flat_map(|(_, replaces)| replaces.iter().map(String::as_str))
        .collect();
    matched
        .iter()
        .map(|m| m.is_some_and(|(name, _)| !name.is_empty() && replacing.contains(&name)))
        .collect()
}

/// The hits one descriptor counts: its own `hits_addend` when set (0 looks
/// without counting), else the request's, at least 1.
pub fn hits(descriptor_hits: Option<u64>, request_hits: u32) -> u64 {
    descriptor_hits.unwrap_or_else(|| u64::from(request_hits.max(1)))
}

/// Upstream's per-limit statistics of one request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HitStats {
    pub total_hits: u64,
    pub within_limit: u64,
    pub near_limit: u64,
    pub over_limit: u64,
    pub shadow_mode: u64,
    /// Over-limit hits answered by the local over-limit cache (also in
    /// `over_limit`, as upstream counts them).
    pub over_limit_with_local_cache: u64,
}

/// Statistics of `hits` answered over by the local over-limit cache
/// (`base_limiter.go`: total, over_limit, over_limit_with_local_cache,
/// and shadow_mode for a shadow limit).
pub fn local_cache_stats(hits: u64, shadow: bool) -> HitStats {
    HitStats {
        total_hits: hits,
        over_limit: hits,
        over_limit_with_local_cache: hits,
        shadow_mode: if shadow { hits } else { 0 },
        ..HitStats::default()
    }
}

/// Statistics of `hits` that took a counter from `after - hits` to `after`
/// under `limit`, near-limit past `near_ratio` of it (upstream's 0.8),
/// as `base_limiter.go` splits them.
pub fn hit_stats(limit: u32, hits: u64, after: u64, near_ratio: f32, shadow: bool) -> HitStats {
    let limit = u64::from(limit);
    let near = (limit as f32 * near_ratio).floor() as u64;
    let before = after.saturating_sub(hits);
    let mut stats = HitStats {
        total_hits: hits,
        ..HitStats::default()
    };
    if after > limit {
        let over = if before >= limit { hits } else { after - limit };
        stats.over_limit = over;
        if before < limit {
            stats.near_limit = limit - near.max(before);
        }
        if shadow {
            stats.shadow_mode = over;
        }
    } else {
        stats.within_limit = hits;
        if after > near {
            stats.near_limit = if before >= near { hits } else { after - near };
        }
    }
    stats
}

/// Statistics of an extension rule's outcome (a bucket or a fail mode):
/// `hits` within or over as it was decided, near-limit when fewer than
/// `1 − near_ratio` of its rate remain. None for a look (0 hits) and for
/// outcomes counted from a window counter ([`hit_stats`]).
pub fn outcome_stats(outcome: &Outcome, hits: u64, near_ratio: f32) -> Option<HitStats> {
    if hits == 0 {
        return None;
    }
    let (allowed, near, shadow) = match outcome {
        Outcome::Bucket {
            limit,
            allowed,
            remaining_tokens,
            shadow_mode,
            ..
        } => {
            let rate = f64::from(limit.requests_per_unit);
            let near = (*remaining_tokens as f64) < rate * f64::from(1.0 - near_ratio);
            (*allowed, near, *shadow_mode)
        }
        Outcome::FailMode { allowed, .. } => (*allowed, false, false),
        _ => return None,
    };
    Some(HitStats {
        total_hits: hits,
        within_limit: if allowed { hits } else { 0 },
        near_limit: if allowed && near { hits } else { 0 },
        over_limit: if allowed { 0 } else { hits },
        shadow_mode: if !allowed && shadow { hits } else { 0 },
        ..HitStats::default()
    })
}

/// Which response headers to add (`response_headers_to_add`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Headers {
    Off,
    /// Upstream's `LIMIT_RESPONSE_HEADERS_ENABLED`: three headers, named
    /// as configured (`RateLimit-Limit`, `RateLimit-Remaining`,
    /// `RateLimit-Reset` by default).
    Upstream {
        limit: String,
        remaining: String,
        reset: String,
    },
    /// The IETF draft fields: `RateLimit-Policy: "<name>";q=N;w=S` and
    /// `RateLimit: "<name>";r=R;t=T`.
    Ietf,
}

impl Headers {
    pub fn upstream_default() -> Self {
        Headers::Upstream {
            limit: "RateLimit-Limit".into(),
            remaining: "RateLimit-Remaining".into(),
            reset: "RateLimit-Reset".into(),
        }
    }
}

/// The headers for `statuses`: from the status with a limit and the fewest
/// requests remaining (the first on ties), unless some status is over the
/// limit (then the last of those), as upstream picks it. None when no
/// status carries a limit.
pub fn headers(statuses: &[Status], style: &Headers) -> Vec<(String, String)> {
    if *style == Headers::Off {
        return Vec::new();
    }
    // An over status not in quota mode is chosen whatever its remaining.
    let forced = |s: &Status| s.code == Code::OverLimit && !s.quota_mode;
    let mut chosen: Option<&Status> = None;
    for status in statuses.iter().filter(|s| s.current_limit.is_some()) {
        chosen = match chosen {
            Some(c) if forced(c) && !forced(status) => Some(c),
            Some(_) if forced(status) => Some(status),
            Some(c) if status.limit_remaining < c.limit_remaining => Some(status),
            Some(c) => Some(c),
            None => Some(status),
        };
    }
    let Some(status) = chosen else {
        return Vec::new();
    };
    let (Some(limit), Some(reset)) = (&status.current_limit, status.duration_until_reset_s) else {
        return Vec::new();
    };
    match style {
        Headers::Off => Vec::new(),
        Headers::Upstream {
            limit: limit_name,
            remaining,
            reset: reset_name,
        } => vec![
            (limit_name.clone(), limit.requests_per_unit.to_string()),
            (remaining.clone(), status.limit_remaining.to_string()),
            (reset_name.clone(), reset.to_string()),
        ],
        Headers::Ietf => {
            let name = if limit.name.is_empty() {
                "default"
            } else {
                limit.name.as_str()
            };
            // A structured-field string: quotes and backslashes escaped.
            let quoted = name.replace('\\', "\\\\").replace('"', "\\\"");
            vec![
                (
                    "RateLimit-Policy".into(),
                    format!(
                        "\"{quoted}\";q={};w={}",
                        limit.requests_per_unit,
                        limit.unit.seconds()
                    ),
                ),
                (
                    "RateLimit".into(),
                    format!("\"{quoted}\";r={};t={reset}", status.limit_remaining),
                ),
            ]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn per_minute(n: u32) -> CurrentLimit {
        CurrentLimit {
            requests_per_unit: n,
            unit: Unit::Minute,
            name: String::new(),
        }
    }

    fn counted(limit: u32, count_after: u64, now_ms: u64, shadow_mode: bool) -> Outcome {
        Outcome::Counted {
            limit: per_minute(limit),
            hits: 1,
            count_after,
            now_ms,
            shadow_mode,
        }
    }

    #[test]
    fn statuses_are_upstreams() {
        // 20/min: the 20th hit is OK with 0 left, the 21st over.
        let ok = status(&counted(20, 20, 2_222_000, false));
        assert_eq!((ok.code, ok.limit_remaining), (Code::Ok, 0));
        assert_eq!(ok.duration_until_reset_s, Some(58));
        let over = status(&counted(20, 21, 2_222_000, false));
        assert_eq!((over.code, over.limit_remaining), (Code::OverLimit, 0));
        // Shadow: OK, but the limit, 0 remaining and the reset stay.
        let shadow = status(&counted(20, 21, 2_222_000, true));
        assert_eq!(shadow.code, Code::Ok);
        assert!(shadow.shadowed && shadow.current_limit.is_some());
        assert_eq!(status(&Outcome::Unlimited).limit_remaining, u32::MAX);
        let none = status(&Outcome::NoLimit);
        assert!(none.current_limit.is_none() && none.duration_until_reset_s.is_none());
        // requests_per_unit 0: every hit is over (upstream's "black list").
        assert_eq!(status(&counted(0, 1, 0, false)).code, Code::OverLimit);
    }

    #[test]
    fn the_overall_code_and_global_shadow() {
        let statuses = [
            status(&counted(10, 11, 0, false)),
            status(&Outcome::NoLimit),
        ];
        assert_eq!(overall(&statuses, false), Code::OverLimit);
        assert_eq!(overall(&statuses, true), Code::Ok);
        assert_eq!(statuses[0].code, Code::OverLimit);
        // A shadow rule over and a normal rule OK: OK.
        let mixed = [
            status(&counted(1, 5, 0, true)),
            status(&counted(10, 1, 0, false)),
        ];
        assert_eq!(overall(&mixed, false), Code::Ok);
    }

    /// upstream's `ratelimit.go` (and its ratelimit_test.go cases): over
    /// in quota mode refuses only when every quota status is over; a
    /// rate-limit status over refuses whatever the quota ones say.
    #[test]
    fn quota_mode_refuses_only_when_every_quota_limit_is_over() {
        let quota = |o: Outcome| Status {
            quota_mode: true,
            ..status(&o)
        };
        let one_quota_over = [
            quota(counted(1, 2, 0, false)),
            quota(counted(10, 1, 0, false)),
        ];
        assert_eq!(overall(&one_quota_over, false), Code::Ok);
        assert_eq!(
            one_quota_over[0].code,
            Code::OverLimit,
            "its status stays over"
        );
        let all_quota_over = [
            quota(counted(1, 2, 0, false)),
            quota(counted(1, 3, 0, false)),
        ];
        assert_eq!(overall(&all_quota_over, false), Code::OverLimit);
        assert_eq!(overall(&all_quota_over, true), Code::Ok);
        let rate_over = [
            quota(counted(10, 1, 0, false)),
            status(&counted(1, 2, 0, false)),
        ];
        assert_eq!(overall(&rate_over, false), Code::OverLimit);
        // The only quota status over: every quota status is over.
        let quota_over_rate_ok = [
            quota(counted(1, 2, 0, false)),
            status(&counted(10, 1, 0, false)),
        ];
        assert_eq!(overall(&quota_over_rate_ok, false), Code::OverLimit);
        // Headers: an over quota status is not forced, a fewer remaining is.
        let picked = [
            quota(counted(10, 11, 2_222_000, false)),
            status(&counted(100, 1, 2_222_000, false)),
            status(&counted(100, 99, 2_222_000, false)),
        ];
        let upstream = headers(&picked, &Headers::upstream_default());
        assert_eq!(
            upstream[0].1, "10",
            "the quota status has 0 left, the fewest"
        );
        let forced = [
            quota(counted(10, 11, 2_222_000, false)),
            status(&counted(1, 2, 2_222_000, false)),
        ];
        assert_eq!(headers(&forced, &Headers::upstream_default())[0].1, "1");
    }

    #[test]
    fn replaces_drops_named_limits_matched_in_the_same_request() {
        let by_override = ["banned_limit".to_string()];
        let none: Vec<String> = Vec::new();
        let matched = [
            Some(("banned_limit", &none[..])),
            Some(("", &by_override[..])),
            None,
        ];
        assert_eq!(replaced(&matched), vec![true, false, false]);
        // Mutual replacement drops both.
        let a = ["b".to_string()];
        let b = ["a".to_string()];
        assert_eq!(
            replaced(&[Some(("a", &a[..])), Some(("b", &b[..]))]),
            vec![true, true]
        );
    }

    #[test]
    fn hits_addend_per_descriptor_wins_even_at_zero() {
        assert_eq!(hits(Some(0), 5), 0);
        assert_eq!(hits(Some(3), 5), 3);
        assert_eq!(hits(None, 0), 1);
        assert_eq!(hits(None, 7), 7);
    }

    #[test]
    fn near_limit_accounting_matches_upstreams_examples() {
        // TestNearLimit: 20/s, hits 3: after 5 → within 3; after 22 → over 2, near 1.
        let within = hit_stats(20, 3, 5, 0.8, false);
        assert_eq!((within.within_limit, within.near_limit), (3, 0));
        let over = hit_stats(20, 3, 22, 0.8, false);
        assert_eq!(
            (over.over_limit, over.near_limit, over.within_limit),
            (2, 1, 0)
        );
        // Already over: all hits over.
        assert_eq!(hit_stats(10, 3, 30, 0.8, false).over_limit, 3);
        // Crossing the near threshold: only the part above it is near.
        let near = hit_stats(20, 3, 18, 0.8, false);
        assert_eq!(near.near_limit, 2);
        assert_eq!(hit_stats(10, 2, 12, 0.8, true).shadow_mode, 2);
    }

    #[test]
    fn headers_follow_the_fewest_remaining_unless_one_is_over() {
        let statuses = [
            status(&counted(10, 11, 2_222_000, false)),
            status(&counted(100, 1, 2_222_000, false)),
        ];
        let upstream = headers(&statuses, &Headers::upstream_default());
        assert_eq!(
            upstream,
            vec![
                ("RateLimit-Limit".to_string(), "10".to_string()),
                ("RateLimit-Remaining".to_string(), "0".to_string()),
                ("RateLimit-Reset".to_string(), "58".to_string()),
            ]
        );
        let ok = [
            status(&counted(100, 1, 0, false)),
            status(&counted(10, 5, 0, false)),
            status(&counted(10, 5, 0, false)),
        ];
        assert_eq!(headers(&ok, &Headers::upstream_default())[1].1, "5");
        let ietf = headers(&statuses, &Headers::Ietf);
        assert_eq!(
            ietf[0],
            ("RateLimit-Policy".into(), "\"default\";q=10;w=60".into())
        );
        assert_eq!(ietf[1], ("RateLimit".into(), "\"default\";r=0;t=58".into()));
        assert!(headers(&[status(&Outcome::NoLimit)], &Headers::upstream_default()).is_empty());
        assert!(headers(&statuses, &Headers::Off).is_empty());
    }

    proptest! {
        #[test]
        fn stats_split_every_hit_once(limit in 0u32..50, before in 0u64..100, hits in 0u64..30) {
            let after = before + hits;
            let s = hit_stats(limit, hits, after, 0.8, false);
            prop_assert_eq!(s.total_hits, hits);
            prop_assert!(s.within_limit + s.over_limit <= hits);
            prop_assert_eq!(s.within_limit + s.over_limit == hits, after <= u64::from(limit) || before >= u64::from(limit));
            let st = status(&counted(limit, after, 0, false));
            prop_assert_eq!(st.code == Code::OverLimit, after > u64::from(limit));
            prop_assert!(u64::from(st.limit_remaining) <= u64::from(limit));
        }
    }
}
