//! `leasehold agent` and `leasehold allocator` stop on SIGTERM (what
//! Kubernetes and systemd send) and SIGINT as an orchestrator expects:
//! listeners closed, requests in flight drained, exit 0.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Far above any start or stop on a loaded machine: only a hang fails.
const DEADLINE: Duration = Duration::from_secs(60);

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A running `leasehold` process whose stdout lines arrive on a channel.
struct Process {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Process {
    fn start(args: &[&str], config: &Path) -> Process {
        let mut child = Command::new(env!("CARGO_BIN_EXE_leasehold"))
            .args(args)
            .arg(config)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Process {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits for a stdout line containing `text`.
    fn wait_for(&mut self, text: &str) {
        let started = Instant::now();
        while !self.seen.iter().any(|l| l.contains(text)) {
            let left = DEADLINE.saturating_sub(started.elapsed());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.seen.push(line),
                Err(_) => panic!("no line with {text:?} within {DEADLINE:?}: {:?}", self.seen),
            }
        }
    }

    /// Sends `signal` and waits for the exit; the rest of stdout is kept.
    fn signal_and_wait(&mut self, signal: &str) -> ExitStatus {
        let sent = Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success(), "kill -{signal}");
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                self.seen.extend(self.lines.try_iter());
                // The reader thread ends with the pipe: collect the rest.
                while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(5)) {
                    self.seen.push(line);
                }
                return status;
            }
            assert!(
                started.elapsed() < DEADLINE,
                "no exit within {DEADLINE:?} of SIG{signal}: {:?}",
                self.seen
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn stdout(&self) -> String {
        self.seen.join("\n")
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn the_agent_stops_on_sigterm_and_sigint_and_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("pepper"), "a-pepper-of-at-least-16-bytes").unwrap();
    std::fs::write(
        dir.path().join("policy.toml"),
        "version = 1\n[[domain]]\nname = \"api\"\n[[domain.rule]]\nid = \"p\"\nscope = \"tenant\"\nalgorithm = \"token_bucket\"\ncapacity = 10\nrefill = 1\nperiod_ms = 1000\nfail_mode = \"open\"\n",
    )
    .unwrap();
    for signal in ["TERM", "INT"] {
        let config = dir.path().join(format!("agent-{signal}.toml"));
        std::fs::write(
            &config,
            format!(
                "plaintext = true\nregion = \"eu\"\nlisten = \"127.0.0.1:{}\"\nhttp_listen = \"127.0.0.1:{}\"\npepper_file = \"pepper\"\npolicy_file = \"policy.toml\"\n[limits]\nshutdown_drain_ms = 2000\n",
                free_port(),
                free_port()
            ),
        )
        .unwrap();
        let mut agent = Process::start(&["agent", "--config"], &config);
        agent.wait_for("leasehold agent eu:");
        let status = agent.signal_and_wait(signal);
        let stdout = agent.stdout();
        assert!(status.success(), "SIG{signal}: exit {status}\n{stdout}");
        let name = if signal == "TERM" {
            "SIGTERM"
        } else {
            "Ctrl-C"
        };
        assert!(
            stdout.contains(&format!(
                "{name}: stopping (listeners closed; requests in flight get 2000 ms)"
            )),
            "{stdout}"
        );
        assert!(stdout.contains("leasehold agent eu: stopped"), "{stdout}");
    }
}

#[test]
fn a_lone_allocator_node_stops_on_sigterm_and_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = dir.path().join("node.toml");
    std::fs::write(
        &config,
        format!(
            "plaintext = true\nnode_id = 1\nlisten = \"127.0.0.1:{port}\"\ndata_dir = \"data\"\n[peers]\n1 = \"127.0.0.1:{port}\"\n"
        ),
    )
    .unwrap();
    let mut node = Process::start(&["allocator", "--init", "--config"], &config);
    node.wait_for("leasehold allocator node 1:");
    let status = node.signal_and_wait("TERM");
    let stdout = node.stdout();
    assert!(status.success(), "exit {status}\n{stdout}");
    assert!(stdout.contains("SIGTERM: stopping node 1"), "{stdout}");
    assert!(
        stdout.contains("leasehold allocator node 1: stopped"),
        "{stdout}"
    );
}
