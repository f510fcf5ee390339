//! Connections a TLS listener holds, per peer address and in total (issue
//! 27, finding 5): one certificate holder must not take every socket and
//! task of a listener.
//!
//! [`ConnCounter::try_open`] is asked right after `accept(2)`, before the
//! handshake; past either cap the socket is closed at once (no handshake,
//! no bytes read) and the refusal logged once per cause per interval,
//! without the address. A [`ConnSlot`] is held by the connection for its
//! whole life (the handshake included) and released when it is dropped.
//! The map of addresses is bounded by the total cap: an address is in it
//! only while it holds a connection.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

/// Why a connection was not admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum CapReached {
    #[error("the listener holds its cap of {max} connections")]
    Total { max: usize },
    #[error("the peer address holds its cap of {max} connections")]
    PerAddress { max: usize },
}

impl CapReached {
    /// A fixed cause for the rate-limited log.
    pub(crate) fn cause(&self) -> &'static str {
        match self {
            CapReached::Total { .. } => "tls.connections total cap",
            CapReached::PerAddress { .. } => "tls.connections per-address cap",
        }
    }
}

#[derive(Debug, Default)]
struct Counts {
    total: usize,
    per_address: HashMap<IpAddr, usize>,
}

/// The open connections of one listener.
#[derive(Debug)]
pub(crate) struct ConnCounter {
    max_total: usize,
    max_per_address: usize,
    counts: Mutex<Counts>,
}

impl ConnCounter {
    pub(crate) fn new(max_total: usize, max_per_address: usize) -> Arc<Self> {
        Arc::new(ConnCounter {
            max_total,
            max_per_address,
            counts: Mutex::new(Counts::default()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Counts> {
        // A poisoned lock only means a panic elsewhere mid-update; the
        // counts themselves are updated in one step.
        self.counts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A slot for one more connection from `address`, or the cap reached.
    pub(crate) fn try_open(self: &Arc<Self>, address: IpAddr) -> Result<ConnSlot, CapReached> {
        let mut counts = self.lock();
        if counts.total >= self.max_total {
            return Err(CapReached::Total {
                max: self.max_total,
            });
        }
        let held = counts.per_address.get(&address).copied().unwrap_or(0);
        if held >= self.max_per_address {
            return Err(CapReached::PerAddress {
                max: self.max_per_address,
            });
        }
        counts.per_address.insert(address, held + 1);
        counts.total += 1;
        Ok(ConnSlot {
            counter: self.clone(),
            address,
        })
    }

    /// (total, addresses) open now.
    #[cfg(test)]
    fn open(&self) -> (usize, usize) {
        let counts = self.lock();
        (counts.total, counts.per_address.len())
    }
}

/// One admitted connection; dropping it frees the slot.
#[derive(Debug)]
pub(crate) struct ConnSlot {
    counter: Arc<ConnCounter>,
    address: IpAddr,
}

impl Drop for ConnSlot {
    fn drop(&mut self) {
        let mut counts = self.counter.lock();
        counts.total = counts.total.saturating_sub(1);
        if let Some(held) = counts.per_address.get_mut(&self.address) {
            *held = held.saturating_sub(1);
            if *held == 0 {
                counts.per_address.remove(&self.address);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    #[test]
    fn each_address_and_the_total_are_capped_and_freed_on_drop() {
        let counter = ConnCounter::new(5, 2);
        let a1 = counter.try_open(ip(1)).unwrap();
        let _a2 = counter.try_open(ip(1)).unwrap();
        assert_eq!(
            counter.try_open(ip(1)).unwrap_err(),
            CapReached::PerAddress { max: 2 }
        );
        let _b = [
            counter.try_open(ip(2)).unwrap(),
            counter.try_open(ip(2)).unwrap(),
            counter.try_open(ip(3)).unwrap(),
        ];
        assert_eq!(
            counter.try_open(ip(4)).unwrap_err(),
            CapReached::Total { max: 5 }
        );
        drop(a1);
        assert_eq!(counter.open(), (4, 3));
        let _again = counter.try_open(ip(1)).unwrap();
        assert_eq!(counter.open(), (5, 3));
    }

    #[test]
    fn an_address_without_connections_leaves_the_map() {
        let counter = ConnCounter::new(10, 10);
        let slots: Vec<_> = (0..10).map(|i| counter.try_open(ip(i)).unwrap()).collect();
        assert_eq!(counter.open(), (10, 10));
        drop(slots);
        assert_eq!(counter.open(), (0, 0));
    }
}
