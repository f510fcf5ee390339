//! Free loopback ports for tests that start `leasehold dev` on shifted
//! ports (`--port-offset`): an offset whose every port is free now and
//! below the kernel's ephemeral range.

use std::hash::{BuildHasher, Hasher};
use std::net::TcpListener;

/// The lowest offset [`free_offset`] picks.
const LOWEST_OFFSET: u16 = 1_000;
/// Above every default port (7101..=7399) with some room to spare.
const PORT_ROOM: u16 = 7_400;

pub fn port_is_free(port: u16) -> bool {
    TcpListener::bind(("127.0.0.1", port)).is_ok()
}

/// The low end of Linux's ephemeral port range: the kernel hands ports from
/// there on to outgoing connections (ours included), so a listener port
/// inside it can be taken between the free check and the bind.
fn ephemeral_low() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768) // Linux's default
}

/// A random offset whose ports (`ports_at(offset)`) are all free now and
/// all below the ephemeral range; random so concurrent runs rarely pick the
/// same ones. Bounded: 200 tries, then a panic naming the range.
pub fn free_offset(ports_at: impl Fn(u16) -> Vec<u16>) -> u16 {
    let low = ephemeral_low();
    assert!(
        low > PORT_ROOM + LOWEST_OFFSET + 1_000,
        "ephemeral ports start at {low}: no room below them for the dev ports"
    );
    let span = low - PORT_ROOM - LOWEST_OFFSET;
    for _ in 0..200 {
        let random = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        let offset = LOWEST_OFFSET + (random % u64::from(span)) as u16;
        let ports = ports_at(offset);
        debug_assert!(ports.iter().all(|port| *port < low));
        if ports.into_iter().all(port_is_free) {
            return offset;
        }
    }
    panic!(
        "no offset in {LOWEST_OFFSET}..{} with all its ports free",
        LOWEST_OFFSET + span
    );
}
