//! Tests of `client.rs`, kept beside it so the code reads on its own.

use prost::Message;

use super::*;

fn not_leader(leader_id: u64, leader_address: &str) -> Status {
    let detail = pb::ErrorDetail {
        code: pb::ErrorCode::NotLeader as i32,
        leader_id,
        leader_address: leader_address.to_string(),
        ..Default::default()
    };
    Status::with_details(
        Code::FailedPrecondition,
        "not the leader",
        detail.encode_to_vec().into(),
    )
}

#[test]
fn a_pinned_client_follows_a_hint_pinned_to_the_leader_id_only() {
    let hint = not_leader(2, "127.0.0.1:7302");
    assert!(matches!(
        classify(&hint, true),
        Some(Next::Redirect(target)) if target == "node/2@127.0.0.1:7302"
    ));
    assert!(matches!(
        classify(&hint, false),
        Some(Next::Redirect(target)) if target == "127.0.0.1:7302"
    ));
    // No leader id: a pinned client does not follow the address.
    let anonymous = not_leader(0, "127.0.0.1:7302");
    assert!(matches!(classify(&anonymous, true), Some(Next::Retry(_))));
    assert!(matches!(
        classify(&anonymous, false),
        Some(Next::Redirect(_))
    ));
}
