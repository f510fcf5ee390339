//! Which node a client tries next: the pure core of leader following.
//!
//! A [`Follower`] keeps the leader hint and a list of *suspects*: nodes that
//! let an attempt run out its deadline (hung, partitioned, SIGSTOPped). A
//! suspect is passed over for a while, 500 ms doubling to 4 s while it keeps
//! timing out, and forgiven by its first answer. The hint is preferred while
//! it is not a suspect, so a hung leader that the followers still name (they
//! have not yet timed out its heartbeats) is not retried in a loop.
//!
//! Time is an argument (tokio's [`Instant`], simulated under turmoil).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use tokio::time::Instant;

/// First pause over a node that timed out.
pub const SUSPECT_FIRST: Duration = Duration::from_millis(500);
/// Longest pause over a node that keeps timing out.
pub const SUSPECT_MAX: Duration = Duration::from_secs(4);

#[derive(Clone, Copy, Debug)]
struct Suspect {
    until: Instant,
    pause: Duration,
}

/// Leader hint, rotation over the configured nodes and suspects.
#[derive(Debug)]
pub struct Follower {
    addresses: Vec<String>,
    rotation: usize,
    leader: Option<String>,
    // Bounded: only addresses the client knows (configured or learned,
    // capped by the client at `MAX_ADDRESSES`) are ever inserted.
    suspects: HashMap<String, Suspect>,
    // Nodes whose latest attempt failed without an answer (broken
    // connection or time-out); bounded like `suspects`.
    silent: HashSet<String>,
}

impl Follower {
    /// `addresses` is non-empty (checked by the client).
    pub fn new(addresses: Vec<String>) -> Self {
        Follower {
            addresses,
            rotation: 0,
            leader: None,
            suspects: HashMap::new(),
            silent: HashSet::new(),
        }
    }

    pub fn leader(&self) -> Option<&str> {
        self.leader.as_deref()
    }

    pub fn is_suspect(&self, address: &str, now: Instant) -> bool {
        self.suspects.get(address).is_some_and(|s| s.until > now)
    }

    /// The node to try next, never one of `busy` (attempts in flight) when
    /// another exists: the leader hint unless it is a suspect, else the
    /// next configured node in turn that is not a suspect, else (all are
    /// suspects) the one whose pause ends first.
    pub fn next(&mut self, now: Instant, busy: &[String]) -> String {
        if let Some(leader) = &self.leader {
            if !self.is_suspect(leader, now) && !busy.contains(leader) {
                return leader.clone();
            }
        }
        let count = self.addresses.len();
        for _ in 0..count {
            let candidate = &self.addresses[self.rotation % count];
            self.rotation = self.rotation.wrapping_add(1);
            if !self.is_suspect(candidate, now) && !busy.contains(candidate) {
                return candidate.clone();
            }
        }
        // Everyone is a suspect or busy: the least recently suspected idle
        // node, else any.
        let idle = self.addresses.iter().filter(|a| !busy.contains(a));
        let soonest = idle.min_by_key(|a| self.suspects.get(*a).map(|s| s.until));
        match soonest {
            Some(address) => address.clone(),
            None => {
                let address = self.addresses[self.rotation % count].clone();
                self.rotation = self.rotation.wrapping_add(1);
                address
            }
        }
    }

    /// `address` answered (anything, a refusal included): it is alive.
    pub fn on_answer(&mut self, address: &str) {
        self.suspects.remove(address);
        self.silent.remove(address);
    }

    /// True when the latest attempt on every configured node failed
    /// without an answer: nothing of the cluster is reachable now.
    pub fn all_silent(&self) -> bool {
        self.addresses.iter().all(|a| self.silent.contains(a))
    }

    /// `address` answered the call itself: it is the leader.
    pub fn on_leader(&mut self, address: &str) {
        self.on_answer(address);
        self.leader = Some(address.to_string());
    }

    /// A node named `leader` as the leader. Returns whether to go there
    /// now: not when it is a suspect (a follower still naming a hung
    /// leader) or the node that said so (a node pointing at itself).
    pub fn on_redirect(&mut self, from: &str, leader: &str, now: Instant) -> bool {
        self.on_answer(from);
        if self.is_suspect(leader, now) {
            return false;
        }
        self.leader = Some(leader.to_string());
        leader != from
    }

    /// `address` answered that it cannot serve now (no leader yet, or a
    /// proposal unconfirmed): forget it as the leader, but it is alive.
    pub fn on_unavailable(&mut self, address: &str) {
        self.on_answer(address);
        if self.leader.as_deref() == Some(address) {
            self.leader = None;
        }
    }

    /// An attempt on `address` ran out its deadline (or a faster node
    /// answered first): pass it over for a while, longer each time.
    pub fn on_slow(&mut self, address: &str, now: Instant) {
        let pause = match self.suspects.get(address) {
            Some(s) => (s.pause * 2).min(SUSPECT_MAX),
            None => SUSPECT_FIRST,
        };
        self.suspects.insert(
            address.to_string(),
            Suspect {
                until: now + pause,
                pause,
            },
        );
        self.silent.insert(address.to_string());
        if self.leader.as_deref() == Some(address) {
            self.leader = None;
        }
    }

    /// A connection to `address` broke: like a time-out, but the leader
    /// hint is dropped only (no pause: a restarted node answers at once).
    pub fn on_broken(&mut self, address: &str) {
        self.silent.insert(address.to_string());
        if self.leader.as_deref() == Some(address) {
            self.leader = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes() -> Follower {
        Follower::new(vec!["a".into(), "b".into(), "c".into()])
    }

    #[test]
    fn the_leader_hint_is_preferred() {
        let mut f = nodes();
        let now = Instant::now();
        f.on_leader("b");
        assert_eq!(f.next(now, &[]), "b");
        assert_eq!(f.next(now, &[]), "b");
    }

    #[test]
    fn a_node_that_timed_out_is_passed_over_and_redirects_to_it_ignored() {
        let mut f = nodes();
        let now = Instant::now();
        f.on_leader("a");
        f.on_slow("a", now);
        assert_ne!(f.next(now, &[]), "a");
        // A follower that has not yet noticed still names the hung node.
        assert!(!f.on_redirect("b", "a", now));
        assert!(f.leader().is_none());
        for _ in 0..10 {
            assert_ne!(f.next(now, &[]), "a");
        }
        // After the pause it may be tried again.
        assert!(!f.is_suspect("a", now + SUSPECT_FIRST));
    }

    #[test]
    fn the_pause_doubles_up_to_the_cap_and_an_answer_forgives() {
        let mut f = nodes();
        let mut now = Instant::now();
        let mut pauses = Vec::new();
        for _ in 0..6 {
            f.on_slow("a", now);
            let mut p = Duration::ZERO;
            while f.is_suspect("a", now + p) {
                p += Duration::from_millis(100);
            }
            pauses.push(p);
            now += p;
        }
        assert_eq!(pauses[0], SUSPECT_FIRST);
        assert_eq!(pauses[1], SUSPECT_FIRST * 2);
        assert_eq!(*pauses.last().unwrap_or(&Duration::ZERO), SUSPECT_MAX);
        f.on_slow("a", now);
        f.on_answer("a");
        assert!(!f.is_suspect("a", now));
    }

    #[test]
    fn busy_nodes_are_not_chosen_while_another_exists() {
        let mut f = nodes();
        let now = Instant::now();
        f.on_leader("a");
        let busy = vec!["a".to_string()];
        for _ in 0..6 {
            assert_ne!(f.next(now, &busy), "a");
        }
    }

    #[test]
    fn when_all_are_suspects_the_one_pardoned_first_is_tried() {
        let mut f = nodes();
        let now = Instant::now();
        f.on_slow("b", now);
        f.on_slow("c", now + Duration::from_millis(10));
        f.on_slow("a", now + Duration::from_millis(20));
        assert_eq!(f.next(now + Duration::from_millis(30), &[]), "b");
    }

    #[test]
    fn all_silent_only_when_every_node_failed_without_an_answer() {
        let mut f = nodes();
        let now = Instant::now();
        f.on_broken("a");
        f.on_slow("b", now);
        assert!(!f.all_silent());
        f.on_broken("c");
        assert!(f.all_silent());
        f.on_unavailable("b");
        assert!(!f.all_silent());
    }

    #[test]
    fn a_redirect_to_itself_pauses() {
        let mut f = nodes();
        let now = Instant::now();
        assert!(!f.on_redirect("a", "a", now));
        assert!(f.on_redirect("a", "b", now));
        assert_eq!(f.next(now, &[]), "b");
    }
}
