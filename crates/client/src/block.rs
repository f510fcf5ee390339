//! One leased rule's blocks for one bucket: a pure state machine (ARCHITECTURE §3.5).
//!
//! One state serves every target that shares the bucket (the limiter keys it
//! by the agent's bucket id), so the bounds below are per gateway and bucket.
//!
//! A gateway spends a hot rule from blocks of B tokens it leased from its
//! agent, in memory, with no agent call per request. This module decides
//! everything about those blocks and performs no I/O: time is an argument
//! (monotonic ms), randomness is injected, and what the I/O shell must do is
//! returned as [`BlockAction`]s:
//!
//! - [`BlockAction::Renew`]: send `LeaseBlock` with this lease id and report
//!   the answer with [`BlockState::on_answer`] (always: granted, refused or
//!   failed). The machine asks for a renewal when a spend leaves ≤ 20% of B
//!   held, or when a request cannot be paid from what is held; **at most one
//!   renewal is in flight** per block state.
//! - [`BlockAction::GiveBack`]: send `ReturnBlock` for these unused tokens
//!   (an expired block, a block pushed out by a newer one, a stale grant).
//!
//! Rules kept here:
//! - A refusal bars asking until `now + retry_after + jitter`, jitter drawn
//!   uniformly from 0–50 ms. A "never" refusal (retry -1) answers retry -1
//!   for [`NEVER_REFUSAL_PAUSE_MS`] and then asks again (a policy may change).
//! - A block expires [`BLOCK_LIFETIME_MS`] (10 s) after it was *asked for*
//!   (the earliest the agent can have granted it), or sooner when the agent
//!   says so; its unspent tokens are given back.
//! - **Renewal while tokens remain: the old block is spent first** (it
//!   expires first); the new one is kept beside it. At most
//!   [`HELD_BLOCKS_MAX`] blocks are held; a grant that would make a third
//!   pushes the oldest out and gives back what it had left. Blocks are not
//!   merged, so each keeps its own lease id for the give-back.
//! - Invariant: for every block, spent ≤ granted; what is given back is
//!   exactly granted − spent, once, after which the block is never spent.
//!   So Σ spent + Σ given back ≤ Σ granted.
//! - A failed (unanswered) renewal keeps its lease id for the next ask: the
//!   agent replays a known lease id, so a block granted but never received
//!   is picked up rather than stranded. A refusal retires the id.
//! - A request costing more than one block (cost > B) can never be paid from
//!   blocks and is refused with retry -1, state untouched.
//!
//! Overshoot: with unit costs a gateway holds at most B + 20% of B per rule
//! and bucket (ARCHITECTURE §3.5: fleet ≤ N × 1.2 × B). With weighted costs
//! a renewal may start with up to cost − 1 tokens held, so the bound is
//! B + max(0.2 B, cost − 1).

use crate::random::{below_or_equal, hex_id_128, RandomSource};

/// Renew when at most this percentage of B is held.
pub const RENEW_AT_PERCENT: u64 = 20;
/// A block may be spent for this long after it was asked for.
pub const BLOCK_LIFETIME_MS: u64 = 10_000;
/// The random extra wait after a refusal's retry hint, drawn from 0..=this.
pub const REFUSAL_JITTER_MS_MAX: u64 = 50;
/// After a "never" refusal, ask again after this long.
pub const NEVER_REFUSAL_PAUSE_MS: u64 = BLOCK_LIFETIME_MS;
/// Blocks held at once (the one being spent and the renewal beside it).
pub const HELD_BLOCKS_MAX: usize = 2;

/// Work for the I/O shell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlockAction {
    /// Send `LeaseBlock` with this lease id; report with [`BlockState::on_answer`].
    Renew { lease_id: String },
    /// Send `ReturnBlock` for `tokens` unused tokens of `lease_id`.
    GiveBack { lease_id: String, tokens: u64 },
}

/// The agent's answer to a renewal, as the shell saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseAnswer {
    /// `granted_tokens` > 0; `expires_in_ms` ≤ 0 means "not said".
    Granted { tokens: u64, expires_in_ms: i64 },
    /// `granted_tokens` = 0; `retry_after_ms` -1 means never.
    Refused { retry_after_ms: i64 },
    /// No answer (unreachable, deadline passed, error status).
    Failed,
}

/// Where one spend's tokens came from, so a local refund finds them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Draws {
    parts: [Option<Draw>; HELD_BLOCKS_MAX],
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Draw {
    block_sequence: u64,
    tokens: u64,
}

impl Draws {
    /// Tokens drawn in total.
    pub fn tokens(&self) -> u64 {
        self.parts.iter().flatten().map(|draw| draw.tokens).sum()
    }
}

/// The result of [`BlockState::try_spend`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpendOutcome {
    /// Paid from held blocks.
    Spent(Draws),
    /// Not enough held; a renewal is in flight: retry when it is answered.
    Wait,
    /// Not enough held and asking is barred (or the cost exceeds a block):
    /// deny, retry after this long (-1 = never).
    Refused { retry_after_ms: i64 },
}

#[derive(Debug, Clone)]
struct HeldBlock {
    sequence: u64,
    lease_id: String,
    granted_tokens: u64,
    spent_tokens: u64,
    expires_at_ms: u64,
}

impl HeldBlock {
    fn left_tokens(&self) -> u64 {
        self.granted_tokens - self.spent_tokens
    }
}

#[derive(Debug, Clone)]
struct Renewal {
    lease_id: String,
    /// When this lease id was first asked for (the earliest grant time).
    asked_at_ms: u64,
}

/// The blocks of one leased rule for one bucket.
#[derive(Debug, Clone)]
pub struct BlockState {
    block_tokens: u64,
    /// Oldest first; at most [`HELD_BLOCKS_MAX`].
    held: Vec<HeldBlock>,
    renewal: Option<Renewal>,
    /// A failed renewal's id, to reuse on the next ask.
    unanswered: Option<Renewal>,
    denied_until_ms: u64,
    refused_forever: bool,
    next_sequence: u64,
}

impl BlockState {
    /// A state holding nothing, for blocks of `block_tokens` (B ≥ 1).
    pub fn new(block_tokens: u64) -> Self {
        Self {
            block_tokens: block_tokens.max(1),
            held: Vec::with_capacity(HELD_BLOCKS_MAX + 1),
            renewal: None,
            unanswered: None,
            denied_until_ms: 0,
            refused_forever: false,
            next_sequence: 0,
        }
    }

    /// Updates B (the agent's policy may change it); 0 is read as 1.
    pub fn set_block_tokens(&mut self, block_tokens: u64) {
        self.block_tokens = block_tokens.max(1);
    }

    pub fn block_tokens(&self) -> u64 {
        self.block_tokens
    }

    /// Unspent tokens of the blocks held (expired ones included until the
    /// next call that takes `now_ms`).
    pub fn held_tokens(&self) -> u64 {
        self.held.iter().map(HeldBlock::left_tokens).sum()
    }

    pub fn blocks_held(&self) -> usize {
        self.held.len()
    }

    pub fn renewal_in_flight(&self) -> bool {
        self.renewal.is_some()
    }

    pub fn denied_until_ms(&self) -> u64 {
        self.denied_until_ms
    }

    /// True when nothing is held, nothing is asked and nothing is barred: the
    /// state can be dropped without losing anything.
    pub fn is_idle(&self, now_ms: u64) -> bool {
        self.held.is_empty() && self.renewal.is_none() && now_ms >= self.denied_until_ms
    }

    /// Pays `cost` tokens (≥ 1) from held blocks, oldest first.
    pub fn try_spend(
        &mut self,
        cost: u64,
        now_ms: u64,
        random: &mut impl RandomSource,
        actions: &mut Vec<BlockAction>,
    ) -> SpendOutcome {
        debug_assert!(cost >= 1, "a request costs at least one token");
        self.expire(now_ms, actions);
        if cost > self.block_tokens {
            return SpendOutcome::Refused { retry_after_ms: -1 };
        }
        if self.held_tokens() >= cost {
            let draws = self.draw(cost);
            if self.held_tokens().saturating_mul(100)
                <= self.block_tokens.saturating_mul(RENEW_AT_PERCENT)
            {
                self.ask_if_allowed(now_ms, random, actions);
            }
            return SpendOutcome::Spent(draws);
        }
        if self.renewal.is_some() {
            return SpendOutcome::Wait;
        }
        if now_ms < self.denied_until_ms {
            return SpendOutcome::Refused {
                retry_after_ms: self.retry_after_ms(now_ms),
            };
        }
        self.ask_if_allowed(now_ms, random, actions);
        SpendOutcome::Wait
    }

    /// Puts tokens of a spend back into the blocks they came from (a local
    /// refund when a later check denied the request). Tokens of a block no
    /// longer held are dropped: that only under-admits. Returns the tokens
    /// put back.
    pub fn refund(&mut self, draws: Draws) -> u64 {
        let mut refunded_tokens = 0;
        for draw in draws.parts.iter().flatten() {
            if let Some(block) = self
                .held
                .iter_mut()
                .find(|block| block.sequence == draw.block_sequence)
            {
                debug_assert!(draw.tokens <= block.spent_tokens);
                let back = draw.tokens.min(block.spent_tokens);
                block.spent_tokens -= back;
                refunded_tokens += back;
            }
        }
        refunded_tokens
    }

    /// Applies the answer to the renewal with `lease_id`. An answer that is
    /// not for the renewal in flight is stale: its tokens are given back.
    pub fn on_answer(
        &mut self,
        lease_id: &str,
        answer: LeaseAnswer,
        now_ms: u64,
        random: &mut impl RandomSource,
        actions: &mut Vec<BlockAction>,
    ) {
        let Some(renewal) = self.renewal.take_if(|renewal| renewal.lease_id == lease_id) else {
            if let LeaseAnswer::Granted { tokens, .. } = answer {
                give_back(actions, lease_id.to_owned(), tokens);
            }
            return;
        };
        match answer {
            LeaseAnswer::Granted { tokens: 0, .. } => {
                self.on_refused(0, now_ms, random);
            }
            LeaseAnswer::Granted {
                tokens,
                expires_in_ms,
            } => self.on_granted(renewal, tokens, expires_in_ms, now_ms, actions),
            LeaseAnswer::Refused { retry_after_ms } => {
                self.on_refused(retry_after_ms, now_ms, random);
            }
            LeaseAnswer::Failed => self.unanswered = Some(renewal),
        }
        debug_assert!(self.renewal.is_none());
    }

    /// Gives back what expired blocks had left.
    pub fn poll(&mut self, now_ms: u64, actions: &mut Vec<BlockAction>) {
        self.expire(now_ms, actions);
    }

    /// Gives back everything held (the state is being dropped). A renewal in
    /// flight is forgotten: its answer will be stale and given back.
    pub fn close(&mut self, actions: &mut Vec<BlockAction>) {
        for block in self.held.drain(..) {
            let left_tokens = block.left_tokens();
            give_back(actions, block.lease_id, left_tokens);
        }
        self.renewal = None;
        self.unanswered = None;
    }

    fn on_granted(
        &mut self,
        renewal: Renewal,
        tokens: u64,
        expires_in_ms: i64,
        now_ms: u64,
        actions: &mut Vec<BlockAction>,
    ) {
        self.denied_until_ms = 0;
        self.refused_forever = false;
        self.unanswered = None;
        let lifetime_ms = match u64::try_from(expires_in_ms) {
            Ok(agent_ms) if agent_ms > 0 => agent_ms.min(BLOCK_LIFETIME_MS),
            _ => BLOCK_LIFETIME_MS,
        };
        let expires_at_ms = renewal.asked_at_ms.saturating_add(lifetime_ms);
        if expires_at_ms <= now_ms {
            give_back(actions, renewal.lease_id, tokens);
            return;
        }
        self.next_sequence += 1;
        self.held.push(HeldBlock {
            sequence: self.next_sequence,
            lease_id: renewal.lease_id,
            granted_tokens: tokens,
            spent_tokens: 0,
            expires_at_ms,
        });
        while self.held.len() > HELD_BLOCKS_MAX {
            let oldest = self.held.remove(0);
            let left_tokens = oldest.left_tokens();
            give_back(actions, oldest.lease_id, left_tokens);
        }
    }

    fn on_refused(&mut self, retry_after_ms: i64, now_ms: u64, random: &mut impl RandomSource) {
        let jitter_ms = below_or_equal(random, REFUSAL_JITTER_MS_MAX);
        self.unanswered = None;
        self.refused_forever = retry_after_ms < 0;
        let wait_ms = u64::try_from(retry_after_ms).unwrap_or(NEVER_REFUSAL_PAUSE_MS);
        self.denied_until_ms = now_ms.saturating_add(wait_ms).saturating_add(jitter_ms);
    }

    fn retry_after_ms(&self, now_ms: u64) -> i64 {
        if self.refused_forever {
            return -1;
        }
        i64::try_from(self.denied_until_ms.saturating_sub(now_ms)).unwrap_or(i64::MAX)
    }

    /// Starts a renewal unless one is in flight or asking is barred.
    fn ask_if_allowed(
        &mut self,
        now_ms: u64,
        random: &mut impl RandomSource,
        actions: &mut Vec<BlockAction>,
    ) {
        if self.renewal.is_some() || now_ms < self.denied_until_ms {
            return;
        }
        let renewal = match self.unanswered.take() {
            Some(unanswered)
                if now_ms < unanswered.asked_at_ms.saturating_add(BLOCK_LIFETIME_MS) =>
            {
                unanswered
            }
            _ => Renewal {
                lease_id: hex_id_128(random),
                asked_at_ms: now_ms,
            },
        };
        actions.push(BlockAction::Renew {
            lease_id: renewal.lease_id.clone(),
        });
        self.renewal = Some(renewal);
    }

    fn draw(&mut self, cost: u64) -> Draws {
        let mut owed_tokens = cost;
        let mut draws = Draws::default();
        for (part, block) in draws.parts.iter_mut().zip(self.held.iter_mut()) {
            let taken_tokens = owed_tokens.min(block.left_tokens());
            if taken_tokens == 0 {
                continue;
            }
            block.spent_tokens += taken_tokens;
            debug_assert!(block.spent_tokens <= block.granted_tokens);
            owed_tokens -= taken_tokens;
            *part = Some(Draw {
                block_sequence: block.sequence,
                tokens: taken_tokens,
            });
        }
        debug_assert_eq!(owed_tokens, 0, "draw is called only when enough is held");
        draws
    }

    fn expire(&mut self, now_ms: u64, actions: &mut Vec<BlockAction>) {
        if self.held.iter().all(|block| now_ms < block.expires_at_ms) {
            return;
        }
        let (expired, live): (Vec<_>, Vec<_>) = self
            .held
            .drain(..)
            .partition(|block| now_ms >= block.expires_at_ms);
        self.held = live;
        for block in expired {
            let left_tokens = block.left_tokens();
            give_back(actions, block.lease_id, left_tokens);
        }
    }
}

fn give_back(actions: &mut Vec<BlockAction>, lease_id: String, tokens: u64) {
    if tokens > 0 {
        actions.push(BlockAction::GiveBack { lease_id, tokens });
    }
}

#[cfg(test)]
mod tests {
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
}
