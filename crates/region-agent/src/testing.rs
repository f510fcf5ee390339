//! Test harness: a private `redis-server` on a free loopback port.
//!
//! Every test binary that needs Redis starts its own with
//! [`RedisServer::start`]: no persistence, its own temp dir, stopped (and its
//! dir removed) on drop. Used by this crate's tests, the end-to-end tests and
//! `leasehold bench`. Bounded: start waits at most [`START_TIMEOUT`].

pub mod cluster;
pub mod rlqs_envoy;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::net::UnixStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Longest wait for a started server to answer PING.
pub const START_TIMEOUT: Duration = Duration::from_secs(10);
/// Attempts at finding a port nobody grabbed in between.
const START_ATTEMPTS: usize = 5;

#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error(
        "redis-server not found on PATH ({0}); install it with `apt-get install redis-server`"
    )]
    Missing(std::io::Error),
    #[error("redis-server did not start: {0}")]
    Start(String),
    #[error("harness I/O: {0}")]
    Io(#[from] std::io::Error),
}

/// A running redis-server owned by this process.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    /// `start_secure` only: the TLS port and the server's extra arguments.
    tls_port: Option<u16>,
    extra_args: Vec<String>,
}

/// What [`RedisServer::start_secure`] turns on: TLS with these PEM files
/// (client certificates optional) and ACL users from `acl_lines` (e.g.
/// `user default off`, `user agent on >secret ~* &* +@all`).
pub struct SecureRedis {
    pub cert_file: std::path::PathBuf,
    pub key_file: std::path::PathBuf,
    pub ca_file: std::path::PathBuf,
    pub acl_lines: Vec<String>,
}

impl RedisServer {
    /// Starts a fresh server on a free loopback port.
    pub fn start() -> Result<Self, HarnessError> {
        Self::start_inner(None)
    }

    /// Starts a server that also listens with TLS on a second free port
    /// ([`RedisServer::tls_url`]) and has the given ACL users. The plain
    /// port stays (readiness is checked there: with `default` off it answers
    /// NOAUTH, which is alive).
    pub fn start_secure(secure: &SecureRedis) -> Result<Self, HarnessError> {
        Self::start_inner(Some(secure))
    }

    /// Starts a fresh server with extra `redis-server` arguments (e.g.
    /// `--loadmodule PATH` for a benchmark's baseline).
    pub fn start_with_args(args: &[String]) -> Result<Self, HarnessError> {
        Self::start_inner_with(None, args)
    }

    fn start_inner(secure: Option<&SecureRedis>) -> Result<Self, HarnessError> {
        Self::start_inner_with(secure, &[])
    }

    fn start_inner_with(
        secure: Option<&SecureRedis>,
        args: &[String],
    ) -> Result<Self, HarnessError> {
        let mut server = RedisServer {
            child: None,
            port: 0,
            dir: tempfile::Builder::new()
                .prefix("leasehold-redis-")
                .tempdir()?,
            tls_port: None,
            extra_args: args.to_vec(),
        };
        if let Some(secure) = secure {
            let acl = server.dir.path().join("users.acl");
            std::fs::write(&acl, secure.acl_lines.join("\n") + "\n")?;
            server.extra_args.extend([
                "--tls-cert-file".into(),
                secure.cert_file.display().to_string(),
                "--tls-key-file".into(),
                secure.key_file.display().to_string(),
                "--tls-ca-cert-file".into(),
                secure.ca_file.display().to_string(),
                "--tls-auth-clients".into(),
                "optional".into(),
                "--aclfile".into(),
                acl.display().to_string(),
            ]);
        }
        let mut last_error = String::new();
        for _ in 0..START_ATTEMPTS {
            server.port = free_port()?;
            if secure.is_some() {
                server.tls_port = Some(free_port()?);
            }
            match server.spawn() {
                Ok(()) => return Ok(server),
                Err(HarnessError::Missing(e)) => return Err(HarnessError::Missing(e)),
                Err(e) => last_error = e.to_string(),
            }
        }
        Err(HarnessError::Start(last_error))
    }

    /// `redis://127.0.0.1:<port>/`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `rediss://127.0.0.1:<tls port>/` (`start_secure` only).
    pub fn tls_url(&self) -> Option<String> {
        self.tls_port
            .map(|port| format!("rediss://127.0.0.1:{port}/"))
    }

    /// The server's process id (tests freeze it with SIGSTOP/SIGCONT).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Freezes (true) or thaws (false) the server: it keeps its state but
    /// answers nothing meanwhile, like a stalled or partitioned shard.
    pub fn freeze(&self, frozen: bool) -> Result<(), HarnessError> {
        let Some(pid) = self.pid() else {
            return Err(HarnessError::Start("not running".into()));
        };
        let signal = if frozen { "-STOP" } else { "-CONT" };
        let status = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()?;
        if status.success() {
            Ok(())
        } else {
            Err(HarnessError::Start(format!("kill {signal} {pid} failed")))
        }
    }

    /// Kills the server at once (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port (state is gone: no persistence).
    pub fn restart(&mut self) -> Result<(), HarnessError> {
        self.kill();
        self.spawn()
    }

    /// This server's private readiness socket, in its own temp dir.
    fn socket_path(&self) -> std::path::PathBuf {
        self.dir.path().join("ready.sock")
    }

    fn spawn(&mut self) -> Result<(), HarnessError> {
        let mut args: Vec<String> = self.extra_args.clone();
        if let Some(tls_port) = self.tls_port {
            args.extend(["--tls-port".to_string(), tls_port.to_string()]);
        }
        let child = Command::new("redis-server")
            .args(&args)
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                &self.dir.path().display().to_string(),
                "--maxmemory-policy",
                "noeviction",
                // Tests use DEBUG SLEEP to make a reply late.
                "--enable-debug-command",
                "local",
                // Readiness is asked here, not on the TCP port: another
                // test's server may have taken that port between
                // `free_port` and this spawn, and would answer PING for us.
                // Redis creates the socket only after binding its TCP port.
                "--unixsocket",
                &self.socket_path().display().to_string(),
                "--unixsocketperm",
                "700",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    HarnessError::Missing(e)
                } else {
                    HarnessError::Io(e)
                }
            })?;
        self.child = Some(child);
        let deadline = Instant::now() + START_TIMEOUT;
        while Instant::now() < deadline {
            if ping(&self.socket_path()) {
                return Ok(());
            }
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    return Err(HarnessError::Start(format!(
                        "exited with {status} on port {}",
                        self.port
                    )));
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        Err(HarnessError::Start(format!(
            "no PING reply on port {} within {:?}",
            self.port, START_TIMEOUT
        )))
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // A frozen server would ignore SIGKILL's cleanup otherwise.
        let _ = self.freeze(false);
        self.kill();
    }
}

fn free_port() -> Result<u16, HarnessError> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    Ok(listener.local_addr()?.port())
}

fn ping(socket: &std::path::Path) -> bool {
    let Ok(mut stream) = UnixStream::connect(socket) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 7];
    // NOAUTH: alive, with the default user off (`start_secure`).
    matches!(stream.read(&mut buf), Ok(n) if n >= 5 && (&buf[..5] == b"+PONG" || &buf[..5] == b"-NOAU"))
}
