//! How long a leased block lives and how long its give-back is accepted:
//! shared by gateways' blocks ([`super`]) and the agent's own
//! ([`super::agent`]), with no dependency on the decision path.

/// How long a gateway may spend a block after it was granted.
pub const BLOCK_EXPIRES_IN_MS: i64 = 10_000;
/// How long after a block's expiry its give-back is still accepted: the
/// gateway expires a block on its own clock, from when the grant reached it,
/// then sends the give-back; this covers that delay and the RPC's.
pub const RETURN_GRACE_MS: u64 = 20_000;
/// How long a lease record lives (its TTL and its `expires_at_ms` on the
/// store's clock): the block's expiry plus [`RETURN_GRACE_MS`]. Bounds the
/// records a lease id can keep alive, and keeps the mark of a returned
/// block for that long, so a retried give-back is answered as a replay.
pub const LEASE_RECORD_TTL_MS: u64 = BLOCK_EXPIRES_IN_MS as u64 + RETURN_GRACE_MS;
