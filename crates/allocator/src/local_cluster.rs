//! A cluster of real `leasehold allocator` processes on loopback, each with
//! its own sled directory under one temporary directory — for the
//! end-to-end tests and `leasehold bench allocator`. Not used in production.
//!
//! Nodes are started from the `leasehold` binary given to
//! [`LocalCluster::new`], with generated config files; their stderr goes to
//! `node-<id>.log` in the cluster directory ([`LocalCluster::log`]).
//! Faults are real signals: [`LocalCluster::kill`] (SIGKILL),
//! [`LocalCluster::terminate`] (SIGTERM), [`LocalCluster::freeze`] /
//! [`LocalCluster::thaw`] (SIGSTOP / SIGCONT). Dropping the cluster kills
//! every process it started and removes the directory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::client::{AllocatorClient, ClientSettings};
use crate::raft::NodeId;
use leasehold_proto::allocator::v1 as pb;

/// Settings written into every node's config.
#[derive(Clone, Debug)]
pub struct ClusterSettings {
    pub nodes: u64,
    /// 0: no automatic Tick (keeps the log still when idle).
    pub tick_interval_ms: u64,
    pub heartbeat_ms: u64,
    pub election_min_ms: u64,
    pub election_max_ms: u64,
    pub write_timeout_ms: u64,
    pub snapshot_every_entries: u64,
    pub logs_kept_after_snapshot: u64,
    /// `RUST_LOG` of the nodes.
    pub log_filter: String,
    pub prober: Option<ProberTargets>,
}

/// The health prober section of every node's config.
#[derive(Clone, Debug)]
pub struct ProberTargets {
    pub interval_ms: u64,
    pub failures_to_unhealthy: u32,
    /// (Region, health URL).
    pub targets: Vec<(String, String)>,
}

impl Default for ClusterSettings {
    fn default() -> Self {
        ClusterSettings {
            nodes: 3,
            tick_interval_ms: 0,
            heartbeat_ms: 100,
            election_min_ms: 600,
            election_max_ms: 1_200,
            write_timeout_ms: 2_000,
            snapshot_every_entries: 20_000,
            logs_kept_after_snapshot: 1_000,
            log_filter: "warn".into(),
            prober: None,
        }
    }
}

struct LocalNode {
    address: String,
    config_path: PathBuf,
    data_dir: PathBuf,
    log_path: PathBuf,
    child: Option<Child>,
    frozen: bool,
}

/// Real allocator processes on loopback.
pub struct LocalCluster {
    binary: PathBuf,
    dir: PathBuf,
    nodes: BTreeMap<NodeId, LocalNode>,
    settings: ClusterSettings,
}

/// A free loopback port (bound then released: a tiny race, fine for tests).
fn free_port() -> std::io::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

fn unique_dir(prefix: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    std::env::temp_dir().join(format!("{prefix}-{}-{nanos}", std::process::id()))
}

fn signal(pid: u32, name: &str) -> std::io::Result<()> {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()?;
    if status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!("kill -{name} {pid} failed")))
    }
}

/// Writes node `id`'s config (`peers`: the `[peers]` table's lines) into
/// `dir`; returns the node, not started.
fn write_node_config(
    dir: &Path,
    id: NodeId,
    address: &str,
    peers: &str,
    settings: &ClusterSettings,
) -> std::io::Result<LocalNode> {
    let data_dir = dir.join(format!("data-{id}"));
    let mut config = format!(
        "plaintext = true\nnode_id = {id}\nlisten = \"{address}\"\ndata_dir = \"{}\"\ntick_interval_ms = {}\n\n[peers]\n{peers}\n[raft]\nheartbeat_ms = {}\nelection_min_ms = {}\nelection_max_ms = {}\nwrite_timeout_ms = {}\nsnapshot_every_entries = {}\nlogs_kept_after_snapshot = {}\n",
        data_dir.display(),
        settings.tick_interval_ms,
        settings.heartbeat_ms,
        settings.election_min_ms,
        settings.election_max_ms,
        settings.write_timeout_ms,
        settings.snapshot_every_entries,
        settings.logs_kept_after_snapshot,
    );
    if let Some(ProberTargets {
        interval_ms,
        failures_to_unhealthy: failures,
        targets,
    }) = &settings.prober
    {
        config.push_str(&format!(
            "\n[prober]\ninterval_ms = {interval_ms}\ntimeout_ms = 500\nfailures_to_unhealthy = {failures}\n"
        ));
        for (region, url) in targets {
            config.push_str(&format!(
                "[[prober.region]]\nregion = \"{region}\"\nhealth = \"{url}\"\n"
            ));
        }
    }
    let config_path = dir.join(format!("allocator-{id}.toml"));
    std::fs::write(&config_path, config)?;
    Ok(LocalNode {
        address: address.to_string(),
        config_path,
        data_dir,
        log_path: dir.join(format!("node-{id}.log")),
        child: None,
        frozen: false,
    })
}

impl LocalCluster {
    /// Writes the configs of `settings.nodes` nodes on free loopback ports
    /// into a new temporary directory. Starts nothing.
    pub fn new(binary: &Path, settings: &ClusterSettings) -> std::io::Result<Self> {
        let dir = unique_dir("leasehold-cluster");
        std::fs::create_dir_all(&dir)?;
        let mut addresses = BTreeMap::new();
        for id in 1..=settings.nodes {
            addresses.insert(id, format!("127.0.0.1:{}", free_port()?));
        }
        let peers: String = addresses
            .iter()
            .map(|(id, address)| format!("{id} = \"{address}\"\n"))
            .collect();
        let mut nodes = BTreeMap::new();
        for (id, address) in &addresses {
            nodes.insert(
                *id,
                write_node_config(&dir, *id, address, &peers, settings)?,
            );
        }
        let cluster = LocalCluster {
            binary: binary.to_path_buf(),
            dir,
            nodes,
            settings: settings.clone(),
        };
        std::fs::write(cluster.dir.join("RUST_LOG"), &settings.log_filter)?;
        Ok(cluster)
    }

    /// Writes the config of one more node (the next id, a free loopback
    /// port) whose `[peers]` lists every node so far and itself. Starts
    /// nothing. Started without `--init`, it never initializes a cluster of
    /// its own (it is not the lowest id): it waits to be added (AddNode).
    pub fn add_joiner(&mut self) -> std::io::Result<NodeId> {
        let id = self.nodes.keys().next_back().map_or(1, |last| last + 1);
        let address = format!("127.0.0.1:{}", free_port()?);
        let peers: String = self
            .nodes
            .iter()
            .map(|(id, node)| (*id, node.address.as_str()))
            .chain(std::iter::once((id, address.as_str())))
            .map(|(id, address)| format!("{id} = \"{address}\"\n"))
            .collect();
        let node = write_node_config(&self.dir, id, &address, &peers, &self.settings)?;
        self.nodes.insert(id, node);
        Ok(id)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn ids(&self) -> Vec<NodeId> {
        self.nodes.keys().copied().collect()
    }

    pub fn address(&self, id: NodeId) -> String {
        self.nodes
            .get(&id)
            .map_or(String::new(), |n| n.address.clone())
    }

    pub fn data_dir(&self, id: NodeId) -> PathBuf {
        self.nodes
            .get(&id)
            .map_or(PathBuf::new(), |n| n.data_dir.clone())
    }

    /// Every node's address.
    pub fn addresses(&self) -> Vec<String> {
        self.nodes.values().map(|n| n.address.clone()).collect()
    }

    /// Addresses of the nodes not in `except`.
    pub fn addresses_except(&self, except: &[NodeId]) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|(id, _)| !except.contains(id))
            .map(|(_, n)| n.address.clone())
            .collect()
    }

    pub fn pid(&self, id: NodeId) -> Option<u32> {
        self.nodes.get(&id)?.child.as_ref().map(Child::id)
    }

    /// Starts node `id` (`--init` if `init`). Its stderr is appended to its log.
    pub fn start(&mut self, id: NodeId, init: bool) -> std::io::Result<()> {
        let filter = std::fs::read_to_string(self.dir.join("RUST_LOG")).unwrap_or_default();
        let binary = self.binary.clone();
        let node = self
            .nodes
            .get_mut(&id)
            .ok_or_else(|| std::io::Error::other(format!("no node {id}")))?;
        if node.child.is_some() {
            return Err(std::io::Error::other(format!("node {id} is running")));
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log_path)?;
        let mut command = Command::new(binary);
        command
            .arg("allocator")
            .arg("--config")
            .arg(&node.config_path)
            .env("RUST_LOG", filter.trim())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        if init {
            command.arg("--init");
        }
        node.child = Some(command.spawn()?);
        node.frozen = false;
        Ok(())
    }

    /// Starts every node that is not running (none with `--init`).
    pub fn start_all(&mut self) -> std::io::Result<()> {
        for id in self.ids() {
            if self.nodes.get(&id).is_some_and(|n| n.child.is_none()) {
                self.start(id, false)?;
            }
        }
        Ok(())
    }

    /// Deletes node `id`'s data directory (the node must be stopped): a
    /// lost disk.
    pub fn wipe(&mut self, id: NodeId) -> std::io::Result<()> {
        let node = self
            .nodes
            .get(&id)
            .ok_or_else(|| std::io::Error::other(format!("no node {id}")))?;
        if node.child.is_some() {
            return Err(std::io::Error::other(format!("node {id} is running")));
        }
        match std::fs::remove_dir_all(&node.data_dir) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => Err(error),
            _ => Ok(()),
        }
    }

    /// SIGKILL, then reaps.
    pub fn kill(&mut self, id: NodeId) -> std::io::Result<()> {
        let Some(node) = self.nodes.get_mut(&id) else {
            return Ok(());
        };
        if let Some(mut child) = node.child.take() {
            child.kill()?;
            child.wait()?;
        }
        node.frozen = false;
        Ok(())
    }

    /// SIGTERM (graceful stop), waits up to `grace`, then SIGKILL.
    pub fn terminate(&mut self, id: NodeId, grace: Duration) -> std::io::Result<()> {
        let Some(node) = self.nodes.get_mut(&id) else {
            return Ok(());
        };
        let Some(mut child) = node.child.take() else {
            return Ok(());
        };
        if node.frozen {
            signal(child.id(), "CONT")?;
            node.frozen = false;
        }
        signal(child.id(), "TERM")?;
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if child.try_wait()?.is_some() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        child.kill()?;
        child.wait()?;
        Ok(())
    }

    /// SIGSTOP: the process stays, frozen.
    pub fn freeze(&mut self, id: NodeId) -> std::io::Result<()> {
        let node = self
            .nodes
            .get_mut(&id)
            .ok_or_else(|| std::io::Error::other(format!("no node {id}")))?;
        let pid = node
            .child
            .as_ref()
            .map(Child::id)
            .ok_or_else(|| std::io::Error::other("not running"))?;
        signal(pid, "STOP")?;
        node.frozen = true;
        Ok(())
    }

    /// SIGCONT.
    pub fn thaw(&mut self, id: NodeId) -> std::io::Result<()> {
        let node = self
            .nodes
            .get_mut(&id)
            .ok_or_else(|| std::io::Error::other(format!("no node {id}")))?;
        let pid = node
            .child
            .as_ref()
            .map(Child::id)
            .ok_or_else(|| std::io::Error::other("not running"))?;
        signal(pid, "CONT")?;
        node.frozen = false;
        Ok(())
    }

    /// The node's log so far (for failure messages).
    pub fn log(&self, id: NodeId) -> String {
        self.nodes
            .get(&id)
            .and_then(|n| std::fs::read_to_string(&n.log_path).ok())
            .unwrap_or_default()
    }

    /// A leader-following client of the nodes not in `except`.
    pub fn client_except(&self, except: &[NodeId]) -> AllocatorClient {
        let addresses = self.addresses_except(except);
        // A cluster always has at least one address; connect cannot fail on
        // well-formed loopback addresses.
        AllocatorClient::connect(&addresses).unwrap_or_else(|e| panic!("client: {e}"))
    }

    pub fn client(&self) -> AllocatorClient {
        self.client_except(&[])
    }

    /// Waits (at most `within`) until one of the nodes not in `except`
    /// serves a linearizable Inspect, i.e. is a leader confirmed by a
    /// quorum; returns its raft status.
    pub async fn wait_for_leader(
        &self,
        except: &[NodeId],
        within: Duration,
    ) -> Result<pb::RaftStatus, String> {
        let settings = ClientSettings {
            call_timeout: Duration::from_secs(2),
            leader_wait: within,
            max_attempts: u32::MAX,
            retry_pause: Duration::from_millis(50),
            hedge_after: None,
        };
        let client = AllocatorClient::with_settings(&self.addresses_except(except), settings)
            .map_err(|e| e.to_string())?;
        let reply = client
            .inspect(pb::InspectRequest::default())
            .await
            .map_err(|e| e.to_string())?;
        reply
            .raft
            .ok_or_else(|| "Inspect without raft status".to_string())
    }
}

/// The bench's baseline: one durable command at a time on raw sled, in a
/// fresh Db in `dir` — insert a log-entry-sized value under a big-endian
/// index, then `flush` — for `duration`. Returns commands per second.
pub fn raw_sled_commit_rate(dir: &Path, duration: Duration) -> Result<f64, String> {
    let db = sled::Config::new()
        .path(dir)
        .open()
        .map_err(|e| e.to_string())?;
    let tree = db.open_tree("log").map_err(|e| e.to_string())?;
    let proposal = crate::raft::Proposal::single(
        1_700_000_000_000,
        crate::Command::Grant {
            pool: "bench-0".into(),
            region: "bench".into(),
            incarnation: 1,
            lease_id: "t17-123456".into(),
            want_millitokens: 1,
        },
    );
    let value = serde_json::to_vec(&proposal).map_err(|e| e.to_string())?;
    let started = Instant::now();
    let mut index: u64 = 0;
    while started.elapsed() < duration {
        index += 1;
        tree.insert(index.to_be_bytes(), value.as_slice())
            .map_err(|e| e.to_string())?;
        db.flush().map_err(|e| e.to_string())?;
    }
    Ok(index as f64 / started.elapsed().as_secs_f64())
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        for node in self.nodes.values_mut() {
            if let Some(mut child) = node.child.take() {
                if node.frozen {
                    let _ = signal(child.id(), "CONT");
                }
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
