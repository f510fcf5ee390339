//! The global plane: a consensus-backed allocator that owns each global pool.
//!
//! Owns (as later work lands): the pure pool state machine (`pool`, `grant`,
//! `share`, `region`, `fence`, `command`), its openraft glue on sled storage,
//! the `leasehold.allocator.v1` gRPC service and the Region health prober.
//! Does not own Region-local buckets: those belong to `leasehold-region-agent`.
//!
//! Nothing is implemented here yet; see the open allocator issues.
