//! Policy bundles (ARCHITECTURE §3.4–§3.6): immutable, versioned,
//! checksummed sets of rules, parsed from TOML, validated, resolved per
//! request, swapped atomically and hot-reloaded from a file.
//!
//! Pure logic except [`watch`], which reads one file. Owns: the bundle
//! format, its validation, rule resolution and the bundle in force. Does
//! not own: deciding (the scripts and their twins), keys (`key`), fail-mode
//! execution or decision records (the agent's request path).
//!
//! Map:
//! - [`model`]: what a validated bundle holds (`Bundle`, `Domain`, `Rule`, ...).
//! - [`parse`](mod@parse): TOML text → `Bundle` (or every error), the checksum, the 1 MiB cap.
//! - [`validate`]: the §3.6 checks on the model, one rule and a domain's rules together.
//! - [`error`]: `PolicyError` (file, line, rule, field, problem) and `PolicyErrors`.
//! - [`resolve`]: the rules that apply to one request, most specific first.
//! - [`holder`]: `PolicyHolder`, the bundle in force: higher versions only.
//! - [`watch`]: polls a file (+ optional `.sha256` sidecar) and installs new versions.
//!
//! # Format
//!
//! ```toml
//! version = 42                   # required, ≥ 1; agents accept only a higher one
//!
//! [[meter]]                      # optional (issue 30): at most 64
//! name = "api-calls"             # [a-z0-9_-]{1,64}, unique
//! period = "month"               # day | week (ISO, Monday first) | month
//! time_zone = "Europe/Berlin"    # an IANA name, default "UTC"
//!
//! [[domain]]
//! name = "api"                   # [a-z0-9-]{1,30}, unique; global hash tag g-<name>
//!
//! [[domain.rule]]
//! id = "p-read"                  # [a-z0-9_-]{1,64}, unique within the domain
//! scope = "user"                 # user | route | tenant | global
//! algorithm = "token_bucket"     # token_bucket | fixed_window | sliding_log |
//!                                # sliding_counter | gcra | concurrency
//! match = { route_group = "read", method = "GET", descriptors = { plan = "gold" } }
//! capacity = 20                  # tokens (window algorithms: the limit)
//! refill = 2                     # tokens per period (window algorithms: = capacity or omitted)
//! period_ms = 1000               # (window algorithms: the window)
//! cost = 1                       # tokens one request spends, default 1
//! fail_mode = { local = { capacity = 5, refill = 1, period_ms = 4000 } }
//! idempotent_ttl_ms = 60000      # optional: record decisions under the request id
//! shadow = false                 # default false: decide and record, never refuse
//! security = false               # default false: security rules are never leased
//! slack_ms = 5000                # default 1000: key TTL beyond the full-refill time
//! meter = "api-calls"            # optional: admitted requests count toward this meter
//!
//! [[domain.rule]]
//! id = "p-export-inflight"
//! scope = "tenant"
//! algorithm = "concurrency"      # no capacity/refill/period_ms: the cap is the limit
//! match = { route_group = "export" }
//! concurrency = { max_in_flight = 3, lease_ttl_ms = 60000 }
//! fail_mode = "closed"
//!
//! [[domain.rule]]
//! id = "p-global"
//! scope = "global"
//! algorithm = "token_bucket"
//! match = { route_group = "catalog", method = "GET" }
//! capacity = 40000
//! refill = 40000
//! period_ms = 1000
//! fail_mode = "open"
//! leased = { gateways = 100 }    # gateways spend blocks of max(10, ⌈0.25 s × r / N⌉)
//! ```
//!
//! Fields (unknown fields anywhere are errors; nested tables may be inline
//! or `[domain.rule.match]`-style sub-tables):
//!
//! | field | required | values |
//! |---|---|---|
//! | `id`, `scope`, `algorithm`, `fail_mode` | yes | as above; `fail_mode` = `"open"`, `"closed"` or `{ local = { capacity, refill, period_ms } }` |
//! | `capacity`, `period_ms` | yes, except concurrency (forbidden there) | tokens in [1, ⌊2^40/1000⌋]; ms in [1, 2^40]; capacity × 1000 × period_ms ≤ 2^52 |
//! | `refill` | token_bucket, gcra | tokens in [1, ⌊2^40/1000⌋]; window algorithms: = capacity or omitted |
//! | `cost` | no (1) | ≤ capacity; 1 for sliding_log and concurrency |
//! | `match` | no (matches all) | `route_group`, descriptor keys `[a-z0-9_.-]{1,64}`; `method` `[A-Z]+`; ≤ 16 descriptors of printable ASCII; route scope needs `route_group` |
//! | `idempotent_ttl_ms` | no | [1, 2^40] |
//! | `slack_ms` | no (1000) | [0, 2^40] |
//! | `shadow`, `security` | no (false) | booleans |
//! | `leased` | no | `{ gateways = [1, 1024] }`; token_bucket only, not security, not shadow; the block must fit the capacity |
//! | `meter` | no | a `[[meter]]`'s name: the rule's admitted requests (and their cost) count toward it, per tenant and period |
//! | `placement` | no | `"split"`, security rules only: each of the bundle's `regions = [...]` (2–64 Region ids, top level) enforces ⌊capacity/n⌋ and ⌊refill/n⌋, so the Regions together admit at most n × ⌊L/n⌋ ≤ L; refused when that is 0. Absent: each Region enforces the whole limit |
//! | `concurrency` | iff algorithm = concurrency | `{ max_in_flight = [1, 100000], lease_ttl_ms = [1, 2^40] }` |
//!
//! A concurrency rule's [`Rate`] mirrors its cap (capacity =
//! refill = max_in_flight, period = lease_ttl_ms). sliding_log's capacity is
//! at most 100,000 (one log entry per request).
//!
//! # Rules of one request (§3.6)
//!
//! Two rules *can co-match* unless some key (route group, method, a
//! descriptor) is set in both to different values. *Checked* rules are
//! neither leased nor concurrency: the agent evaluates them together in
//! one script call under one hash tag (the tenant for user, route and
//! tenant scope; `g-<domain>` for global scope). So, among checked rules
//! that can co-match: at most 8 (counting each rule with everything that
//! can co-match it), one hash tag, and only token buckets unless alone.
//! Leased rules and concurrency rules that can co-match number at most 8
//! each; they run their own scripts and may carry any tag.
//!
//! # Envoy's RLS on a TOML domain
//!
//! ```toml
//! [domain.envoy]                 # optional; these are the defaults
//! tenant_key = "tenant"          # the entry naming the tenant
//! # default_tenant = "public"    # a descriptor without tenant_key: this tenant
//! #                              # (unset: such a descriptor matches no rule, OK)
//! principal_keys = ["user", "api_key", "remote_address", "principal"]
//! route_group_key = "route_group"
//! method_key = "method"
//! ```
//!
//! Entry keys are 1–64 bytes of printable ASCII; each fills one field;
//! 1–8 principal keys. Every other entry of a descriptor is a descriptor
//! rules match on (see `crate::envoy::target`).
//!
//! Bounds: a bundle is at most 1 MiB, 64 domains, 1,024 rules per domain;
//! one parse reports at most 20 errors.

pub mod error;
pub mod holder;
pub mod model;
pub mod parse;
pub mod resolve;
pub mod rlqs;
pub mod validate;
pub mod watch;

pub use error::{PolicyError, PolicyErrors, Problem, MAX_ERRORS};
pub use holder::{
    check_rpc_version_step, InstallError, Installed, PolicyHolder, MAX_RPC_VERSION_STEP,
};
pub use model::{
    Algorithm, Bundle, ConcurrencyCap, Domain, EnvoyMapping, FailMode, Leased, Match, Placement,
    Rate, Rule, Scope, Unreachable, MIN_BLOCK_TOKENS,
};
pub use parse::{checksum, parse, MAX_BUNDLE_BYTES};
pub use resolve::{RequestView, ResolveError, Resolved};
pub use watch::{load_file, spawn_file_watch, FileWatch, PollOutcome};

#[cfg(test)]
mod tests {
    use super::*;

    /// The `toml` block of this module's documentation.
    fn doc_example() -> String {
        let source = include_str!("mod.rs");
        source
            .lines()
            .map_while(|line| line.strip_prefix("//!"))
            .skip_while(|line| line.trim() != "```toml")
            .skip(1)
            .take_while(|line| line.trim() != "```")
            .map(|line| line.strip_prefix(' ').unwrap_or(line))
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[test]
    fn documented_example_parses() {
        let text = doc_example();
        assert!(text.contains("[[domain.rule]]"), "{text}");
        let bundle = parse("doc.toml", &text, None).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(bundle.version, 42);
        assert_eq!(bundle.domains["api"].rules.len(), 3);
        let global = bundle.rule("api", "p-global").unwrap();
        assert_eq!(global.block_tokens(), Some(100));
        assert_eq!(bundle.meters["api-calls"].time_zone, "Europe/Berlin");
        let read = bundle.rule("api", "p-read").unwrap();
        assert_eq!(read.meter.as_deref(), Some("api-calls"));
    }
}
