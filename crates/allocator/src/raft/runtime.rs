//! openraft's async runtime with a seedable RNG.
//!
//! [`SeededRuntime`] forwards everything to openraft's [`TokioRuntime`]
//! except [`AsyncRuntime::thread_rng`], the source of the randomized
//! election timeout (openraft 0.9 draws it once, when `Raft::new` builds
//! its engine). That RNG is per node: [`with_rng_seed`] runs a future (the
//! node's start) with an RNG seeded from the given seed, held in a tokio
//! task-local, and every task openraft spawns from inside it inherits the
//! same RNG. Outside such a scope (real runs, tests) `thread_rng` is
//! rand's entropy-seeded thread RNG, exactly as with `TokioRuntime`.
//!
//! So a simulation that starts each node under its own seed gets the same
//! election timeouts, hence the same elections, on every run of a seed.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use openraft::{AsyncRuntime, OptionalSend, TokioRuntime};
use rand::rngs::{StdRng, ThreadRng};
use rand::{RngCore, SeedableRng};

tokio::task_local! {
    static NODE_RNG: Arc<Mutex<StdRng>>;
}

/// Runs `future` with openraft's RNG seeded from `seed` (see the module
/// docs). Tasks spawned through [`SeededRuntime`] inside it share the RNG.
pub async fn with_rng_seed<F: Future>(seed: u64, future: F) -> F::Output {
    let rng = Arc::new(Mutex::new(StdRng::seed_from_u64(seed)));
    NODE_RNG.scope(rng, future).await
}

/// The RNG [`SeededRuntime::thread_rng`] hands out: the node's seeded RNG
/// when called inside [`with_rng_seed`], else rand's thread RNG.
pub enum RuntimeRng {
    Seeded(Arc<Mutex<StdRng>>),
    Thread(ThreadRng),
}

impl RuntimeRng {
    fn seeded<R>(rng: &Mutex<StdRng>, draw: impl FnOnce(&mut StdRng) -> R) -> R {
        // A poisoned lock only means a panic while drawing; the RNG state
        // is still a valid RNG state.
        draw(&mut rng.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl RngCore for RuntimeRng {
    fn next_u32(&mut self) -> u32 {
        match self {
            RuntimeRng::Seeded(rng) => Self::seeded(rng, StdRng::next_u32),
            RuntimeRng::Thread(rng) => rng.next_u32(),
        }
    }

    fn next_u64(&mut self) -> u64 {
        match self {
            RuntimeRng::Seeded(rng) => Self::seeded(rng, StdRng::next_u64),
            RuntimeRng::Thread(rng) => rng.next_u64(),
        }
    }

    fn fill_bytes(&mut self, dest: &mut [u8]) {
        match self {
            RuntimeRng::Seeded(rng) => Self::seeded(rng, |rng| rng.fill_bytes(dest)),
            RuntimeRng::Thread(rng) => rng.fill_bytes(dest),
        }
    }

    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand::Error> {
        match self {
            RuntimeRng::Seeded(rng) => Self::seeded(rng, |rng| rng.try_fill_bytes(dest)),
            RuntimeRng::Thread(rng) => rng.try_fill_bytes(dest),
        }
    }
}

/// openraft's Tokio runtime with a per-node seedable RNG (module docs).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SeededRuntime;

type Tokio = TokioRuntime;

impl AsyncRuntime for SeededRuntime {
    type JoinError = <Tokio as AsyncRuntime>::JoinError;
    type JoinHandle<T: OptionalSend + 'static> = <Tokio as AsyncRuntime>::JoinHandle<T>;
    type Sleep = <Tokio as AsyncRuntime>::Sleep;
    type Instant = <Tokio as AsyncRuntime>::Instant;
    type TimeoutError = <Tokio as AsyncRuntime>::TimeoutError;
    type Timeout<R, T: Future<Output = R> + OptionalSend> = <Tokio as AsyncRuntime>::Timeout<R, T>;
    type ThreadLocalRng = RuntimeRng;
    type OneshotSender<T: OptionalSend> = <Tokio as AsyncRuntime>::OneshotSender<T>;
    type OneshotReceiverError = <Tokio as AsyncRuntime>::OneshotReceiverError;
    type OneshotReceiver<T: OptionalSend> = <Tokio as AsyncRuntime>::OneshotReceiver<T>;

    /// Spawns on Tokio; a task spawned inside [`with_rng_seed`] keeps the
    /// node's RNG.
    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        match NODE_RNG.try_with(Arc::clone) {
            Ok(rng) => Tokio::spawn(NODE_RNG.scope(rng, future)),
            Err(_) => Tokio::spawn(future),
        }
    }

    fn sleep(duration: Duration) -> Self::Sleep {
        Tokio::sleep(duration)
    }

    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        Tokio::sleep_until(deadline)
    }

    fn timeout<R, F: Future<Output = R> + OptionalSend>(
        duration: Duration,
        future: F,
    ) -> Self::Timeout<R, F> {
        Tokio::timeout(duration, future)
    }

    fn timeout_at<R, F: Future<Output = R> + OptionalSend>(
        deadline: Self::Instant,
        future: F,
    ) -> Self::Timeout<R, F> {
        Tokio::timeout_at(deadline, future)
    }

    fn is_panic(join_error: &Self::JoinError) -> bool {
        Tokio::is_panic(join_error)
    }

    fn thread_rng() -> Self::ThreadLocalRng {
        match NODE_RNG.try_with(Arc::clone) {
            Ok(rng) => RuntimeRng::Seeded(rng),
            Err(_) => RuntimeRng::Thread(rand::thread_rng()),
        }
    }

    fn oneshot<T>() -> (Self::OneshotSender<T>, Self::OneshotReceiver<T>)
    where
        T: OptionalSend,
    {
        Tokio::oneshot()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    fn election_timeouts() -> Vec<u64> {
        (0..8)
            .map(|_| SeededRuntime::thread_rng().gen_range(600..1_200))
            .collect()
    }

    #[tokio::test]
    async fn a_seed_gives_the_same_draws_also_in_spawned_tasks() {
        let first = with_rng_seed(7, async { election_timeouts() }).await;
        let again = with_rng_seed(7, async { election_timeouts() }).await;
        assert_eq!(first, again);
        let other = with_rng_seed(8, async { election_timeouts() }).await;
        assert_ne!(first, other);
        let spawned = with_rng_seed(7, async {
            SeededRuntime::spawn(async { election_timeouts() })
                .await
                .unwrap()
        })
        .await;
        assert_eq!(first, spawned);
    }

    #[tokio::test]
    async fn outside_a_scope_it_draws_from_entropy() {
        let draws = election_timeouts();
        assert!(draws.iter().all(|draw| (600..1_200).contains(draw)));
        assert!(matches!(SeededRuntime::thread_rng(), RuntimeRng::Thread(_)));
    }
}
