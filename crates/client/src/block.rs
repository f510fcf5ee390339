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
#[path = "block_tests.rs"]
mod tests;
