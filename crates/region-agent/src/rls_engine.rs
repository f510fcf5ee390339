//! Answers ShouldRateLimit for the domains of an envoyproxy/ratelimit YAML
//! config exactly as upstream does ([`crate::rls`] holds the semantics;
//! this shell runs the counters on the store).
//!
//! One request: every descriptor is matched (a `limit` override in the
//! request skips the tree, as upstream), `replaces` drops named limits,
//! then every counted limit is one `rls_window` call — each counter its own
//! hash tag, all of them in one batch (one round trip). The store's clock
//! decides the windows. A store that cannot answer fails the request with
//! UNAVAILABLE, so Envoy's `failure_mode_deny` decides, as upstream's Redis
//! errors do.
//!
//! A rule with Leasehold's extension (`leasehold: {algorithm: …}` or
//! `{pool: …}`) is planned and read by [`crate::rls_ext`] instead, its call
//! in the same batch; its fail mode answers when the store cannot.

use std::borrow::Cow;
use std::sync::Arc;

use crate::decide::Decider;
use crate::request::InvalidField;
use crate::rls::answer::{self, CurrentLimit, Headers, Outcome, Status};
use crate::rls::config::Limit;
use crate::rls::tree;
use crate::rls::unit::Unit;
use crate::rls::watch::RlsHolder;
use crate::rls_ext::{self, ExtPlan, ExtRule, Pending};
use crate::script::{reply, ScriptCall, ScriptKind};

/// Slack past a window's end before its counter expires (upstream adds up
/// to 300 s of jitter; a fixed minute keeps the store's memory bounded and
/// the expiry deterministic).
pub const COUNTER_SLACK_MS: u64 = 60_000;

/// How answers are shaped (`[ratelimit]` in the agent config).
#[derive(Clone, Debug, PartialEq)]
pub struct RlsOptions {
    pub headers: Headers,
    /// Upstream's `SHADOW_MODE`: the overall code is always OK.
    pub global_shadow_mode: bool,
    /// Upstream's `NEAR_LIMIT_RATIO` (0.8).
    pub near_limit_ratio: f32,
}

impl Default for RlsOptions {
    fn default() -> Self {
        RlsOptions {
            headers: Headers::Off,
            global_shadow_mode: false,
            near_limit_ratio: 0.8,
        }
    }
}

/// The YAML config in force and the options.
#[derive(Debug, Default)]
pub struct RlsEngine {
    pub holder: Arc<RlsHolder>,
    pub options: RlsOptions,
}

/// One request as the engine reads it (validated by the caller).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RlsRequest {
    pub domain: String,
    pub descriptors: Vec<RlsDescriptor>,
    /// The request's `hits_addend` (0 counts as 1).
    pub hits_addend: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RlsDescriptor {
    pub entries: Vec<(String, String)>,
    /// `limit` override: requests per unit and the proto's unit number.
    pub limit_override: Option<(u32, i32)>,
    /// The descriptor's own `hits_addend` (0 looks without counting).
    pub hits_addend: Option<u64>,
}

/// The engine's answer, mapped to the proto by the service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RlsAnswer {
    pub overall: answer::Code,
    pub statuses: Vec<Status>,
    pub headers: Vec<(String, String)>,
}

/// Why a request got no answer.
#[derive(Debug, thiserror::Error)]
pub enum RlsError {
    #[error(transparent)]
    Invalid(#[from] InvalidField),
    /// The store could not count (unavailable, timed out, malformed).
    #[error("store: {0}")]
    Store(String),
}

/// A limit the request counts against, with what the status reports.
struct Counting {
    index: usize,
    current: CurrentLimit,
    hits: u64,
    shadow_mode: bool,
    stats_key: String,
    /// An extension rule's reading (None: an upstream window counter).
    extension: Option<Pending>,
}

/// A counted limit's outcome, or a call it needs.
enum Planned {
    Call(ScriptCall),
    /// Decided without a store call (a look, no room in a pool, a fail mode).
    Now(Outcome),
}

impl RlsEngine {
    pub fn new(holder: Arc<RlsHolder>, options: RlsOptions) -> Self {
        RlsEngine { holder, options }
    }

    /// Whether `domain` is one of the YAML config's.
    pub fn serves(&self, domain: &str) -> bool {
        self.holder.current().domains.contains_key(domain)
    }

    /// Answers `request` for a YAML domain (an unknown one answers OK for
    /// every descriptor, as upstream does).
    pub async fn answer(
        &self,
        decider: &Decider,
        request: &RlsRequest,
    ) -> Result<RlsAnswer, RlsError> {
        let config = self.holder.current();
        let Some(domain) = config.domains.get(&request.domain) else {
            let statuses = vec![answer::status(&Outcome::NoLimit); request.descriptors.len()];
            return Ok(self.finish(statuses));
        };
        let entries_of: Vec<Vec<(&str, &str)>> = request
            .descriptors
            .iter()
            .map(|d| {
                d.entries
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_str()))
                    .collect()
            })
            .collect();
        // Match every descriptor first: `replaces` looks at all of them.
        // Configured limits are borrowed from the config in force.
        let mut matched: Vec<Option<(Cow<'_, Limit>, Cow<'_, str>)>> = Vec::new();
        for (i, (descriptor, entries)) in request.descriptors.iter().zip(&entries_of).enumerate() {
            matched.push(match descriptor.limit_override {
                Some((requests_per_unit, unit)) => {
                    let unit = Unit::from_proto(unit).ok_or_else(|| {
                        InvalidField::new(
                            format!("descriptors[{i}].limit.unit"),
                            "must be SECOND, MINUTE, HOUR, DAY, WEEK, MONTH or YEAR",
                        )
                    })?;
                    let limit = override_limit(&domain.name, entries, requests_per_unit, unit);
                    let stats_key = Cow::Owned(limit.stats_key.clone());
                    Some((Cow::Owned(limit), stats_key))
                }
                None => tree::find(domain, entries).map(|m| (Cow::Borrowed(m.limit), m.stats_key)),
            });
        }
        let named: Vec<Option<(&str, &[String])>> = matched
            .iter()
            .map(|m| {
                m.as_ref()
                    .map(|(limit, _)| (limit.name.as_str(), &limit.replaces[..]))
            })
            .collect();
        let dropped = answer::replaced(&named);
        let mut statuses = vec![answer::status(&Outcome::NoLimit); request.descriptors.len()];
        let mut counting = Vec::new();
        let mut calls = Vec::new();
        for (i, (found, dropped)) in matched.into_iter().zip(dropped).enumerate() {
            let Some((limit, stats_key)) = found else {
                continue;
            };
            if dropped {
                continue;
            }
            let Some(unit) = limit.unit.filter(|_| !limit.unlimited) else {
                statuses[i] = answer::status(&Outcome::Unlimited);
                continue;
            };
            let descriptor = &request.descriptors[i];
            let hits = answer::hits(descriptor.hits_addend, request.hits_addend);
            let entries = &entries_of[i];
            let current = CurrentLimit {
                requests_per_unit: limit.requests_per_unit,
                unit,
                name: limit.name.clone(),
            };
            let stats_key = stats_key.into_owned();
            let (planned, extension) = match limit.extension.as_ref().filter(|e| e.asks()) {
                None => {
                    let key = decider.keys.rls_counter(&domain.name, entries, unit.name());
                    let call = ScriptCall::new(ScriptKind::RlsWindow)
                        .key(key)
                        .arg(unit.millis())
                        .arg(hits)
                        .arg(COUNTER_SLACK_MS);
                    (Planned::Call(call), None)
                }
                Some(extension) => {
                    let rule = ExtRule {
                        domain: &domain.name,
                        entries,
                        extension,
                        unit,
                        current: current.clone(),
                        hits,
                        shadow_mode: limit.shadow_mode,
                    };
                    match rls_ext::plan(decider, &rule)? {
                        ExtPlan::Now(outcome) => (Planned::Now(outcome), None),
                        ExtPlan::Call(call, pending) => (Planned::Call(call), Some(pending)),
                    }
                }
            };
            match planned {
                Planned::Now(outcome) => statuses[i] = answer::status(&outcome),
                Planned::Call(call) => {
                    calls.push(call);
                    counting.push(Counting {
                        index: i,
                        current,
                        hits,
                        shadow_mode: limit.shadow_mode,
                        stats_key,
                        extension,
                    });
                }
            }
        }
        let replies = decider.run(&calls).await;
        for (count, result) in counting.into_iter().zip(replies) {
            if let Some(pending) = count.extension {
                statuses[count.index] = answer::status(&rls_ext::read(decider, pending, result)?);
                continue;
            }
            let outcome = match result {
                Ok(r) => reply::rls_window(&r).map(|read| {
                    let stats = answer::hit_stats(
                        count.current.requests_per_unit,
                        count.hits,
                        read.count,
                        self.options.near_limit_ratio,
                        count.shadow_mode,
                    );
                    decider
                        .metrics
                        .record_rls(&request.domain, &count.stats_key, &stats);
                    Outcome::Counted {
                        limit: count.current.clone(),
                        hits: count.hits,
                        count_after: read.count,
                        now_ms: u64::try_from(read.now_ms).unwrap_or(0),
                        shadow_mode: count.shadow_mode,
                    }
                }),
                Err(error) => Err(crate::script::ScriptError::MalformedReply {
                    script: "store",
                    detail: error.to_string(),
                }),
            };
            statuses[count.index] = match outcome {
                Ok(outcome) => answer::status(&outcome),
                Err(error) => return Err(RlsError::Store(error.to_string())),
            };
        }
        Ok(self.finish(statuses))
    }

    fn finish(&self, statuses: Vec<Status>) -> RlsAnswer {
        RlsAnswer {
            overall: answer::overall(&statuses, self.options.global_shadow_mode),
            headers: answer::headers(&statuses, &self.options.headers),
            statuses,
        }
    }
}

/// A request's `limit` override: no tree, no name, no shadow; the stats key
/// is upstream's `descriptorKey` (`domain.key_value.key2_value2`).
fn override_limit(
    domain: &str,
    entries: &[(&str, &str)],
    requests_per_unit: u32,
    unit: Unit,
) -> Limit {
    let mut stats_key = domain.to_string();
    for (key, value) in entries {
        stats_key.push('.');
        stats_key.push_str(key);
        if !value.is_empty() {
            stats_key.push('_');
            stats_key.push_str(value);
        }
    }
    Limit {
        requests_per_unit,
        unit: Some(unit),
        unlimited: false,
        name: String::new(),
        replaces: Vec::new(),
        shadow_mode: false,
        detailed_metric: false,
        stats_key,
        extension: None,
        file: String::new(),
        line: 0,
    }
}
