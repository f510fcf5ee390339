//! The lease list's pure parts, and its scan on the in-memory store.

use std::sync::atomic::{AtomicI64, AtomicU64};
use std::sync::Arc;

use super::*;
use crate::key::KeyBuilder;
use crate::store::memory::{Clock, MemoryStore};
use crate::store::scan::ScanStop;
use crate::store::script::{ScriptCall, ScriptKind};
use crate::store::BucketStore;

fn keys() -> KeyBuilder {
    KeyBuilder::new(b"0123456789abcdef-test-pepper").unwrap()
}

fn record_key(tag: &str, bucket: &str, lease_id: &str) -> String {
    keys()
        .lease(&Tenant::parse(tag).unwrap(), bucket, lease_id)
        .unwrap()
}

#[test]
fn a_record_key_splits_into_tag_bucket_and_lease_id() {
    let key = record_key("g-api", "lh:v1:{g-api}:p-hot:_", "gw-7:1.2_3");
    let parsed = parse_record_key(&key).unwrap();
    assert_eq!(parsed.tag, "g-api");
    assert_eq!(parsed.bucket.len(), 16);
    assert_eq!(parsed.lease_id, "gw-7:1.2_3");
    assert!(crate::store::scan::glob_matches(LEASE_RECORD_MATCH, &key));
    for other in [
        "lh:v1:{atlas}:_lease:0123456789abcdeg:l-1",
        "lh:v1:{atlas}:_lease:0123456789abcde:l-1",
        "lh:v1:{Atlas}:_lease:0123456789abcdef:l-1",
        "lh:v1:{atlas}:_lease:0123456789abcdef:",
        "lh:v1:{atlas}:_lease:0123456789abcdef:a b",
        "lh:v1:{atlas}:_lease:0123456789abcdef",
        "lh:v1:{atlas}:p-hot:0123456789abcdef",
    ] {
        assert_eq!(parse_record_key(other), None, "{other}");
    }
}

#[test]
fn a_request_is_validated_field_by_field() {
    let ok = LeaseFilter::from_request(&pb::ListLeasesRequest {
        rule_id: "p-hot".into(),
        holder: "gateway/eu".into(),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(ok.rule_id.as_deref(), Some("p-hot"));
    assert_eq!(ok.domain, None);
    assert_eq!(ok.max_leases, MAX_LISTED_LEASES as usize);
    for (request, field) in [
        (
            pb::ListLeasesRequest {
                holder: "Gateway/EU".into(),
                ..Default::default()
            },
            "holder",
        ),
        (
            pb::ListLeasesRequest {
                rule_id: "p hot".into(),
                ..Default::default()
            },
            "rule_id",
        ),
        (
            pb::ListLeasesRequest {
                domain: "a_b".into(),
                ..Default::default()
            },
            "domain",
        ),
        (
            pb::ListLeasesRequest {
                max_leases: MAX_LISTED_LEASES + 1,
                ..Default::default()
            },
            "max_leases",
        ),
    ] {
        assert_eq!(
            LeaseFilter::from_request(&request).unwrap_err().field,
            field
        );
    }
}

fn found(key: &str, value: &str, now_ms: i64) -> ScannedRecord {
    ScannedRecord {
        key: key.into(),
        value: value.into(),
        now_ms,
    }
}

#[test]
fn only_live_unreturned_records_the_filter_names_are_listed() {
    let key = record_key("atlas", "b", "l-1");
    let filter = LeaseFilter {
        max_leases: 10,
        ..Default::default()
    };
    let unreadable = AtomicU64::new(0);
    let text = "10000,30100,100,gateway/eu,api,p-hot";
    let lease = filter
        .accept(&found(&key, text, 30_100), &unreadable)
        .unwrap();
    assert_eq!(
        (
            lease.lease_id.as_str(),
            lease.tag.as_str(),
            lease.rule_id.as_str(),
            lease.holder.as_str()
        ),
        ("l-1", "atlas", "p-hot", "gateway/eu")
    );
    assert_eq!(lease.granted_tokens, 10);
    assert_eq!(lease.granted_at_ms, 100);
    assert_eq!(
        lease.spend_until_ms,
        100 + super::super::BLOCK_EXPIRES_IN_MS
    );
    assert_eq!(lease.expires_at_ms, 30_100);
    // Past its expiry on the store's clock: gone.
    assert!(filter
        .accept(&found(&key, text, 30_101), &unreadable)
        .is_none());
    // Given back: gone, unless asked for.
    let returned = "10000,30100,100,gateway/eu,api,p-hot,4000";
    assert!(filter
        .accept(&found(&key, returned, 0), &unreadable)
        .is_none());
    let with_returned = LeaseFilter {
        include_returned: true,
        ..filter.clone()
    };
    let lease = with_returned
        .accept(&found(&key, returned, 0), &unreadable)
        .unwrap();
    assert!(lease.returned);
    assert_eq!(lease.returned_tokens, 4);
    // Filters.
    for (other, listed) in [
        (
            LeaseFilter {
                holder: Some("anonymous".into()),
                ..filter.clone()
            },
            false,
        ),
        (
            LeaseFilter {
                rule_id: Some("p-hot".into()),
                domain: Some("api".into()),
                holder: Some("gateway/eu".into()),
                ..filter.clone()
            },
            true,
        ),
        (
            LeaseFilter {
                domain: Some("web".into()),
                ..filter.clone()
            },
            false,
        ),
    ] {
        let accepted = other.accept(&found(&key, text, 0), &unreadable);
        assert_eq!(accepted.is_some(), listed, "{other:?}");
    }
    assert_eq!(unreadable.load(Ordering::Relaxed), 0);
    // An older record: listed, naming no holder or rule.
    let older = filter
        .accept(&found(&key, "10000,30100", 0), &unreadable)
        .unwrap();
    assert_eq!((older.holder.as_str(), older.rule_id.as_str()), ("", ""));
    assert_eq!((older.granted_at_ms, older.spend_until_ms), (0, 0));
    // Not a record: counted, never listed.
    assert!(filter
        .accept(&found(&key, "garbage", 0), &unreadable)
        .is_none());
    assert!(filter
        .accept(&found("lh:v1:{atlas}:_lease:x", text, 0), &unreadable)
        .is_none());
    assert_eq!(unreadable.load(Ordering::Relaxed), 2);
}

fn listed(id: &str, rule: &str, holder: &str, expires_at_ms: i64) -> pb::ListedLease {
    pb::ListedLease {
        lease_id: id.into(),
        tag: "atlas".into(),
        bucket: "0123456789abcdef".into(),
        domain: "api".into(),
        rule_id: rule.into(),
        holder: holder.into(),
        granted_tokens: 10,
        expires_at_ms,
        ..Default::default()
    }
}

#[test]
fn leases_sort_by_rule_holder_then_expiry() {
    let mut leases = vec![
        listed("c", "p-b", "gateway/eu", 5),
        listed("b", "p-a", "gateway/eu", 9),
        listed("a", "p-a", "gateway/eu", 7),
        listed("d", "p-a", "anonymous", 99),
    ];
    sort_leases(&mut leases);
    let order: Vec<&str> = leases.iter().map(|l| l.lease_id.as_str()).collect();
    assert_eq!(order, ["d", "a", "b", "c"]);
}

#[test]
fn a_reply_keeps_only_the_leases_that_fit_the_message_size() {
    let leases: Vec<pb::ListedLease> = (0..1_000)
        .map(|i| listed(&format!("lease-{i:04}"), "p-hot", "gateway/eu", 1_000 + i))
        .collect();
    let one = leases[0].encoded_len() + 4;
    let mut response = pb::ListLeasesResponse::default();
    assert!(!fit_reply(&mut response, leases.clone(), 1 << 20));
    assert_eq!(response.leases.len(), 1_000);
    let mut response = pb::ListLeasesResponse::default();
    let room = REPLY_HEADROOM_BYTES + 10 * one;
    assert!(fit_reply(&mut response, leases, room));
    assert_eq!(response.leases.len(), 10);
    assert!(response.encoded_len() <= room);
}

/// A clock the test moves.
struct TestClock(AtomicI64);

impl Clock for TestClock {
    fn now_ms(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

fn lease_call(bucket: &str, record: &str, holder: &str, rule: &str) -> ScriptCall {
    ScriptCall::new(ScriptKind::LeaseBlock)
        .key(bucket)
        .key(record)
        .arg(1_000_000)
        .arg(1)
        .arg(1_000)
        .arg(10_000)
        .arg(1)
        .arg(0)
        .arg(super::super::LEASE_RECORD_TTL_MS)
        .arg(holder)
        .arg("api")
        .arg(rule)
}

fn scan_request(max_kept: usize, max_calls: usize, keys_per_call: usize) -> ScanRequest<'static> {
    ScanRequest {
        pattern: LEASE_RECORD_MATCH,
        max_kept,
        max_calls_per_shard: max_calls,
        keys_per_call,
        deadline: tokio::time::Instant::now() + std::time::Duration::from_secs(60),
    }
}

#[tokio::test]
async fn the_memory_store_lists_live_records_in_bounded_chunks() {
    let clock = Arc::new(TestClock(AtomicI64::new(1_000)));
    let store = MemoryStore::new(clock.clone());
    let bucket = "lh:v1:{atlas}:p-hot:_";
    for i in 0..25 {
        let record = record_key("atlas", bucket, &format!("l-{i}"));
        store
            .run_at(
                &lease_call(bucket, &record, "gateway/eu", "p-hot"),
                1_000 + i,
            )
            .unwrap();
    }
    // A bucket hash and a string that is no record: never kept.
    store.with_keyspace(|s| s.set("lh:v1:{atlas}:other", "x".into(), Some(60_000), 0));
    let filter = LeaseFilter {
        max_leases: 100,
        ..Default::default()
    };
    let unreadable = AtomicU64::new(0);
    let keep = |r: &ScannedRecord| filter.accept(r, &unreadable).is_some();
    // Chunks of 4 index entries: 25 records and 2 other keys take 7.
    let all = store
        .scan_strings(&scan_request(100, 10, 4), &keep)
        .await
        .unwrap();
    assert_eq!(all.kept.len(), 25);
    assert!(all.stopped.is_empty(), "{:?}", all.stopped);
    // Three chunks only: truncated by the call budget.
    let few = store
        .scan_strings(&scan_request(100, 3, 4), &keep)
        .await
        .unwrap();
    assert!(few.kept.len() < 25);
    assert_eq!(few.stopped, vec![ScanStop::MaxCalls]);
    // At most 10 kept: truncated by the record budget.
    let capped = store
        .scan_strings(&scan_request(10, 100, 4), &keep)
        .await
        .unwrap();
    assert_eq!(capped.kept.len(), 10);
    assert_eq!(capped.stopped, vec![ScanStop::MaxKept]);
    // Exactly as many as the cap: not truncated.
    let exact = store
        .scan_strings(&scan_request(25, 100, 4), &keep)
        .await
        .unwrap();
    assert_eq!((exact.kept.len(), exact.stopped.len()), (25, 0));
    // Once the store's clock is past the records' expiry: nothing listed.
    clock.0.store(
        1_025 + super::super::LEASE_RECORD_TTL_MS as i64,
        Ordering::Relaxed,
    );
    let later = store
        .scan_strings(&scan_request(100, 100, 4), &keep)
        .await
        .unwrap();
    assert!(later.kept.is_empty());
}
