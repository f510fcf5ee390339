//! The simulation's fixed times, read by the hosts ([`crate::run`]) and the
//! bounds ([`crate::checker`]): where simulated time starts, the agents'
//! allocator timeout and syncer lease, how often a host reports its
//! role, and how soon connections a partition hung are gone.

/// 2025-01-01T00:00:00Z: every run starts here.
pub const EPOCH_MS: u64 = 1_735_689_600_000;
/// The agents' allocator call timeout.
pub const AGENT_REQUEST_TIMEOUT_MS: u64 = 2_500;
/// The syncer lease of a Region of several agents: half the agent's
/// default (3 s), so a takeover (bound ttl + ttl/3 + request timeout =
/// 4.5 s) fits well inside a run and before a `two_signal` pool's reclaim
/// wait (3 intervals of silence) would matter.
pub const SYNCER_LEASE_TTL_MS: u64 = 1_500;
/// Gateways give up on the agent after this (then their fail mode:
/// closed): a request counted as admitted was answered within it.
pub const GATEWAY_DEADLINE_MS: u64 = 250;
/// How often an agent host writes its role into the world: the role's
/// deadline is on the host's own clock, so the driver cannot read it.
pub const ROLE_POLL_MS: u64 = 10;

/// How long a Region of several agents may go without a syncer after its
/// syncer dies, from the sim's agent settings.
pub fn syncer_takeover_bound_ms() -> u64 {
    leasehold_region_agent::global::settings::takeover_bound_ms(
        SYNCER_LEASE_TTL_MS,
        AGENT_REQUEST_TIMEOUT_MS,
    )
}

/// How long after a partition starts every connection it caught is gone:
/// an attempt on one times out and drops its channel, and the HTTP/2
/// keepalive closes any other within its interval + timeout (the
/// connectors' settings, `leasehold_allocator::transport`).
pub fn hung_connections_gone_ms() -> u64 {
    let keepalive = leasehold_allocator::transport::KEEPALIVE_INTERVAL
        + leasehold_allocator::transport::KEEPALIVE_TIMEOUT;
    u64::try_from(keepalive.as_millis()).unwrap_or(u64::MAX)
}
