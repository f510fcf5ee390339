//! Block spend ns/op in the gateway (leasehold-client's pure block state
//! machine) beside governor's keyed GCRA check, in the same run:
//! `cargo bench --bench block_spend`. A benchmark, never a test.

use std::hint::black_box;
use std::num::NonZeroU32;

use criterion::{criterion_group, criterion_main, Criterion};
use governor::{Quota, RateLimiter};
use leasehold_client::block::{BlockAction, BlockState, LeaseAnswer, SpendOutcome};
use leasehold_client::random::SplitMix64;

const BLOCK_TOKENS: u64 = 1_000;

fn block_spend(c: &mut Criterion) {
    let mut group = c.benchmark_group("gateway_spend_one_token");
    group.bench_function("leasehold_block_try_spend", |b| {
        let mut state = BlockState::new(BLOCK_TOKENS);
        let mut random = SplitMix64::seeded(7);
        let mut actions = Vec::with_capacity(4);
        let mut lease = 0u64;
        let now_ms = 1_000;
        b.iter(|| {
            let outcome = state.try_spend(1, now_ms, &mut random, &mut actions);
            // Answer renewals at once, as a fast agent would: the measured
            // path includes the renewal bookkeeping every ~B spends.
            for action in actions.drain(..) {
                if let BlockAction::Renew { lease_id } = action {
                    lease += 1;
                    state.on_answer(
                        &lease_id,
                        LeaseAnswer::Granted {
                            tokens: BLOCK_TOKENS,
                            expires_in_ms: 10_000,
                        },
                        now_ms,
                        &mut random,
                        &mut Vec::new(),
                    );
                }
            }
            black_box((outcome, lease))
        });
        assert!(!matches!(
            state.try_spend(1, now_ms, &mut random, &mut actions),
            SpendOutcome::Refused { .. }
        ));
    });
    group.bench_function("governor_keyed_check", |b| {
        let limiter = RateLimiter::keyed(Quota::per_second(NonZeroU32::MAX));
        let key = 42u64;
        b.iter(|| black_box(limiter.check_key(black_box(&key)).is_ok()));
    });
    group.finish();
}

criterion_group!(benches, block_spend);
criterion_main!(benches);
