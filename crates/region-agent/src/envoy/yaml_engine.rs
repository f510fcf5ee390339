//! Answers ShouldRateLimit for the domains of an envoyproxy/ratelimit YAML
//! config exactly as upstream does ([`crate::envoy::ratelimit`] holds the semantics;
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
//! `{pool: …}`) is planned and read by [`crate::envoy::extension_counters`] instead, its call
//! in the same batch; its fail mode answers when the store cannot.
//!
//! Upstream's options (`[ratelimit]`): counter TTLs get a random jitter
//! drawn here (the script takes it as an argument);
//! `stop_increment_when_over_limit` looks at every counter first (one more
//! round trip) and counts as upstream's `fixed_cache_impl.go` then does;
//! the local over-limit cache (the agent's denial cache, [`crate::denial`]) answers a
//! counter known over without a store call.

use std::borrow::Cow;
use std::sync::Arc;

use rand::Rng;

use crate::decide::Decider;
use crate::denial::{Denial, SharedDenials};
use crate::envoy::extension_counters::{self as rls_ext, ExtPlan, ExtRule, Pending};
use crate::envoy::ratelimit::answer::{self, CurrentLimit, Headers, Outcome, Status};
use crate::envoy::ratelimit::config::Limit;
use crate::envoy::ratelimit::tree;
use crate::envoy::ratelimit::unit::Unit;
use crate::envoy::ratelimit::watch::RlsHolder;
use crate::request::InvalidField;
use crate::store::script::{reply, ScriptCall, ScriptKind};

// Defined beside the extension rules that need them (no import circle).
pub use crate::envoy::extension_counters::{RlsError, COUNTER_SLACK_MS};

/// Cap on `[ratelimit] expiration_jitter_max_seconds` (one day).
pub const MAX_EXPIRATION_JITTER_S: u64 = 86_400;

/// How answers are shaped and the directory loads (`[ratelimit]` in the
/// agent config).
#[derive(Clone, Debug, PartialEq)]
pub struct RlsOptions {
    pub headers: Headers,
    /// Upstream's `SHADOW_MODE`: the overall code is always OK.
    pub global_shadow_mode: bool,
    /// Upstream's `NEAR_LIMIT_RATIO` (0.8).
    pub near_limit_ratio: f32,
    /// Upstream's `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT` (false).
    pub stop_increment_when_over_limit: bool,
    /// Upstream's `EXPIRATION_JITTER_MAX_SECONDS` (300; 0: none): a
    /// counter's TTL is its window plus a whole number of seconds drawn in
    /// [0, max).
    pub expiration_jitter_max_seconds: u64,
    /// Upstream's `LOCAL_CACHE_SIZE_IN_BYTES`, counted in counters (0: off;
    /// on by default: the agent's denial cache, [`crate::denial`]).
    pub local_cache_max_keys: u64,
    /// Upstream's `MERGE_DOMAIN_CONFIG` (false): one domain from several
    /// files ([`crate::envoy::ratelimit::config`]).
    pub merge_domains: bool,
}

impl Default for RlsOptions {
    fn default() -> Self {
        RlsOptions {
            headers: Headers::Off,
            global_shadow_mode: false,
            near_limit_ratio: 0.8,
            stop_increment_when_over_limit: false,
            expiration_jitter_max_seconds: 300,
            local_cache_max_keys: DEFAULT_LOCAL_CACHE_KEYS,
            merge_domains: false,
        }
    }
}

/// Cap on `[ratelimit] local_cache_max_keys`.
pub const MAX_LOCAL_CACHE_KEYS: u64 = 1_000_000;
/// Its default: on, as the agent's denial cache is for TOML rules.
pub const DEFAULT_LOCAL_CACHE_KEYS: u64 = crate::denial::DEFAULT_MAX_KEYS as u64;

/// What a counter's over-limit entry depends on: its limit. A reload that
/// changes the limit (a raise) misses the entry.
fn limit_fingerprint(limit: &CurrentLimit) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::hash::DefaultHasher::new();
    (limit.requests_per_unit, limit.unit.millis()).hash(&mut hasher);
    hasher.finish()
}

/// The YAML config in force and the options.
#[derive(Debug, Default)]
pub struct RlsEngine {
    pub holder: Arc<RlsHolder>,
    pub options: RlsOptions,
    /// Counters known over their limit, until their window ends (agent
    /// clock; see [`RlsEngine::remember_over`]).
    over_limit: SharedDenials,
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

/// A limit the request counts against, with what the status reports.
struct Counting {
    index: usize,
    current: CurrentLimit,
    hits: u64,
    shadow_mode: bool,
    stats_key: String,
    /// An extension rule's reading (None: an upstream window counter).
    extension: Option<Pending>,
    /// A window counter's store key and window (None for an extension rule).
    counter: Option<(String, Window)>,
}

/// A window counter's window: its unit, and in a domain opted in to
/// calendar periods the period (start, length) a `day`, `week` or `month`
/// counter runs in (its key names the period).
#[derive(Clone, Copy)]
struct Window {
    unit: Unit,
    period: Option<(i64, u64)>,
}

impl Window {
    /// `unit`'s window now: a calendar period of `calendar_zone` for day,
    /// week and month when the domain opted in, else upstream's
    /// epoch-aligned window. The period's label goes on `key`.
    fn at(unit: Unit, calendar_zone: Option<&str>, key: &mut String, now_ms: i64) -> Window {
        use crate::meter::period::{Calendar, PeriodKind};
        let kind = match unit {
            Unit::Day => Some(PeriodKind::Day),
            Unit::Week => Some(PeriodKind::Week),
            Unit::Month => Some(PeriodKind::Month),
            _ => None,
        };
        let period = kind
            .zip(calendar_zone)
            .and_then(|(kind, zone)| Calendar::new(kind, zone).ok())
            .and_then(|calendar| calendar.period_at(now_ms).ok());
        match period {
            Some(period) => {
                key.push(':');
                key.push_str(&period.label);
                let length = u64::try_from(period.end_ms - period.start_ms)
                    .unwrap_or(1)
                    .max(1);
                Window {
                    unit,
                    period: Some((period.start_ms, length)),
                }
            }
            None => Window { unit, period: None },
        }
    }
}

/// The domain a request's limits are counted in, and its calendar zone
/// when it opted in to calendar periods.
#[derive(Clone, Copy)]
struct CountedIn<'a> {
    domain: &'a str,
    calendar_zone: Option<&'a str>,
}

/// A counted limit's outcome, or a call it needs.
enum Planned {
    Call(ScriptCall),
    /// Decided without a store call (a look, no room in a pool, a fail mode).
    Now(Outcome),
}

impl RlsEngine {
    pub fn new(holder: Arc<RlsHolder>, options: RlsOptions) -> Self {
        let max_keys = usize::try_from(options.local_cache_max_keys).unwrap_or(usize::MAX);
        RlsEngine {
            holder,
            options,
            over_limit: SharedDenials::new(max_keys),
        }
    }

    /// One `rls_window` call: `stop` = whether hits past the limit are
    /// left unstored; the TTL jitter is drawn here.
    fn window_call(
        &self,
        key: &str,
        window: Window,
        hits: u64,
        stop: bool,
        limit: u32,
    ) -> ScriptCall {
        let max = self.options.expiration_jitter_max_seconds;
        let jitter_s = if max > 0 {
            rand::thread_rng().gen_range(0..max)
        } else {
            0
        };
        let call = ScriptCall::new(ScriptKind::RlsWindow)
            .key(key)
            .arg(
                window
                    .period
                    .map_or(window.unit.millis(), |(_, length)| length),
            )
            .arg(hits)
            .arg(jitter_s.saturating_mul(1_000))
            .arg(u64::from(stop))
            .arg(limit);
        match window.period {
            Some((start_ms, _)) => call.arg(u64::try_from(start_ms).unwrap_or(0)),
            None => call,
        }
    }

    /// Whether the local over-limit cache holds `key` over for `limit` at
    /// the agent's `now_ms`.
    fn cached_over(&self, key: &str, limit: &CurrentLimit, now_ms: i64) -> bool {
        self.over_limit
            .refused(key, limit_fingerprint(limit), &[], now_ms)
            .is_some()
    }

    /// Remembers `key` over until the end of its window: `window_end_ms`
    /// and `store_now_ms` on the store's clock, counted on the agent's from
    /// `sent_ms` (its clock before the call, so the entry never outlasts
    /// the store's window), so the cache never needs the store to expire.
    fn remember_over(
        &self,
        key: &str,
        limit: &CurrentLimit,
        window_end_ms: i64,
        store_now_ms: i64,
        sent_ms: i64,
        agent_now_ms: i64,
    ) {
        let left = window_end_ms.saturating_sub(store_now_ms);
        let denial = Denial {
            since_ms: sent_ms,
            until_ms: sent_ms.saturating_add(left),
            // A counter over its limit refuses any hit until its window ends.
            costs: Vec::new(),
            fingerprint: limit_fingerprint(limit),
            rule_index: 0,
            remaining: 0,
        };
        self.over_limit.insert(key, denial, agent_now_ms);
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
        let entries_of = entries_of(request);
        // A request's descriptor value becomes a metric label only peppered
        // (§3.2: it may be an IP, a user id, an API key).
        let hide = |value: &str| decider.keys.label(value);
        // Match every descriptor first: `replaces` looks at all of them.
        // Configured limits are borrowed from the config in force.
        let mut matched: Vec<Option<Matched<'_>>> = Vec::new();
        let mut shared_entries: Vec<Option<Vec<(&str, &str)>>> =
            vec![None; request.descriptors.len()];
        for (i, (descriptor, entries)) in request.descriptors.iter().zip(&entries_of).enumerate() {
            matched.push(match descriptor.limit_override {
                Some(limit) => Some(overridden(&domain.name, i, entries, limit, &hide)?),
                None => tree::find(domain, entries, &hide).map(|m| {
                    // `share_threshold`: the wildcard keys the counter.
                    if !m.shared.is_empty() {
                        shared_entries[i] = Some(m.counter_entries(entries));
                    }
                    (Cow::Borrowed(m.limit), m.stats_key)
                }),
            });
        }
        let statuses = self
            .count(
                decider,
                CountedIn {
                    domain: &domain.name,
                    calendar_zone: domain.calendar_time_zone.as_deref(),
                },
                request,
                matched,
                &shared_entries,
                &entries_of,
            )
            .await?;
        Ok(self.finish(statuses))
    }

    /// The statuses of a TOML-policy domain's `limit` overrides (None for a
    /// descriptor without one): each counted as a YAML domain counts an
    /// override — upstream's fixed window of the override's
    /// `requests_per_unit` per `unit`, keyed by the domain and the
    /// descriptor's entries, statistics under upstream's `descriptorKey`
    /// (values peppered) — the request's overrides in one batch, under the
    /// same options (local cache, TTL jitter, stop-increment).
    pub async fn answer_overrides(
        &self,
        decider: &Decider,
        request: &RlsRequest,
    ) -> Result<Vec<Option<Status>>, RlsError> {
        let overridden_at: Vec<bool> = request
            .descriptors
            .iter()
            .map(|d| d.limit_override.is_some())
            .collect();
        if !overridden_at.contains(&true) {
            return Ok(vec![None; request.descriptors.len()]);
        }
        let entries_of = entries_of(request);
        let hide = |value: &str| decider.keys.label(value);
        let mut matched: Vec<Option<Matched<'_>>> = Vec::new();
        for (i, (descriptor, entries)) in request.descriptors.iter().zip(&entries_of).enumerate() {
            matched.push(match descriptor.limit_override {
                Some(limit) => Some(overridden(&request.domain, i, entries, limit, &hide)?),
                None => None,
            });
        }
        let shared_entries = vec![None; request.descriptors.len()];
        let statuses = self
            .count(
                decider,
                // A TOML domain's overrides keep upstream's windows.
                CountedIn {
                    domain: &request.domain,
                    calendar_zone: None,
                },
                request,
                matched,
                &shared_entries,
                &entries_of,
            )
            .await?;
        Ok(statuses
            .into_iter()
            .zip(overridden_at)
            .map(|(status, overridden)| overridden.then_some(status))
            .collect())
    }

    /// Counts the matched limits of `request` on `domain` (None: nothing
    /// matched), `replaces` applied: every upstream counter one
    /// `rls_window` call, an extension rule its own, all in one batch.
    async fn count(
        &self,
        decider: &Decider,
        counted_in: CountedIn<'_>,
        request: &RlsRequest,
        matched: Vec<Option<Matched<'_>>>,
        shared_entries: &[Option<Vec<(&str, &str)>>],
        entries_of: &[Vec<(&str, &str)>],
    ) -> Result<Vec<Status>, RlsError> {
        let CountedIn {
            domain,
            calendar_zone,
        } = counted_in;
        let named: Vec<Option<(&str, &[String])>> = matched
            .iter()
            .map(|m| {
                m.as_ref()
                    .map(|(limit, _)| (limit.name.as_str(), &limit.replaces[..]))
            })
            .collect();
        let dropped = answer::replaced(&named);
        // `quota_mode` of each descriptor's counted limit.
        let mut quota = vec![false; request.descriptors.len()];
        let mut statuses = vec![answer::status(&Outcome::NoLimit); request.descriptors.len()];
        let mut counting = Vec::new();
        let mut calls = Vec::new();
        // A counter of this request answered over by the local cache.
        let mut local_over = false;
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
            let entries = shared_entries[i].as_deref().unwrap_or(&entries_of[i]);
            quota[i] = limit.quota_mode;
            let current = CurrentLimit {
                requests_per_unit: limit.requests_per_unit,
                unit,
                name: limit.name.clone(),
            };
            let stats_key = stats_key.into_owned();
            let mut counter = None;
            let (planned, extension) = match limit.extension.as_ref().filter(|e| e.asks()) {
                None => {
                    let mut key = decider.keys.rls_counter(domain, entries, unit.name());
                    let window = Window::at(unit, calendar_zone, &mut key, decider.clock.now_ms());
                    if self.cached_over(&key, &current, decider.clock.now_ms()) {
                        // Upstream: over_limit and over_limit_with_local_cache.
                        let stats = answer::local_cache_stats(hits, limit.shadow_mode);
                        decider.metrics.record_rls(domain, &stats_key, &stats);
                        local_over = true;
                        // The reset is read on the agent's clock (no store
                        // call tells the store's).
                        let now_ms = u64::try_from(decider.clock.now_ms()).unwrap_or(0);
                        let outcome = Outcome::Counted {
                            limit: current.clone(),
                            hits,
                            count_after: u64::from(current.requests_per_unit)
                                .saturating_add(hits.max(1)),
                            now_ms,
                            shadow_mode: limit.shadow_mode,
                        };
                        (Planned::Now(outcome), None)
                    } else {
                        let call =
                            self.window_call(&key, window, hits, false, limit.requests_per_unit);
                        counter = Some((key, window));
                        (Planned::Call(call), None)
                    }
                }
                Some(extension) => {
                    let rule = ExtRule {
                        domain,
                        entries,
                        extension,
                        unit,
                        current: current.clone(),
                        hits,
                        shadow_mode: limit.shadow_mode,
                    };
                    match rls_ext::plan(decider, &rule)? {
                        ExtPlan::Now(outcome) => {
                            self.record_outcome(decider, domain, &stats_key, &outcome, hits);
                            (Planned::Now(outcome), None)
                        }
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
                        counter,
                    });
                }
            }
        }
        if self.options.stop_increment_when_over_limit {
            self.stop_when_over(decider, &counting, &mut calls, local_over)
                .await;
        }
        let sent_ms = decider.clock.now_ms();
        let replies = decider.run(&calls).await;
        for (count, result) in counting.into_iter().zip(replies) {
            if let Some(pending) = count.extension {
                let outcome = rls_ext::read(decider, pending, result)?;
                self.record_outcome(decider, domain, &count.stats_key, &outcome, count.hits);
                statuses[count.index] = answer::status(&outcome);
                continue;
            }
            // A calendar period resets at its end, not at a unit boundary.
            let mut calendar_reset_s = None;
            let outcome = match result {
                Ok(r) => reply::rls_window(&r).map(|read| {
                    if let Some((
                        _,
                        Window {
                            period: Some(_), ..
                        },
                    )) = &count.counter
                    {
                        let left_ms = read.window_end_ms.saturating_sub(read.now_ms).max(1);
                        calendar_reset_s = Some((left_ms as u64).div_ceil(1_000));
                    }
                    if let Some((key, _)) = &count.counter {
                        if read.count > u64::from(count.current.requests_per_unit) {
                            self.remember_over(
                                key,
                                &count.current,
                                read.window_end_ms,
                                read.now_ms,
                                sent_ms,
                                decider.clock.now_ms(),
                            );
                        }
                    }
                    let stats = answer::hit_stats(
                        count.current.requests_per_unit,
                        count.hits,
                        read.count,
                        self.options.near_limit_ratio,
                        count.shadow_mode,
                    );
                    decider.metrics.record_rls(domain, &count.stats_key, &stats);
                    Outcome::Counted {
                        limit: count.current.clone(),
                        hits: count.hits,
                        count_after: read.count,
                        now_ms: u64::try_from(read.now_ms).unwrap_or(0),
                        shadow_mode: count.shadow_mode,
                    }
                }),
                Err(error) => Err(crate::store::script::ScriptError::MalformedReply {
                    script: "store",
                    detail: error.to_string(),
                }),
            };
            statuses[count.index] = match outcome {
                Ok(outcome) => answer::status(&outcome),
                Err(error) => return Err(RlsError::Store(error.to_string())),
            };
            if let Some(reset_s) = calendar_reset_s {
                statuses[count.index].duration_until_reset_s = Some(reset_s);
            }
        }
        for (status, quota) in statuses.iter_mut().zip(quota) {
            status.quota_mode = quota && status.current_limit.is_some();
        }
        Ok(statuses)
    }

    /// Upstream's `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`
    /// (`fixed_cache_impl.go`): when a counter of the request is already
    /// over in the local cache, no other counter is counted; else every
    /// counter is looked at first, and when some would go over with this
    /// request's hits only those are counted (the others are looked at);
    /// when none would, all are counted, each within its limit atomically
    /// (a concurrent request that took one over leaves it uncounted). A
    /// counter whose look failed is counted within its limit only.
    async fn stop_when_over(
        &self,
        decider: &Decider,
        counting: &[Counting],
        calls: &mut [ScriptCall],
        local_over: bool,
    ) {
        let windows: Vec<(usize, &Counting, &String, Window)> = counting
            .iter()
            .enumerate()
            .filter_map(|(j, c)| c.counter.as_ref().map(|(key, unit)| (j, c, key, *unit)))
            .collect();
        if windows.is_empty() {
            return;
        }
        let rpu = |c: &Counting| c.current.requests_per_unit;
        if local_over {
            for (j, c, key, unit) in &windows {
                calls[*j] = self.window_call(key, *unit, 0, false, rpu(c));
            }
            return;
        }
        let looks: Vec<ScriptCall> = windows
            .iter()
            .map(|(_, c, key, unit)| self.window_call(key, *unit, 0, false, rpu(c)))
            .collect();
        let replies = decider.run(&looks).await;
        // Per counter: Some(would go over), None when the look failed.
        let over: Vec<Option<bool>> = windows
            .iter()
            .zip(replies)
            .map(|((_, c, _, _), r)| {
                let read = r.ok().and_then(|r| reply::rls_window(&r).ok())?;
                Some(read.count.saturating_add(c.hits) > u64::from(rpu(c)))
            })
            .collect();
        let any_over = over.contains(&Some(true));
        for ((j, c, key, unit), over) in windows.iter().zip(over) {
            calls[*j] = match over {
                Some(true) => self.window_call(key, *unit, c.hits, false, rpu(c)),
                _ if any_over => self.window_call(key, *unit, 0, false, rpu(c)),
                _ => self.window_call(key, *unit, c.hits, true, rpu(c)),
            };
        }
    }

    /// Counts an extension rule's outcome in `leasehold_rls_hits_total`
    /// (upstream's window counters are counted from their counts).
    fn record_outcome(
        &self,
        decider: &Decider,
        domain: &str,
        stats_key: &str,
        outcome: &Outcome,
        hits: u64,
    ) {
        if let Some(stats) = answer::outcome_stats(outcome, hits, self.options.near_limit_ratio) {
            decider.metrics.record_rls(domain, stats_key, &stats);
        }
    }

    /// The answer of `statuses` under the options: the overall code
    /// (global shadow) and the response headers.
    pub fn finish(&self, statuses: Vec<Status>) -> RlsAnswer {
        RlsAnswer {
            overall: answer::overall(&statuses, self.options.global_shadow_mode),
            headers: answer::headers(&statuses, &self.options.headers),
            statuses,
        }
    }
}

/// A matched limit and its stats key (borrowed from the config in force,
/// or built for a `limit` override).
type Matched<'c> = (Cow<'c, Limit>, Cow<'c, str>);

/// Each descriptor's entries as (key, value).
fn entries_of(request: &RlsRequest) -> Vec<Vec<(&str, &str)>> {
    request
        .descriptors
        .iter()
        .map(|d| {
            d.entries
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect()
        })
        .collect()
}

/// Descriptor `i`'s `limit` override (requests per unit, the proto's unit
/// number) as a limit; a unit Envoy cannot mean is refused, naming it.
fn overridden<'c>(
    domain: &str,
    i: usize,
    entries: &[(&str, &str)],
    (requests_per_unit, unit): (u32, i32),
    hide: &dyn Fn(&str) -> String,
) -> Result<Matched<'c>, InvalidField> {
    let unit = Unit::from_proto(unit).ok_or_else(|| {
        InvalidField::new(
            format!("descriptors[{i}].limit.unit"),
            "must be SECOND, MINUTE, HOUR, DAY, WEEK, MONTH or YEAR",
        )
    })?;
    let limit = override_limit(domain, entries, requests_per_unit, unit, hide);
    let stats_key = Cow::Owned(limit.stats_key.clone());
    Ok((Cow::Owned(limit), stats_key))
}

/// A request's `limit` override: no tree, no name, no shadow; the stats key
/// is upstream's `descriptorKey` (`domain.key_value.key2_value2`) with every
/// value through `hide`: all of them are the request's, none the config's.
fn override_limit(
    domain: &str,
    entries: &[(&str, &str)],
    requests_per_unit: u32,
    unit: Unit,
    hide: &dyn Fn(&str) -> String,
) -> Limit {
    let mut stats_key = domain.to_string();
    for (key, value) in entries {
        stats_key.push('.');
        stats_key.push_str(key);
        if !value.is_empty() {
            stats_key.push('_');
            stats_key.push_str(&hide(value));
        }
    }
    Limit {
        requests_per_unit,
        unit: Some(unit),
        unlimited: false,
        name: String::new(),
        replaces: Vec::new(),
        shadow_mode: false,
        quota_mode: false,
        detailed_metric: false,
        stats_key,
        extension: None,
        file: String::new(),
        line: 0,
    }
}
