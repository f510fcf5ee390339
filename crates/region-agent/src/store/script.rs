//! The Lua scripts of the regional data plane and the shape of one call.
//!
//! Every script's source is `lua/prelude.lua` followed by its own file, so
//! argument validation and the clock read are written once. A [`ScriptCall`]
//! is exactly what goes to Redis (KEYS and ARGV as text); the reply is the
//! script's integer array whose **last** element is the `now_ms` it used.

use std::sync::LazyLock;

pub mod pack;
pub mod reply;

const PRELUDE: &str = include_str!("../../../../lua/prelude.lua");

/// Which script a call runs. One variant per file in `lua/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ScriptKind {
    TokenBucket,
    MultiRule,
    LeaseBlock,
    GiveBack,
    Concurrency,
    FixedWindow,
    SlidingLog,
    SlidingCounter,
    Gcra,
    ChunkCredit,
    ChunkSpend,
    RlsWindow,
    /// A `token_bucket`, `multi_rule` or `lease_block` call under the
    /// shares a Region's syncer wrote into the store
    /// ([`crate::algorithm::share_gate::gated`]).
    ShareGate,
    ShareWrite,
    ShareRead,
    PoolDemand,
    ChunkIndex,
    SyncerLease,
    /// Up to [`MULTI_DECISION_MAX_CALLS`] calls of the other kinds in one
    /// EVALSHA ([`multi_decision_call`]); its reply is one reply per call.
    MultiDecision,
    /// A decision call of a [`ScriptKind::lookable`] kind answered without
    /// writing ([`look_call`]): Envoy's check-only hits on a TOML rule.
    Look,
    /// Up to [`MULTI_DECISION_MAX_CALLS`] single-rule `multi_rule` calls
    /// without record or shadow, each rule's parameters sent once
    /// ([`pack::bucket_pack_call`]): the cold path of a Check.
    BucketPack,
    /// A sender's running usage totals of one (tenant, meter), larger-wins
    /// (`crate::meter::record`).
    UsageRecord,
    /// A meter's Region total in one period and its senders' state, read-only.
    UsageRead,
    /// The Region's usage senders: a beat per record, and who is silent.
    UsageSender,
    /// An admitted request's real cost charged after the fact, into debt
    /// down to `max_debt` (issue 30).
    BucketCharge,
    /// Clears a period's owed marker once its roll-up report is committed.
    UsageOwed,
}

impl ScriptKind {
    pub const ALL: [ScriptKind; 26] = [
        ScriptKind::TokenBucket,
        ScriptKind::MultiRule,
        ScriptKind::LeaseBlock,
        ScriptKind::GiveBack,
        ScriptKind::Concurrency,
        ScriptKind::FixedWindow,
        ScriptKind::SlidingLog,
        ScriptKind::SlidingCounter,
        ScriptKind::Gcra,
        ScriptKind::ChunkCredit,
        ScriptKind::ChunkSpend,
        ScriptKind::RlsWindow,
        ScriptKind::ShareGate,
        ScriptKind::ShareWrite,
        ScriptKind::ShareRead,
        ScriptKind::PoolDemand,
        ScriptKind::ChunkIndex,
        ScriptKind::SyncerLease,
        ScriptKind::MultiDecision,
        ScriptKind::Look,
        ScriptKind::BucketPack,
        ScriptKind::UsageRecord,
        ScriptKind::UsageRead,
        ScriptKind::UsageSender,
        ScriptKind::BucketCharge,
        ScriptKind::UsageOwed,
    ];

    /// File stem in `lua/`, also used in metrics and logs.
    pub fn name(self) -> &'static str {
        match self {
            ScriptKind::TokenBucket => "token_bucket",
            ScriptKind::MultiRule => "multi_rule",
            ScriptKind::LeaseBlock => "lease_block",
            ScriptKind::GiveBack => "give_back",
            ScriptKind::Concurrency => "concurrency",
            ScriptKind::FixedWindow => "fixed_window",
            ScriptKind::SlidingLog => "sliding_log",
            ScriptKind::SlidingCounter => "sliding_counter",
            ScriptKind::Gcra => "gcra",
            ScriptKind::ChunkCredit => "chunk_credit",
            ScriptKind::ChunkSpend => "chunk_spend",
            ScriptKind::RlsWindow => "rls_window",
            ScriptKind::ShareGate => "share_gate",
            ScriptKind::ShareWrite => "share_write",
            ScriptKind::ShareRead => "share_read",
            ScriptKind::PoolDemand => "pool_demand",
            ScriptKind::ChunkIndex => "chunk_index",
            ScriptKind::SyncerLease => "syncer_lease",
            ScriptKind::MultiDecision => "multi_decision",
            ScriptKind::Look => "look",
            ScriptKind::BucketPack => "bucket_pack",
            ScriptKind::UsageRecord => "usage_record",
            ScriptKind::UsageRead => "usage_read",
            ScriptKind::UsageSender => "usage_sender",
            ScriptKind::BucketCharge => "bucket_charge",
            ScriptKind::UsageOwed => "usage_owed",
        }
    }

    fn body(self) -> &'static str {
        match self {
            ScriptKind::TokenBucket => include_str!("../../../../lua/token_bucket.lua"),
            ScriptKind::MultiRule => include_str!("../../../../lua/multi_rule.lua"),
            ScriptKind::LeaseBlock => include_str!("../../../../lua/lease_block.lua"),
            ScriptKind::GiveBack => include_str!("../../../../lua/give_back.lua"),
            ScriptKind::Concurrency => include_str!("../../../../lua/concurrency.lua"),
            ScriptKind::FixedWindow => include_str!("../../../../lua/fixed_window.lua"),
            ScriptKind::SlidingLog => include_str!("../../../../lua/sliding_log.lua"),
            ScriptKind::SlidingCounter => include_str!("../../../../lua/sliding_counter.lua"),
            ScriptKind::Gcra => include_str!("../../../../lua/gcra.lua"),
            ScriptKind::ChunkCredit => include_str!("../../../../lua/chunk_credit.lua"),
            ScriptKind::ChunkSpend => include_str!("../../../../lua/chunk_spend.lua"),
            ScriptKind::RlsWindow => include_str!("../../../../lua/rls_window.lua"),
            ScriptKind::ShareGate => include_str!("../../../../lua/share_gate.lua"),
            ScriptKind::ShareWrite => include_str!("../../../../lua/share_write.lua"),
            ScriptKind::ShareRead => include_str!("../../../../lua/share_read.lua"),
            ScriptKind::PoolDemand => include_str!("../../../../lua/pool_demand.lua"),
            ScriptKind::ChunkIndex => include_str!("../../../../lua/chunk_index.lua"),
            ScriptKind::SyncerLease => include_str!("../../../../lua/syncer_lease.lua"),
            ScriptKind::MultiDecision => include_str!("../../../../lua/multi_decision.lua"),
            ScriptKind::Look => include_str!("../../../../lua/look.lua"),
            ScriptKind::BucketPack => include_str!("../../../../lua/bucket_pack.lua"),
            ScriptKind::UsageRecord => include_str!("../../../../lua/usage_record.lua"),
            ScriptKind::UsageRead => include_str!("../../../../lua/usage_read.lua"),
            ScriptKind::UsageSender => include_str!("../../../../lua/usage_sender.lua"),
            ScriptKind::BucketCharge => include_str!("../../../../lua/bucket_charge.lua"),
            ScriptKind::UsageOwed => include_str!("../../../../lua/usage_owed.lua"),
        }
    }

    /// A call of this kind may run under `share_gate` (several agents per
    /// Region: `crate::algorithm::share_gate::gated`).
    pub fn gateable(self) -> bool {
        matches!(
            self,
            ScriptKind::TokenBucket | ScriptKind::MultiRule | ScriptKind::LeaseBlock
        )
    }

    /// A call of this kind may be looked at ([`look_call`]): the decision
    /// scripts Envoy's RLS runs for a TOML rule (a charge's, a gate's).
    pub fn lookable(self) -> bool {
        matches!(
            self,
            ScriptKind::TokenBucket
                | ScriptKind::MultiRule
                | ScriptKind::Gcra
                | ScriptKind::FixedWindow
                | ScriptKind::SlidingCounter
                | ScriptKind::SlidingLog
                | ScriptKind::ChunkSpend
                | ScriptKind::ShareGate
        )
    }

    /// Full source as loaded into Redis: prelude + script body.
    pub fn source(self) -> &'static str {
        static SOURCES: LazyLock<Vec<String>> = LazyLock::new(|| {
            ScriptKind::ALL
                .iter()
                .map(|kind| match kind {
                    ScriptKind::MultiDecision => multi_decision_source(),
                    ScriptKind::ShareGate => share_gate_source(),
                    ScriptKind::Look => look_source(),
                    _ => format!("{PRELUDE}\n{}", kind.body()),
                })
                .collect()
        });
        &SOURCES[self as usize]
    }

    /// The redis-rs script object (holds the SHA1 used by EVALSHA).
    pub fn script(self) -> &'static redis::Script {
        static SCRIPTS: LazyLock<Vec<redis::Script>> = LazyLock::new(|| {
            ScriptKind::ALL
                .iter()
                .map(|kind| redis::Script::new(kind.source()))
                .collect()
        });
        &SCRIPTS[self as usize]
    }
}

/// The prelude, one clock read per call, the bodies a gate may run wrapped
/// into `LH_SCRIPTS` (as in multi_decision), then the gate's own body.
fn share_gate_source() -> String {
    let mut source = format!("{PRELUDE}\n{MULTI_DECISION_CLOCK}\nlocal LH_SCRIPTS = {{}}\n");
    for kind in ScriptKind::ALL {
        if kind.gateable() {
            source.push_str(&wrapped(kind));
        }
    }
    source.push_str(ScriptKind::ShareGate.body());
    source
}

/// A script body as a function of (KEYS, ARGV) in `LH_SCRIPTS`.
fn wrapped(kind: ScriptKind) -> String {
    format!(
        "LH_SCRIPTS['{}'] = function(KEYS, ARGV)\n{}\nend\n",
        kind.name(),
        kind.body()
    )
}

/// The `redis` a look's bodies run on: reads reach Redis, writes are
/// dropped (answered 0: no body reads a write's reply), and any other
/// command raises `look invalid` (a body that learnt a new command must be
/// listed here before it can be looked at). sliding_log's trim only drops
/// entries already out of its window, so it runs: its count needs it.
const LOOK_READ_ONLY: &str = "local LH_LOOK_READS = {TIME = true, GET = true, HGET = true,
  HMGET = true, PEXPIRETIME = true, ZCARD = true, ZSCORE = true, ZRANGE = true,
  ZREMRANGEBYSCORE = true}
local LH_LOOK_WRITES = {HSET = true, PEXPIRE = true, SET = true, ZADD = true, DECRBY = true}
local LH_READ_ONLY = {
  call = function(command, ...)
    local name = string.upper(command)
    if LH_LOOK_READS[name] then return redis.call(command, ...) end
    if LH_LOOK_WRITES[name] then return 0 end
    error({err = 'ERR leasehold: look invalid'})
  end,
  error_reply = redis.error_reply,
}
local LH_LOOK = {}";

/// The prelude, one clock read per call (a gate and its inner call decide
/// at one store time), every lookable body wrapped into `LH_LOOK` on the
/// read-only `redis` (a gate's inner call too: its `LH_SCRIPTS` is
/// `LH_LOOK`), then the look's own body.
fn look_source() -> String {
    let mut source = format!("{PRELUDE}\n{MULTI_DECISION_CLOCK}\n{LOOK_READ_ONLY}\n");
    for kind in ScriptKind::ALL {
        if kind.lookable() {
            source.push_str(&format!(
                "LH_LOOK['{}'] = function(KEYS, ARGV)\nlocal redis, LH_SCRIPTS = LH_READ_ONLY, LH_LOOK\n{}\nend\n",
                kind.name(),
                kind.body()
            ));
        }
    }
    source.push_str(ScriptKind::Look.body());
    source
}

/// `call` looked at: the same keys, its script's name before its
/// arguments. The caller keeps `call` of a [`ScriptKind::lookable`] kind
/// (the script refuses any other: `look invalid`).
pub fn look_call(call: &ScriptCall) -> ScriptCall {
    debug_assert!(call.kind.lookable(), "{} is not lookable", call.kind.name());
    let mut look = ScriptCall::new(ScriptKind::Look).arg(call.kind.name());
    look.keys.extend(call.keys.iter().cloned());
    look.args.extend(call.args.iter().cloned());
    look
}

/// Most sub-calls one multi_decision call carries (`LH_MULTI_MAX` in
/// `lua/multi_decision.lua`): 64 keeps one script run short (each sub-call is
/// a few `redis.call`s, so tens of microseconds in all) while most of the
/// per-call overhead is already paid at 16.
pub const MULTI_DECISION_MAX_CALLS: usize = 64;

/// Shadows the prelude's `lh_now_ms` for the wrapped bodies: TIME is read
/// once per multi_decision call (one `redis.call` less per sub-call), so
/// every sub-call decides at the same store time, as Redis itself holds
/// key expiry at the script's start.
const MULTI_DECISION_CLOCK: &str = "local lh_now_ms_once = nil
local function lh_now_ms()
  if not lh_now_ms_once then
    local t = redis.call('TIME')
    lh_now_ms_once = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return lh_now_ms_once
end";

/// The prelude, every other script's body wrapped as a function of
/// (KEYS, ARGV) in the table `LH_SCRIPTS` under its name, then the
/// dispatcher: one source of truth per algorithm.
fn multi_decision_source() -> String {
    let mut source = format!("{PRELUDE}\n{MULTI_DECISION_CLOCK}\nlocal LH_SCRIPTS = {{}}\n");
    for kind in ScriptKind::ALL {
        // A look goes alone (the coalescer never packs one): its bodies
        // need their read-only wrapping, which this source does not carry.
        // A bucket pack is itself a pack, never a sub-call.
        if matches!(
            kind,
            ScriptKind::MultiDecision | ScriptKind::Look | ScriptKind::BucketPack
        ) {
            continue;
        }
        source.push_str(&wrapped(kind));
    }
    source.push_str(ScriptKind::MultiDecision.body());
    source
}

/// The kind named `name` among those a multi_decision call may carry.
pub fn sub_call_kind(name: &str) -> Option<ScriptKind> {
    ScriptKind::ALL.into_iter().find(|kind| {
        !matches!(
            kind,
            ScriptKind::MultiDecision | ScriptKind::Look | ScriptKind::BucketPack
        ) && kind.name() == name
    })
}

/// One multi_decision call carrying `calls` in order: KEYS are their keys
/// concatenated, ARGV is the count then per call its script name, key
/// count, argument count and arguments. The caller keeps `calls` within
/// [1, [`MULTI_DECISION_MAX_CALLS`]] and of no multi_decision kind; the
/// script refuses anything else whole (`calls invalid`).
pub fn multi_decision_call(calls: &[ScriptCall]) -> ScriptCall {
    let mut call = ScriptCall::new(ScriptKind::MultiDecision).arg(calls.len());
    for sub in calls {
        call.keys.extend(sub.keys.iter().cloned());
        call = call
            .arg(sub.kind.name())
            .arg(sub.keys.len())
            .arg(sub.args.len());
        call.args.extend(sub.args.iter().cloned());
    }
    call
}

/// One script invocation: keys and arguments exactly as Redis receives them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptCall {
    pub kind: ScriptKind,
    pub keys: Vec<String>,
    pub args: Vec<String>,
}

impl ScriptCall {
    pub fn new(kind: ScriptKind) -> Self {
        ScriptCall {
            kind,
            keys: Vec::new(),
            args: Vec::new(),
        }
    }

    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.keys.push(key.into());
        self
    }

    pub fn arg(mut self, arg: impl ToString) -> Self {
        self.args.push(arg.to_string());
        self
    }
}

/// A script's integer reply. By contract the last element is the `now_ms`
/// the script read from the store's clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptReply {
    pub values: Vec<i64>,
}

impl ScriptReply {
    /// The store time the script decided at (its last element).
    pub fn now_ms(&self) -> Option<i64> {
        self.values.last().copied()
    }

    /// The reply without its trailing `now_ms`.
    pub fn decision(&self) -> &[i64] {
        match self.values.split_last() {
            Some((_, rest)) => rest,
            None => &[],
        }
    }
}

/// A script refused its input. Never retried: it is a policy fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScriptError {
    /// `ERR leasehold: <argument> invalid`; nothing was written.
    #[error("leasehold: {0} invalid")]
    InvalidArgument(String),
    /// `ERR leasehold: <field> refused: <reason>`: well-formed input the data
    /// plane refuses (a request id reused with other content, a lease that is
    /// not live); nothing was written. The caller's error, not a store fault.
    #[error("leasehold: {field} refused: {reason}")]
    Refused { field: String, reason: String },
    /// A reply of unexpected shape or range (see [`reply`]): a store fault,
    /// never read as an allow.
    #[error("malformed {script} reply: {detail}")]
    MalformedReply {
        script: &'static str,
        detail: String,
    },
    /// Any other error reply (for example a wrong key type).
    #[error("script error: {0}")]
    Other(String),
}

impl ScriptError {
    /// Classifies a Redis error reply's text.
    pub fn from_reply_text(text: &str) -> Self {
        if let Some(rest) = text.split("leasehold: ").nth(1) {
            if let Some((field, after)) = rest.split_once(" refused: ") {
                // The reason is one word the script chose; whatever Redis
                // appends after it (script name, line) is dropped.
                let reason: String = after
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                    .collect();
                if !field.contains(' ') && !reason.is_empty() {
                    return ScriptError::Refused {
                        field: field.to_string(),
                        reason,
                    };
                }
            }
            if let Some(name) = rest.strip_suffix(" invalid").or_else(|| {
                rest.split(" invalid")
                    .next()
                    .filter(|_| rest.contains(" invalid"))
            }) {
                return ScriptError::InvalidArgument(name.trim().to_string());
            }
        }
        ScriptError::Other(text.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multi_decision_wraps_every_other_body_once() {
        let source = ScriptKind::MultiDecision.source();
        for kind in ScriptKind::ALL {
            if matches!(
                kind,
                ScriptKind::MultiDecision | ScriptKind::Look | ScriptKind::BucketPack
            ) {
                assert_eq!(sub_call_kind(kind.name()), None);
                continue;
            }
            assert_eq!(source.matches(kind.body()).count(), 1, "{}", kind.name());
            assert_eq!(sub_call_kind(kind.name()), Some(kind));
        }
        assert!(source.ends_with(ScriptKind::MultiDecision.body()));
        assert!(!source.contains(ScriptKind::Look.body()));
    }

    #[test]
    fn a_look_wraps_each_lookable_body_once_on_the_read_only_redis() {
        let source = ScriptKind::Look.source();
        for kind in ScriptKind::ALL {
            let expected = usize::from(kind.lookable());
            assert_eq!(
                source.matches(kind.body()).count(),
                expected + usize::from(kind == ScriptKind::Look),
                "{}",
                kind.name()
            );
        }
        let wrappers = source
            .matches("local redis, LH_SCRIPTS = LH_READ_ONLY, LH_LOOK")
            .count();
        assert_eq!(
            wrappers,
            ScriptKind::ALL.iter().filter(|k| k.lookable()).count()
        );
        assert!(source.ends_with(ScriptKind::Look.body()));
        let call = ScriptCall::new(ScriptKind::FixedWindow)
            .key("k")
            .arg(5)
            .arg(60_000);
        let look = look_call(&call);
        assert_eq!(look.kind, ScriptKind::Look);
        assert_eq!(look.keys, ["k"]);
        assert_eq!(look.args, ["fixed_window", "5", "60000"]);
    }

    #[test]
    fn the_prelude_never_reads_the_global_keys_or_argv() {
        // multi_decision runs each body on its sub-call's KEYS and ARGV
        // (function parameters); a prelude helper reading the globals would
        // see the whole envelope instead.
        let code: String = PRELUDE
            .lines()
            .filter(|line| !line.trim_start().starts_with("--"))
            .collect();
        assert!(!code.contains("KEYS") && !code.contains("ARGV"));
    }

    #[test]
    fn multi_decision_call_concatenates_keys_and_frames_arguments() {
        let a = ScriptCall::new(ScriptKind::TokenBucket).key("k1").arg(5);
        let b = ScriptCall::new(ScriptKind::GiveBack)
            .key("k2")
            .key("k3")
            .arg(1)
            .arg(2);
        let call = multi_decision_call(&[a, b]);
        assert_eq!(call.keys, ["k1", "k2", "k3"]);
        assert_eq!(
            call.args,
            [
                "2",
                "token_bucket",
                "1",
                "1",
                "5",
                "give_back",
                "2",
                "2",
                "1",
                "2"
            ]
        );
    }

    #[test]
    fn every_script_starts_with_the_prelude() {
        for kind in ScriptKind::ALL {
            assert!(kind.source().starts_with(PRELUDE), "{}", kind.name());
            assert!(kind.source().len() > PRELUDE.len() + 10, "{}", kind.name());
        }
    }

    #[test]
    fn all_lists_every_kind_once_in_declaration_order() {
        // source() and script() index their tables by `kind as usize`.
        for (index, kind) in ScriptKind::ALL.iter().enumerate() {
            assert_eq!(*kind as usize, index, "{}", kind.name());
        }
        let names: std::collections::BTreeSet<_> =
            ScriptKind::ALL.iter().map(|kind| kind.name()).collect();
        assert_eq!(names.len(), ScriptKind::ALL.len());
    }

    #[test]
    fn invalid_argument_reply_names_the_argument() {
        assert_eq!(
            ScriptError::from_reply_text("leasehold: capacity invalid"),
            ScriptError::InvalidArgument("capacity".into())
        );
        assert_eq!(
            ScriptError::from_reply_text("ERR leasehold: slack_ms invalid script: abc"),
            ScriptError::InvalidArgument("slack_ms".into())
        );
        assert!(matches!(
            ScriptError::from_reply_text("WRONGTYPE Operation"),
            ScriptError::Other(_)
        ));
    }

    #[test]
    fn refused_reply_names_the_field_and_the_reason() {
        assert_eq!(
            ScriptError::from_reply_text("ERR leasehold: request_id refused: reused"),
            ScriptError::Refused {
                field: "request_id".into(),
                reason: "reused".into()
            }
        );
        assert_eq!(
            ScriptError::from_reply_text(
                "ERR leasehold: tokens refused: above_block script: 1a2b, on @user_script:9."
            ),
            ScriptError::Refused {
                field: "tokens".into(),
                reason: "above_block".into()
            }
        );
        assert!(matches!(
            ScriptError::from_reply_text("ERR leasehold: refused: "),
            ScriptError::Other(_)
        ));
    }
}
