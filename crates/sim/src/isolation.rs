//! What a simulation needs from the rest of its process to be deterministic.
//!
//! tokio numbers tasks from one process-wide counter, and a current-thread
//! runtime files its tasks into 4 shards by `id mod 4`. When turmoil crashes
//! or bounces a host it drops that host's runtime, which shuts the tasks
//! down shard by shard; each dropped socket sends its close into the
//! simulated network, where it draws a latency from the seeded RNG. So the
//! *ids* tokio hands out decide the order of those draws, and with it the
//! rest of the run: the same seed gave another trace after a different
//! number of tasks had been spawned earlier in the process (`offset +2`), or
//! while another thread spawned tasks at the same time (a second simulation,
//! or anything else on tokio).
//!
//! [`exclusive`] removes both: one simulation at a time per process, each
//! starting at the same task id modulo [`ID_ALIGNMENT`] (the shard count of
//! any runtime up to 16 cores divides it). The guarantee left is stated in
//! the crate docs: nothing else in the process spawns tokio tasks while a
//! simulation runs (true of `leasehold sim` and of this crate's tests).

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Task ids are aligned to a multiple of this before each run.
pub const ID_ALIGNMENT: u64 = 64;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Held for the length of one simulation (see the module docs).
pub struct Exclusive {
    _guard: MutexGuard<'static, ()>,
}

/// Waits for any other simulation of this process to end, then spawns
/// throw-away tasks until the next task id is `1 mod ID_ALIGNMENT`, the
/// same state of tokio's counter for every run.
pub fn exclusive() -> std::io::Result<Exclusive> {
    // A simulation that panicked left nothing behind that the lock guards.
    let guard = ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
    let runtime = tokio::runtime::Builder::new_current_thread().build()?;
    runtime.block_on(async {
        loop {
            let task = tokio::spawn(async {});
            let id = task_id_number(&task.id());
            // A finished spawn cannot fail; its result carries nothing.
            let _ = task.await;
            match id {
                Some(id) if id % ID_ALIGNMENT == 0 => break,
                Some(_) => continue,
                // An id that does not print as a number: nothing to align.
                None => break,
            }
        }
    });
    Ok(Exclusive { _guard: guard })
}

/// tokio's task id as a number (its `Display` is the counter's value).
fn task_id_number(id: &tokio::task::Id) -> Option<u64> {
    id.to_string().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_task_after_alignment_has_an_aligned_successor_id() {
        let _held = exclusive().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let id = rt.block_on(async { tokio::spawn(async {}).id() });
        assert_eq!(task_id_number(&id).unwrap() % ID_ALIGNMENT, 1);
    }
}
