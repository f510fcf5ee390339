//! One window's remembered chunk grants, kept per Region (§4.2, issue 27).
//!
//! A record is found by (Region, lease id): a Region's ids live in its own
//! map, so no Region can take, see or fill another's. The cap on new ids
//! is per Region, so one Region reaching it refuses only itself; the pool's
//! total is bounded by [`MAX_GRANT_RECORDS_PER_REGION`] ×
//! [`crate::region::MAX_REGIONS_PER_POOL`].
//!
//! | cap | value | at the cap |
//! |---|---|---|
//! | [`MAX_GRANT_RECORDS_PER_REGION`] | 4,096 new lease ids per Region per pool per window (what one Region could use before records were per Region) | that Region's new lease id is refused `GrantRecordsFull` (its replays still answered; other Regions unaffected); ask for bigger chunks |

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};

use crate::id::{LeaseId, RegionId};

/// Cap on distinct lease ids one Region may have recorded in one pool's
/// current window.
pub const MAX_GRANT_RECORDS_PER_REGION: usize = 4_096;

/// The answer to a `Grant`, stored and returned unchanged on replay.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrantAnswer {
    pub lease_id: String,
    /// 0 when the window is spent (then retry at `window_end_ms`).
    pub granted_millitokens: u64,
    /// `min(grant time + lease_ttl_ms, window_end_ms)`.
    pub expires_at_ms: u64,
    pub window_start_ms: u64,
    pub window_end_ms: u64,
}

/// One remembered grant: who got it and the answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrantRecord {
    pub region: RegionId,
    pub answer: GrantAnswer,
    /// The incarnation the request carried. `None` only in a record
    /// restored from a snapshot written before records kept it (then the
    /// Region alone decides).
    #[serde(default)]
    pub incarnation: Option<u64>,
}

impl GrantRecord {
    /// True when a request of this record's Region at `incarnation`
    /// replays it.
    pub fn answers(&self, incarnation: u64) -> bool {
        self.incarnation.is_none_or(|kept| kept == incarnation)
    }
}

/// One window's records, by Region then lease id.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct GrantRecords(BTreeMap<RegionId, BTreeMap<LeaseId, GrantRecord>>);

impl GrantRecords {
    /// The record `region` holds under `lease_id`.
    pub fn get(&self, region: &RegionId, lease_id: &LeaseId) -> Option<&GrantRecord> {
        self.0.get(region)?.get(lease_id)
    }

    /// How many lease ids `region` has recorded.
    pub fn count_of(&self, region: &RegionId) -> usize {
        self.0.get(region).map_or(0, BTreeMap::len)
    }

    /// The most lease ids any one Region has recorded.
    pub fn most_of_one_region(&self) -> usize {
        self.0.values().map(BTreeMap::len).max().unwrap_or(0)
    }

    /// Every record of every Region.
    pub fn len(&self) -> usize {
        self.0.values().map(BTreeMap::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.0.values().all(BTreeMap::is_empty)
    }

    /// Every record, by Region then lease id.
    pub fn iter(&self) -> impl Iterator<Item = (&LeaseId, &GrantRecord)> {
        self.0.values().flat_map(BTreeMap::iter)
    }

    /// Every record, by Region then lease id.
    pub fn values(&self) -> impl Iterator<Item = &GrantRecord> {
        self.iter().map(|(_, record)| record)
    }

    /// Records `record` under its Region and `lease_id`.
    pub fn insert(&mut self, lease_id: LeaseId, record: GrantRecord) {
        self.0
            .entry(record.region.clone())
            .or_default()
            .insert(lease_id, record);
    }

    pub fn clear(&mut self) {
        self.0.clear();
    }

    /// True when every record sits under its own Region.
    pub fn is_filed_by_region(&self) -> bool {
        self.0
            .iter()
            .all(|(region, records)| records.values().all(|record| record.region == *region))
    }
}

/// Snapshots written before records were kept per Region hold one flat map
/// of lease id → record: both shapes are read.
impl<'de> Deserialize<'de> for GrantRecords {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Shape {
            ByRegion(BTreeMap<RegionId, BTreeMap<LeaseId, GrantRecord>>),
            Flat(BTreeMap<LeaseId, GrantRecord>),
        }
        let records = match Shape::deserialize(deserializer)? {
            Shape::ByRegion(by_region) => GrantRecords(by_region),
            Shape::Flat(flat) => {
                let mut records = GrantRecords::default();
                for (lease_id, record) in flat {
                    records.insert(lease_id, record);
                }
                records
            }
        };
        if !records.is_filed_by_region() {
            return Err(serde::de::Error::custom(
                "grant record filed under another Region",
            ));
        }
        Ok(records)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(region: &str, lease_id: &str) -> GrantRecord {
        GrantRecord {
            region: RegionId::parse(region).unwrap(),
            answer: GrantAnswer {
                lease_id: lease_id.into(),
                granted_millitokens: 5,
                expires_at_ms: 10,
                window_start_ms: 0,
                window_end_ms: 10,
            },
            incarnation: Some(1),
        }
    }

    #[test]
    fn two_regions_may_hold_the_same_lease_id() {
        let mut records = GrantRecords::default();
        let id = LeaseId::parse("x:1").unwrap();
        records.insert(id.clone(), record("eu", "x:1"));
        records.insert(id.clone(), record("us", "x:1"));
        assert_eq!(records.len(), 2);
        assert_eq!(records.count_of(&RegionId::parse("eu").unwrap()), 1);
        let us = records.get(&RegionId::parse("us").unwrap(), &id).unwrap();
        assert_eq!(us.region.as_str(), "us");
    }

    #[test]
    fn the_flat_shape_of_older_snapshots_is_read_by_region() {
        let flat = serde_json::json!({
            "a:1": record("eu", "a:1"),
            "b:1": record("us", "b:1"),
        });
        let records: GrantRecords = serde_json::from_value(flat).unwrap();
        assert_eq!(records.count_of(&RegionId::parse("eu").unwrap()), 1);
        assert_eq!(records.count_of(&RegionId::parse("us").unwrap()), 1);
        let round: GrantRecords =
            serde_json::from_value(serde_json::to_value(&records).unwrap()).unwrap();
        assert_eq!(round, records);
    }

    #[test]
    fn a_record_filed_under_another_region_is_refused() {
        let forged = serde_json::json!({ "eu": { "a:1": record("us", "a:1") } });
        assert!(serde_json::from_value::<GrantRecords>(forged).is_err());
    }
}
