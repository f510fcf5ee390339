//! The signals that stop a long-running command: SIGINT (Ctrl-C) and
//! SIGTERM (what Kubernetes and systemd send).

use tokio::signal::unix::{signal, Signal, SignalKind};

/// Both stop signals, registered at once so a signal that comes during
/// start-up is not lost (the default action would kill the process).
pub struct StopSignals {
    terminate: Signal,
    interrupt: Signal,
}

impl StopSignals {
    pub fn register() -> std::io::Result<Self> {
        Ok(StopSignals {
            terminate: signal(SignalKind::terminate())?,
            interrupt: signal(SignalKind::interrupt())?,
        })
    }

    /// The first stop signal, by name.
    pub async fn wait(&mut self) -> &'static str {
        tokio::select! {
            _ = self.interrupt.recv() => "Ctrl-C",
            _ = self.terminate.recv() => "SIGTERM",
        }
    }
}
