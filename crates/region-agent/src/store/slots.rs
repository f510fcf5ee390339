//! Redis Cluster's key → slot → primary routing, pure.
//!
//! A key's slot is CRC16 (XMODEM) of its hash tag modulo 16,384, as Redis
//! computes it; the [`SlotMap`] says which primary serves each slot, read
//! from `CLUSTER SLOTS` ([`SlotMap::from_cluster_slots`]) and patched by a
//! MOVED reply ([`SlotMap::moved`]). [`Redirect::parse`] reads the cluster
//! refusals a node answers instead of running a script (MOVED, ASK,
//! TRYAGAIN, CLUSTERDOWN, READONLY, CROSSSLOT, MASTERDOWN): each means the
//! script did not run, so sending it again is safe.
//!
//! Limits: a map names at most [`MAX_PRIMARIES`] primaries; a `CLUSTER
//! SLOTS` reply naming more is refused (the old map stays in force).

use std::collections::BTreeMap;

use redis::Value;

use crate::store::script::ScriptCall;

/// Redis Cluster's slot count.
pub const SLOT_COUNT: u16 = 16_384;

/// Most primaries one map names (Redis recommends at most 1,000 nodes; a
/// Region's data plane is sized in tens).
pub const MAX_PRIMARIES: usize = 256;

/// The part of a key Redis Cluster hashes: the text between the first `{`
/// and the first `}` after it when not empty, else the whole key.
pub fn hash_tag(key: &str) -> &str {
    if let Some(open) = key.find('{') {
        if let Some(len) = key[open + 1..].find('}') {
            if len > 0 {
                return &key[open + 1..open + 1 + len];
            }
        }
    }
    key
}

/// The slot Redis Cluster assigns `key`.
pub fn slot_of_key(key: &str) -> u16 {
    crc16::State::<crc16::XMODEM>::calculate(hash_tag(key).as_bytes()) % SLOT_COUNT
}

/// The slot a call runs on: its first key's (every key of one call shares a
/// hash tag, §3.2); None for a call without keys (any primary may run it).
pub fn slot_of_call(call: &ScriptCall) -> Option<u16> {
    call.keys.first().map(|key| slot_of_key(key))
}

/// A primary as `CLUSTER SLOTS` names it: its preferred endpoint and port.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeAddress {
    pub host: String,
    pub port: u16,
}

impl NodeAddress {
    /// `host:port`, with an IPv6 host in brackets.
    pub fn host_port(&self) -> String {
        match self.host.contains(':') {
            true => format!("[{}]:{}", self.host, self.port),
            false => format!("{}:{}", self.host, self.port),
        }
    }

    /// Parses `host:port` (as in a MOVED reply), `[v6]:port` included.
    pub fn parse(text: &str) -> Option<NodeAddress> {
        let (host, port) = text.rsplit_once(':')?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let port = port.parse().ok()?;
        (!host.is_empty()).then(|| NodeAddress {
            host: host.to_string(),
            port,
        })
    }
}

impl std::fmt::Display for NodeAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.host_port())
    }
}

/// A refusal a cluster node answers instead of running the script.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Redirect {
    /// The slot lives on another primary now: ask it.
    #[error("MOVED: slot {slot} is served by another primary")]
    Moved { slot: u16, to: NodeAddress },
    /// The slot is being migrated and the keys are on the target already:
    /// ask it once, after ASKING.
    #[error("ASK: slot {slot} is migrating")]
    Ask { slot: u16, to: NodeAddress },
    /// A multi-key call whose keys are split by a migration in progress.
    #[error("TRYAGAIN: the slot is migrating")]
    TryAgain,
    /// The node serves no such slot now (failover under way).
    #[error("CLUSTERDOWN")]
    ClusterDown,
    /// A write sent to a node that is a replica now (it was demoted).
    #[error("READONLY: the node is a replica")]
    ReadOnly,
    /// The primary of the slot is down (a replica asked to serve it).
    #[error("MASTERDOWN")]
    MasterDown,
    /// The call's keys hash to different slots (never sent by the agent:
    /// policies keep one request's keys on one tag).
    #[error("CROSSSLOT")]
    CrossSlot,
}

impl Redirect {
    /// A server error's code and details (`MOVED 3999 127.0.0.1:6381`) as a
    /// redirect; None when it is not a cluster refusal or is malformed.
    pub fn parse(code: &str, details: &str) -> Option<Redirect> {
        let target = || {
            let mut words = details.split_whitespace();
            let slot = words.next()?.parse::<u16>().ok()?;
            let to = NodeAddress::parse(words.next()?)?;
            (slot < SLOT_COUNT).then_some((slot, to))
        };
        match code {
            "MOVED" => target().map(|(slot, to)| Redirect::Moved { slot, to }),
            "ASK" => target().map(|(slot, to)| Redirect::Ask { slot, to }),
            "TRYAGAIN" => Some(Redirect::TryAgain),
            "CLUSTERDOWN" => Some(Redirect::ClusterDown),
            "READONLY" => Some(Redirect::ReadOnly),
            "MASTERDOWN" => Some(Redirect::MasterDown),
            "CROSSSLOT" => Some(Redirect::CrossSlot),
            _ => None,
        }
    }

    /// The label of this kind in metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Redirect::Moved { .. } => "moved",
            Redirect::Ask { .. } => "ask",
            Redirect::TryAgain => "tryagain",
            Redirect::ClusterDown => "clusterdown",
            Redirect::ReadOnly => "readonly",
            Redirect::MasterDown => "masterdown",
            Redirect::CrossSlot => "crossslot",
        }
    }
}

/// Why a `CLUSTER SLOTS` reply was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SlotMapError {
    #[error("CLUSTER SLOTS reply is not an array of slot ranges")]
    Shape,
    #[error("CLUSTER SLOTS range {start}-{end} is invalid")]
    Range { start: i64, end: i64 },
    #[error("CLUSTER SLOTS names {count} primaries, more than {MAX_PRIMARIES}")]
    TooManyPrimaries { count: usize },
}

/// Which primary serves each slot; slots no range covers have none.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SlotMap {
    /// Start slot → (end slot inclusive, primary); ranges never overlap.
    ranges: BTreeMap<u16, (u16, NodeAddress)>,
}

impl SlotMap {
    /// A map from explicit ranges (tests, and the parser below). A later
    /// range overrides the slots of an earlier one it overlaps.
    pub fn from_ranges(ranges: impl IntoIterator<Item = (u16, u16, NodeAddress)>) -> SlotMap {
        let mut map = SlotMap::default();
        for (start, end, node) in ranges {
            map.assign(start, end.min(SLOT_COUNT - 1), node);
        }
        map
    }

    /// Reads a `CLUSTER SLOTS` reply: `[[start, end, [host, port, id, ..],
    /// replicas..], ..]`. An empty host means the node that answered
    /// (`asked`), as Redis documents; `?` hosts are skipped.
    pub fn from_cluster_slots(value: &Value, asked: &NodeAddress) -> Result<SlotMap, SlotMapError> {
        let Value::Array(entries) = value else {
            return Err(SlotMapError::Shape);
        };
        let mut ranges = Vec::with_capacity(entries.len());
        for entry in entries {
            let Value::Array(fields) = entry else {
                return Err(SlotMapError::Shape);
            };
            let (Some(start), Some(end), Some(Value::Array(primary))) =
                (fields.first(), fields.get(1), fields.get(2))
            else {
                return Err(SlotMapError::Shape);
            };
            let (start, end) = (int(start)?, int(end)?);
            if !(0..i64::from(SLOT_COUNT)).contains(&start)
                || !(start..i64::from(SLOT_COUNT)).contains(&end)
            {
                return Err(SlotMapError::Range { start, end });
            }
            let host = match primary.first().map(text) {
                Some(Some(host)) if host.is_empty() => asked.host.clone(),
                Some(Some(host)) if host == "?" => continue,
                Some(Some(host)) => host,
                _ => return Err(SlotMapError::Shape),
            };
            let port = primary
                .get(1)
                .map(int)
                .transpose()?
                .ok_or(SlotMapError::Shape)?;
            let port = u16::try_from(port).map_err(|_| SlotMapError::Shape)?;
            // Proven in range by the checks above.
            ranges.push((start as u16, end as u16, NodeAddress { host, port }));
        }
        let map = SlotMap::from_ranges(ranges);
        let count = map.primaries().len();
        if count > MAX_PRIMARIES {
            return Err(SlotMapError::TooManyPrimaries { count });
        }
        Ok(map)
    }

    /// The primary serving `slot`, if any.
    pub fn owner(&self, slot: u16) -> Option<&NodeAddress> {
        let (_, (end, node)) = self.ranges.range(..=slot).next_back()?;
        (slot <= *end).then_some(node)
    }

    /// A MOVED reply's news: `slot` is served by `to` from now on.
    pub fn moved(&mut self, slot: u16, to: NodeAddress) {
        if slot < SLOT_COUNT && self.owner(slot) != Some(&to) {
            self.assign(slot, slot, to);
        }
    }

    /// Every primary the map names, once each, in address order.
    pub fn primaries(&self) -> Vec<NodeAddress> {
        let mut nodes: Vec<NodeAddress> =
            self.ranges.values().map(|(_, node)| node.clone()).collect();
        nodes.sort();
        nodes.dedup();
        nodes
    }

    /// Slots each primary serves (for the share of keys per primary).
    pub fn slots_per_primary(&self) -> BTreeMap<NodeAddress, u32> {
        let mut counts = BTreeMap::new();
        for (start, (end, node)) in &self.ranges {
            *counts.entry(node.clone()).or_insert(0) += u32::from(end - start) + 1;
        }
        counts
    }

    /// True when no range is known (before the first refresh).
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// The first slot of every range, in slot order.
    pub fn range_starts(&self) -> Vec<u16> {
        self.ranges.keys().copied().collect()
    }

    /// Slots no primary serves.
    pub fn uncovered_slots(&self) -> u32 {
        u32::from(SLOT_COUNT) - self.slots_per_primary().values().sum::<u32>()
    }

    /// Sets `start..=end` to `node`, splitting the ranges it cuts.
    fn assign(&mut self, start: u16, end: u16, node: NodeAddress) {
        if start > end {
            return;
        }
        // The range that starts before `start` and reaches into it.
        if let Some((&s, (e, n))) = self.ranges.range(..start).next_back() {
            let (e, n) = (*e, n.clone());
            if e >= start {
                self.ranges.insert(s, (start - 1, n.clone()));
                if e > end {
                    self.ranges.insert(end + 1, (e, n));
                }
            }
        }
        // Ranges that start inside `start..=end`: cut or drop them.
        let inside: Vec<u16> = self.ranges.range(start..=end).map(|(&s, _)| s).collect();
        for s in inside {
            if let Some((e, n)) = self.ranges.remove(&s) {
                if e > end {
                    self.ranges.insert(end + 1, (e, n));
                }
            }
        }
        self.ranges.insert(start, (end, node));
        debug_assert!(
            self.ranges_are_disjoint(),
            "slot ranges overlap after assign"
        );
    }

    fn ranges_are_disjoint(&self) -> bool {
        let mut next_free = 0u32;
        self.ranges.iter().all(|(&s, &(e, _))| {
            let ok = u32::from(s) >= next_free && e >= s;
            next_free = u32::from(e) + 1;
            ok
        })
    }
}

fn int(value: &Value) -> Result<i64, SlotMapError> {
    match value {
        Value::Int(i) => Ok(*i),
        _ => Err(SlotMapError::Shape),
    }
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn node(port: u16) -> NodeAddress {
        NodeAddress {
            host: "127.0.0.1".into(),
            port,
        }
    }

    #[test]
    fn slots_follow_redis_cluster_crc16() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(slot_of_key("123456789"), 12_739);
        assert_eq!(slot_of_key("foo"), 12_182);
        assert_eq!(slot_of_key("{user1000}.following"), slot_of_key("user1000"));
        assert_eq!(slot_of_key("lh:v1:{atlas}:r:p"), slot_of_key("atlas"));
        assert_eq!(
            slot_of_key("a{}b"),
            slot_of_key("a{}b"),
            "empty tag: whole key"
        );
    }

    #[test]
    fn hash_tag_follows_redis_cluster() {
        assert_eq!(hash_tag("lh:v1:{atlas}:r:p"), "atlas");
        assert_eq!(hash_tag("a{}b{c}"), "a{}b{c}", "empty first tag: whole key");
        assert_eq!(hash_tag("a{b"), "a{b");
        assert_eq!(hash_tag("{x}{y}"), "x");
    }

    #[test]
    fn redirects_are_read_from_server_errors() {
        assert_eq!(
            Redirect::parse("MOVED", "3999 127.0.0.1:6381"),
            Some(Redirect::Moved {
                slot: 3999,
                to: node(6381)
            })
        );
        assert_eq!(
            Redirect::parse("ASK", "1 [::1]:7000"),
            Some(Redirect::Ask {
                slot: 1,
                to: NodeAddress {
                    host: "::1".into(),
                    port: 7000
                }
            })
        );
        assert_eq!(
            Redirect::parse("MOVED", "99999 h:1"),
            None,
            "slot out of range"
        );
        assert_eq!(Redirect::parse("MOVED", "12"), None, "no address");
        assert_eq!(
            Redirect::parse("TRYAGAIN", "Multiple keys"),
            Some(Redirect::TryAgain)
        );
        assert_eq!(Redirect::parse("ERR", "leasehold: limit invalid"), None);
    }

    #[test]
    fn cluster_slots_reply_becomes_a_map() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let range = |start: i64, end: i64, host: &str, port: i64| {
            Value::Array(vec![
                Value::Int(start),
                Value::Int(end),
                Value::Array(vec![bulk(host), Value::Int(port), bulk("id")]),
                Value::Array(vec![bulk("127.0.0.2"), Value::Int(9), bulk("replica")]),
            ])
        };
        let reply = Value::Array(vec![
            range(0, 5460, "127.0.0.1", 7000),
            range(5461, 10922, "", 7001),
            range(10923, 16383, "127.0.0.1", 7002),
        ]);
        let asked = NodeAddress {
            host: "10.1.1.1".into(),
            port: 1,
        };
        let map = SlotMap::from_cluster_slots(&reply, &asked).unwrap();
        assert_eq!(map.owner(0), Some(&node(7000)));
        assert_eq!(map.owner(5460), Some(&node(7000)));
        assert_eq!(
            map.owner(5461).unwrap().host,
            "10.1.1.1",
            "empty host: the node asked"
        );
        assert_eq!(map.owner(16383), Some(&node(7002)));
        assert_eq!(map.uncovered_slots(), 0);
        assert_eq!(map.primaries().len(), 3);

        let bad = Value::Array(vec![range(10, 5, "h", 1)]);
        assert_eq!(
            SlotMap::from_cluster_slots(&bad, &asked),
            Err(SlotMapError::Range { start: 10, end: 5 })
        );
        assert_eq!(
            SlotMap::from_cluster_slots(&Value::Int(1), &asked),
            Err(SlotMapError::Shape)
        );
    }

    #[test]
    fn moved_reassigns_one_slot_and_keeps_the_rest() {
        let mut map = SlotMap::from_ranges([(0, 16383, node(1))]);
        map.moved(100, node(2));
        assert_eq!(map.owner(99), Some(&node(1)));
        assert_eq!(map.owner(100), Some(&node(2)));
        assert_eq!(map.owner(101), Some(&node(1)));
        assert_eq!(map.slots_per_primary()[&node(2)], 1);
        assert_eq!(map.uncovered_slots(), 0);
    }

    proptest! {
        /// After any sequence of assignments, every slot has the owner the
        /// last assignment covering it gave (a plain array as the model),
        /// and the ranges never overlap.
        #[test]
        fn assignments_agree_with_a_plain_array(
            steps in prop::collection::vec((0u16..16384, 0u16..400, 1u16..6), 1..40)
        ) {
            let mut model: Vec<Option<u16>> = vec![None; usize::from(SLOT_COUNT)];
            let mut map = SlotMap::default();
            for (start, len, port) in steps {
                let end = start.saturating_add(len).min(SLOT_COUNT - 1);
                map.assign(start, end, node(port));
                for slot in start..=end {
                    model[usize::from(slot)] = Some(port);
                }
                prop_assert!(map.ranges_are_disjoint());
            }
            for slot in 0..SLOT_COUNT {
                prop_assert_eq!(map.owner(slot).map(|n| n.port), model[usize::from(slot)]);
            }
            let covered = model.iter().filter(|o| o.is_some()).count() as u32;
            prop_assert_eq!(u32::from(SLOT_COUNT) - map.uncovered_slots(), covered);
        }
    }
}
