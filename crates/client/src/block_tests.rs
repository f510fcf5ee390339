//! Tests of `block.rs`, kept beside it so the code reads on its own.

use super::*;
use crate::random::SplitMix64;

/// A source whose every draw is `value` (jitter = value % 51).
struct Fixed(u64);

impl RandomSource for Fixed {
    fn next_u64(&mut self) -> u64 {
        self.0
    }
}

fn renew_id(actions: &[BlockAction]) -> String {
    let renewals: Vec<&String> = actions
        .iter()
        .filter_map(|action| match action {
            BlockAction::Renew { lease_id } => Some(lease_id),
            BlockAction::GiveBack { .. } => None,
        })
        .collect();
    assert_eq!(renewals.len(), 1, "exactly one renewal in {actions:?}");
    renewals[0].clone()
}

fn count_renewals(actions: &[BlockAction]) -> usize {
    actions
        .iter()
        .filter(|action| matches!(action, BlockAction::Renew { .. }))
        .count()
}

/// A state holding one granted block of `block_tokens`, asked at `now_ms`.
fn granted(block_tokens: u64, now_ms: u64) -> (BlockState, String) {
    let mut state = BlockState::new(block_tokens);
    let mut random = SplitMix64::seeded(1);
    let mut actions = Vec::new();
    assert_eq!(
        state.try_spend(1, now_ms, &mut random, &mut actions),
        SpendOutcome::Wait
    );
    let lease_id = renew_id(&actions);
    let grant = LeaseAnswer::Granted {
        tokens: block_tokens,
        expires_in_ms: 10_000,
    };
    state.on_answer(&lease_id, grant, now_ms, &mut random, &mut actions);
    (state, lease_id)
}

fn spend(state: &mut BlockState, cost: u64, now_ms: u64) -> (SpendOutcome, Vec<BlockAction>) {
    let mut actions = Vec::new();
    let outcome = state.try_spend(cost, now_ms, &mut SplitMix64::seeded(9), &mut actions);
    (outcome, actions)
}

#[test]
fn empty_state_asks_for_a_block_and_waits() {
    let mut state = BlockState::new(10);
    let (outcome, actions) = spend(&mut state, 1, 0);
    assert_eq!(outcome, SpendOutcome::Wait);
    assert_eq!(count_renewals(&actions), 1);
    assert!(state.renewal_in_flight());
    let (outcome, actions) = spend(&mut state, 1, 1);
    assert_eq!(outcome, SpendOutcome::Wait);
    assert!(actions.is_empty(), "no second ask while one is in flight");
}

#[test]
fn renews_at_twenty_percent_left_with_one_renewal_in_flight() {
    let (mut state, _) = granted(10, 0);
    for _ in 0..7 {
        let (outcome, actions) = spend(&mut state, 1, 1);
        assert!(matches!(outcome, SpendOutcome::Spent(_)));
        assert!(actions.is_empty(), "no renewal above 20% left");
    }
    let (_, actions) = spend(&mut state, 1, 1); // 2 of 10 left = 20%
    assert_eq!(count_renewals(&actions), 1);
    let (outcome, actions) = spend(&mut state, 1, 1); // 1 left
    assert!(matches!(outcome, SpendOutcome::Spent(_)));
    assert!(actions.is_empty(), "the renewal in flight is the only one");
    let (_, actions) = spend(&mut state, 1, 1);
    assert!(actions.is_empty());
    assert_eq!(spend(&mut state, 1, 1).0, SpendOutcome::Wait);
}

#[test]
fn refusal_bars_asking_until_retry_after_plus_jitter() {
    let mut state = BlockState::new(10);
    let mut actions = Vec::new();
    let mut random = Fixed(37); // jitter = 37 % 51 = 37
    state.try_spend(1, 1_000, &mut random, &mut actions);
    let lease_id = renew_id(&actions);
    let refusal = LeaseAnswer::Refused {
        retry_after_ms: 400,
    };
    state.on_answer(&lease_id, refusal, 1_000, &mut random, &mut actions);
    assert_eq!(state.denied_until_ms(), 1_437);
    let (outcome, actions) = spend(&mut state, 1, 1_436);
    assert_eq!(
        outcome,
        SpendOutcome::Refused { retry_after_ms: 1 },
        "one ms before the bar lifts"
    );
    assert!(actions.is_empty(), "no ask while barred");
    let (outcome, actions) = spend(&mut state, 1, 1_437);
    assert_eq!(outcome, SpendOutcome::Wait);
    assert_ne!(
        renew_id(&actions),
        lease_id,
        "a refused lease id is retired"
    );
}

#[test]
fn refusal_jitter_is_drawn_from_zero_to_fifty_ms() {
    let mut random = SplitMix64::seeded(5);
    let mut jitters_ms = Vec::new();
    for _ in 0..500 {
        let mut state = BlockState::new(10);
        let mut actions = Vec::new();
        state.try_spend(1, 0, &mut random, &mut actions);
        let lease_id = renew_id(&actions);
        let refusal = LeaseAnswer::Refused {
            retry_after_ms: 100,
        };
        state.on_answer(&lease_id, refusal, 0, &mut random, &mut actions);
        jitters_ms.push(state.denied_until_ms() - 100);
    }
    assert!(jitters_ms.iter().all(|jitter_ms| *jitter_ms <= 50));
    assert!(jitters_ms.contains(&0));
    assert!(jitters_ms.contains(&50));
}

#[test]
fn never_refusal_answers_never_and_asks_again_after_the_pause() {
    let mut state = BlockState::new(10);
    let mut actions = Vec::new();
    let mut random = Fixed(0);
    state.try_spend(1, 0, &mut random, &mut actions);
    let lease_id = renew_id(&actions);
    let never = LeaseAnswer::Refused { retry_after_ms: -1 };
    state.on_answer(&lease_id, never, 0, &mut random, &mut actions);
    assert_eq!(
        spend(&mut state, 1, 5).0,
        SpendOutcome::Refused { retry_after_ms: -1 }
    );
    let (outcome, actions) = spend(&mut state, 1, NEVER_REFUSAL_PAUSE_MS);
    assert_eq!(outcome, SpendOutcome::Wait);
    assert_eq!(count_renewals(&actions), 1);
}

#[test]
fn block_expires_ten_seconds_after_grant_and_gives_back_the_rest() {
    let (mut state, lease_id) = granted(10, 500);
    for _ in 0..3 {
        spend(&mut state, 1, 600);
    }
    let mut actions = Vec::new();
    state.poll(10_499, &mut actions);
    assert!(actions.is_empty(), "still live 1 ms before expiry");
    assert_eq!(state.held_tokens(), 7);
    state.poll(10_500, &mut actions);
    assert_eq!(
        actions,
        vec![BlockAction::GiveBack {
            lease_id,
            tokens: 7
        }]
    );
    assert_eq!(state.held_tokens(), 0);
    let (outcome, actions) = spend(&mut state, 1, 10_500);
    assert_eq!(outcome, SpendOutcome::Wait);
    assert_eq!(count_renewals(&actions), 1);
}

#[test]
fn agent_lifetime_shorter_than_ten_seconds_wins() {
    let mut state = BlockState::new(10);
    let mut random = Fixed(0);
    let mut actions = Vec::new();
    state.try_spend(1, 0, &mut random, &mut actions);
    let lease_id = renew_id(&actions);
    let grant = LeaseAnswer::Granted {
        tokens: 10,
        expires_in_ms: 2_000,
    };
    state.on_answer(&lease_id, grant, 3, &mut random, &mut actions);
    let mut expired = Vec::new();
    state.poll(2_000, &mut expired);
    assert_eq!(
        expired,
        vec![BlockAction::GiveBack {
            lease_id,
            tokens: 10
        }]
    );
}

#[test]
fn grant_arriving_after_its_expiry_is_given_back_whole() {
    let mut state = BlockState::new(10);
    let mut random = Fixed(0);
    let mut actions = Vec::new();
    state.try_spend(1, 0, &mut random, &mut actions);
    let lease_id = renew_id(&actions);
    actions.clear();
    let grant = LeaseAnswer::Granted {
        tokens: 10,
        expires_in_ms: 0,
    };
    state.on_answer(&lease_id, grant, 10_000, &mut random, &mut actions);
    assert_eq!(
        actions,
        vec![BlockAction::GiveBack {
            lease_id,
            tokens: 10
        }]
    );
    assert_eq!(state.held_tokens(), 0);
}

#[test]
fn renewal_arriving_while_tokens_remain_spends_the_old_block_first() {
    let (mut state, old_lease_id) = granted(10, 0);
    let mut renewals = Vec::new();
    for _ in 0..8 {
        renewals.extend(spend(&mut state, 1, 1_000).1);
    }
    let new_lease_id = renew_id(&renewals);
    let mut actions = Vec::new();
    let grant = LeaseAnswer::Granted {
        tokens: 10,
        expires_in_ms: 10_000,
    };
    state.on_answer(&new_lease_id, grant, 1_000, &mut Fixed(0), &mut actions);
    assert!(actions.is_empty());
    assert_eq!((state.blocks_held(), state.held_tokens()), (2, 12));
    spend(&mut state, 1, 1_000); // from the old block: 1 left there
    let mut expired = Vec::new();
    state.poll(10_000, &mut expired); // the old block expires with 1 left
    assert_eq!(
        expired,
        vec![BlockAction::GiveBack {
            lease_id: old_lease_id,
            tokens: 1
        }]
    );
    assert_eq!(state.held_tokens(), 10, "the new block is untouched");
}

fn answer_grant(state: &mut BlockState, lease_id: &str, tokens: u64) -> Vec<BlockAction> {
    let mut actions = Vec::new();
    let grant = LeaseAnswer::Granted {
        tokens,
        expires_in_ms: 0,
    };
    state.on_answer(lease_id, grant, 0, &mut Fixed(0), &mut actions);
    actions
}

#[test]
fn a_third_block_pushes_out_the_oldest_and_gives_back_its_rest() {
    // The agent may grant less than B (its policy changed), so two partly
    // spent blocks can be held when a third arrives.
    let mut state = BlockState::new(10);
    let first_lease_id = renew_id(&spend(&mut state, 1, 0).1);
    assert!(answer_grant(&mut state, &first_lease_id, 3).is_empty());
    let second_lease_id = renew_id(&spend(&mut state, 1, 0).1); // 2 left
    assert!(answer_grant(&mut state, &second_lease_id, 1).is_empty());
    let third_lease_id = renew_id(&spend(&mut state, 1, 0).1); // 1 + 1 left
    let given_back = answer_grant(&mut state, &third_lease_id, 10);
    assert_eq!(
        given_back,
        vec![BlockAction::GiveBack {
            lease_id: first_lease_id,
            tokens: 1
        }]
    );
    assert_eq!((state.blocks_held(), state.held_tokens()), (2, 11));
}

#[test]
fn stale_grant_is_given_back_whole() {
    let (mut state, _) = granted(10, 0);
    let mut actions = Vec::new();
    let grant = LeaseAnswer::Granted {
        tokens: 10,
        expires_in_ms: 0,
    };
    state.on_answer("not-asked", grant, 1, &mut Fixed(0), &mut actions);
    assert_eq!(
        actions,
        vec![BlockAction::GiveBack {
            lease_id: "not-asked".into(),
            tokens: 10
        }]
    );
    assert_eq!(state.held_tokens(), 10);
}

#[test]
fn failed_renewal_reuses_its_lease_id_on_the_next_ask() {
    let mut state = BlockState::new(10);
    let mut random = SplitMix64::seeded(2);
    let mut actions = Vec::new();
    state.try_spend(1, 0, &mut random, &mut actions);
    let lease_id = renew_id(&actions);
    state.on_answer(
        &lease_id,
        LeaseAnswer::Failed,
        30,
        &mut random,
        &mut actions,
    );
    assert!(!state.renewal_in_flight());
    let (outcome, actions) = spend(&mut state, 1, 40);
    assert_eq!(outcome, SpendOutcome::Wait);
    assert_eq!(renew_id(&actions), lease_id);
}

#[test]
fn refund_puts_tokens_back_into_their_block() {
    let (mut state, _) = granted(10, 0);
    let SpendOutcome::Spent(draws) = spend(&mut state, 4, 1).0 else {
        panic!("ten tokens are held");
    };
    assert_eq!(draws.tokens(), 4);
    assert_eq!(state.held_tokens(), 6);
    assert_eq!(state.refund(draws), 4);
    assert_eq!(state.held_tokens(), 10);
}

#[test]
fn cost_above_one_block_is_refused_forever_without_asking() {
    let mut state = BlockState::new(10);
    let (outcome, actions) = spend(&mut state, 11, 0);
    assert_eq!(outcome, SpendOutcome::Refused { retry_after_ms: -1 });
    assert!(actions.is_empty());
    assert!(!state.renewal_in_flight());
}

#[test]
fn close_gives_back_everything_held() {
    let (mut state, lease_id) = granted(10, 0);
    spend(&mut state, 3, 1);
    let mut actions = Vec::new();
    state.close(&mut actions);
    assert_eq!(
        actions,
        vec![BlockAction::GiveBack {
            lease_id,
            tokens: 7
        }]
    );
    assert!(state.is_idle(1));
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Step {
        Spend { cost: u64 },
        Grant { tokens: u64, expires_in_ms: i64 },
        Refuse { retry_after_ms: i64 },
        Fail,
        StaleGrant { tokens: u64 },
        Advance { delta_ms: u64 },
        Poll,
        RefundLast,
        ChangeBlockTokens { block_tokens: u64 },
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => (1u64..=14).prop_map(|cost| Step::Spend { cost }),
            2 => (1u64..=12, -1i64..=12_000)
                .prop_map(|(tokens, expires_in_ms)| Step::Grant { tokens, expires_in_ms }),
            1 => (-1i64..=2_000).prop_map(|retry_after_ms| Step::Refuse { retry_after_ms }),
            1 => Just(Step::Fail),
            1 => (1u64..=12).prop_map(|tokens| Step::StaleGrant { tokens }),
            2 => (0u64..=4_000).prop_map(|delta_ms| Step::Advance { delta_ms }),
            1 => Just(Step::Poll),
            1 => Just(Step::RefundLast),
            1 => (1u64..=12).prop_map(|block_tokens| Step::ChangeBlockTokens { block_tokens }),
        ]
    }

    /// What the agent's side of the conversation has seen.
    #[derive(Default)]
    struct Ledger {
        granted_tokens: u64,
        spent_tokens: u64,
        given_back_tokens: u64,
        outstanding: Option<String>,
        last_draws: Option<Draws>,
    }

    impl Ledger {
        fn absorb(&mut self, actions: Vec<BlockAction>) -> Result<(), TestCaseError> {
            for action in actions {
                match action {
                    BlockAction::Renew { lease_id } => {
                        prop_assert!(
                            self.outstanding.is_none(),
                            "a second renewal while {:?} is in flight",
                            self.outstanding
                        );
                        self.outstanding = Some(lease_id);
                    }
                    BlockAction::GiveBack { tokens, .. } => self.given_back_tokens += tokens,
                }
            }
            Ok(())
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn never_spends_more_than_granted_and_one_renewal_in_flight(
            block_tokens in 1u64..=12,
            seed in any::<u64>(),
            steps in proptest::collection::vec(step(), 1..200),
        ) {
            let mut state = BlockState::new(block_tokens);
            let mut random = SplitMix64::seeded(seed);
            let mut ledger = Ledger::default();
            let mut now_ms = 0u64;
            for step in steps {
                let mut actions = Vec::new();
                match step {
                    Step::Spend { cost } => {
                        match state.try_spend(cost, now_ms, &mut random, &mut actions) {
                            SpendOutcome::Spent(draws) => {
                                prop_assert_eq!(draws.tokens(), cost);
                                ledger.spent_tokens += cost;
                                ledger.last_draws = Some(draws);
                            }
                            SpendOutcome::Wait => {
                                prop_assert!(state.renewal_in_flight());
                            }
                            SpendOutcome::Refused { retry_after_ms } => {
                                prop_assert!(retry_after_ms == -1 || retry_after_ms > 0);
                            }
                        }
                    }
                    Step::Grant { tokens, expires_in_ms } => {
                        if let Some(lease_id) = ledger.outstanding.take() {
                            ledger.granted_tokens += tokens;
                            let answer = LeaseAnswer::Granted { tokens, expires_in_ms };
                            state.on_answer(&lease_id, answer, now_ms, &mut random, &mut actions);
                        }
                    }
                    Step::Refuse { retry_after_ms } => {
                        if let Some(lease_id) = ledger.outstanding.take() {
                            let answer = LeaseAnswer::Refused { retry_after_ms };
                            state.on_answer(&lease_id, answer, now_ms, &mut random, &mut actions);
                        }
                    }
                    Step::Fail => {
                        if let Some(lease_id) = ledger.outstanding.take() {
                            state.on_answer(&lease_id, LeaseAnswer::Failed, now_ms, &mut random, &mut actions);
                        }
                    }
                    Step::StaleGrant { tokens } => {
                        ledger.granted_tokens += tokens;
                        let answer = LeaseAnswer::Granted { tokens, expires_in_ms: 0 };
                        state.on_answer("stale", answer, now_ms, &mut random, &mut actions);
                    }
                    Step::Advance { delta_ms } => now_ms += delta_ms,
                    Step::Poll => state.poll(now_ms, &mut actions),
                    Step::RefundLast => {
                        if let Some(draws) = ledger.last_draws.take() {
                            ledger.spent_tokens -= state.refund(draws);
                        }
                    }
                    Step::ChangeBlockTokens { block_tokens } => state.set_block_tokens(block_tokens),
                }
                ledger.absorb(actions)?;
                prop_assert_eq!(state.renewal_in_flight(), ledger.outstanding.is_some());
                prop_assert!(state.blocks_held() <= HELD_BLOCKS_MAX);
                prop_assert!(ledger.spent_tokens <= ledger.granted_tokens);
                // Conservation: nothing granted is lost or counted twice.
                prop_assert_eq!(
                    ledger.spent_tokens + ledger.given_back_tokens + state.held_tokens(),
                    ledger.granted_tokens,
                    "spent + given back + held != granted"
                );
            }
            let mut actions = Vec::new();
            state.close(&mut actions);
            ledger.outstanding = None;
            ledger.absorb(actions)?;
            prop_assert!(ledger.spent_tokens + ledger.given_back_tokens <= ledger.granted_tokens);
        }
    }
}
