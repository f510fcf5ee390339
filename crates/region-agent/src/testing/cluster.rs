//! Test harness: a private Redis Cluster on free loopback ports.
//!
//! [`RedisCluster::start`] starts `primaries × (1 + replicas)` servers with
//! `--cluster-enabled yes` (no persistence, each in its own temp dir, its
//! bus on a free port of its own), joins them with `redis-cli --cluster
//! create … --cluster-replicas N --cluster-yes`, and waits until every node
//! says `cluster_state:ok`. It runs the way the docs tell production to:
//! `cluster-require-full-coverage no` (a failing primary takes down only
//! its own slots) and a short `cluster-node-timeout` (1 s) so a killed
//! primary's replica is promoted quickly; it returns once every replica has
//! synced with its primary (a replica that never synced is never
//! promoted). Every wait is bounded
//! ([`CLUSTER_TIMEOUT`]); the servers stop (and their dirs go) on drop.

use std::process::Command;
use std::time::{Duration, Instant};

use super::{free_port, HarnessError, RedisServer};

/// Longest wait for the cluster to form, a failover, or a reshard.
pub const CLUSTER_TIMEOUT: Duration = Duration::from_secs(60);
/// The fixture's `cluster-node-timeout`.
pub const NODE_TIMEOUT_MS: u64 = 1_000;

/// A running Redis Cluster owned by this process.
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

/// One node as `CLUSTER NODES` describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterNode {
    pub id: String,
    pub port: u16,
    pub primary: bool,
    /// Slot ranges (start, end) a primary serves.
    pub slots: Vec<(u16, u16)>,
}

impl RedisCluster {
    /// Starts and joins a cluster of `primaries` primaries with `replicas`
    /// replicas each.
    pub fn start(primaries: usize, replicas: usize) -> Result<Self, HarnessError> {
        let total = primaries * (1 + replicas);
        let mut nodes = Vec::with_capacity(total);
        for _ in 0..total {
            nodes.push(start_node()?);
        }
        let cluster = RedisCluster { nodes };
        let mut create: Vec<String> = vec!["--cluster".into(), "create".into()];
        create.extend(
            cluster
                .nodes
                .iter()
                .map(|n| format!("127.0.0.1:{}", n.port())),
        );
        create.extend([
            "--cluster-replicas".into(),
            replicas.to_string(),
            "--cluster-yes".into(),
        ]);
        cli(&create)?;
        cluster.wait_until(
            "every node reports cluster_state:ok and knows every node",
            |c| {
                c.live_ports().iter().all(|&port| {
                    let info = cli_at(port, &["CLUSTER", "INFO"]).unwrap_or_default();
                    // A replica that never synced cannot be promoted: wait for
                    // every link, so a test may kill a primary at once.
                    let replication = cli_at(port, &["INFO", "replication"]).unwrap_or_default();
                    info.contains("cluster_state:ok")
                        && info.contains(&format!("cluster_known_nodes:{total}"))
                        && (replication.contains("role:master")
                            || replication.contains("master_link_status:up"))
                }) && c
                    .nodes_view()
                    .map(|v| v.iter().filter(|n| n.primary).count())
                    == Some(primaries)
            },
        )?;
        Ok(cluster)
    }

    /// `redis://127.0.0.1:<port>/` of every node started (seeds).
    pub fn seeds(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// Ports of the nodes still running.
    pub fn live_ports(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|n| n.pid().is_some())
            .map(RedisServer::port)
            .collect()
    }

    /// The cluster as a live node sees it (`CLUSTER NODES`), failed nodes
    /// left out.
    pub fn nodes_view(&self) -> Option<Vec<ClusterNode>> {
        let port = *self.live_ports().first()?;
        let text = cli_at(port, &["CLUSTER", "NODES"]).ok()?;
        Some(parse_cluster_nodes(&text))
    }

    /// The primary serving `slot`, as a live node sees it.
    pub fn primary_for_slot(&self, slot: u16) -> Option<ClusterNode> {
        self.nodes_view()?
            .into_iter()
            .find(|n| n.primary && n.slots.iter().any(|&(s, e)| (s..=e).contains(&slot)))
    }

    /// Kills the node on `port` at once (SIGKILL), as a crash would.
    pub fn kill(&mut self, port: u16) {
        if let Some(node) = self.nodes.iter_mut().find(|n| n.port() == port) {
            node.kill();
        }
    }

    /// Freezes (true) or thaws (false) the node on `port`.
    pub fn freeze(&self, port: u16, frozen: bool) -> Result<(), HarnessError> {
        match self.nodes.iter().find(|n| n.port() == port) {
            Some(node) => node.freeze(frozen),
            None => Err(HarnessError::Start(format!("no node on port {port}"))),
        }
    }

    /// Waits until a replica has taken over every slot of the primary on
    /// `port` (killed) and the cluster is ok again.
    pub fn wait_for_failover(&self, port: u16) -> Result<(), HarnessError> {
        self.wait_until("a replica serves the killed primary's slots", |c| {
            let Some(view) = c.nodes_view() else {
                return false;
            };
            let covered: u32 = view
                .iter()
                .filter(|n| n.primary && n.port != port)
                .flat_map(|n| n.slots.iter())
                .map(|&(s, e)| u32::from(e - s) + 1)
                .sum();
            covered == 16_384
                && c.live_ports().iter().all(|&p| {
                    cli_at(p, &["CLUSTER", "INFO"])
                        .unwrap_or_default()
                        .contains("cluster_state:ok")
                })
        })
    }

    /// Moves `slots` slots from the primary `from` to the primary `to`
    /// (node ids) with `redis-cli --cluster reshard`, keys included; waits
    /// until it has finished.
    pub fn reshard(&self, from: &str, to: &str, slots: u32) -> Result<(), HarnessError> {
        let port = *self
            .live_ports()
            .first()
            .ok_or_else(|| HarnessError::Start("no live node".into()))?;
        cli(&[
            "--cluster".into(),
            "reshard".into(),
            format!("127.0.0.1:{port}"),
            "--cluster-from".into(),
            from.into(),
            "--cluster-to".into(),
            to.into(),
            "--cluster-slots".into(),
            slots.to_string(),
            "--cluster-yes".into(),
            // Small batches: the migration runs while traffic does.
            "--cluster-pipeline".into(),
            "5".into(),
        ])?;
        Ok(())
    }

    fn wait_until(
        &self,
        what: &str,
        done: impl Fn(&RedisCluster) -> bool,
    ) -> Result<(), HarnessError> {
        let deadline = Instant::now() + CLUSTER_TIMEOUT;
        while Instant::now() < deadline {
            if done(self) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(HarnessError::Start(format!(
            "cluster: not within {CLUSTER_TIMEOUT:?}: {what}"
        )))
    }
}

/// One cluster node: its bus on a free port of its own (`cluster-port`,
/// so no port + 10,000 has to be free).
fn start_node() -> Result<RedisServer, HarnessError> {
    let mut last = String::new();
    for _ in 0..5 {
        let bus = free_port()?;
        let args: Vec<String> = [
            "--cluster-enabled",
            "yes",
            "--cluster-port",
            &bus.to_string(),
            "--cluster-node-timeout",
            &NODE_TIMEOUT_MS.to_string(),
            "--cluster-require-full-coverage",
            "no",
            // A replica's first sync starts at once, not after 5 s.
            "--repl-diskless-sync-delay",
            "0",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        match RedisServer::start_with_args(&args) {
            Ok(server) => return Ok(server),
            Err(HarnessError::Missing(e)) => return Err(HarnessError::Missing(e)),
            Err(e) => last = e.to_string(),
        }
    }
    Err(HarnessError::Start(last))
}

/// Runs `redis-cli` with `args`; its output, or an error naming it.
fn cli(args: &[String]) -> Result<String, HarnessError> {
    let output = Command::new("redis-cli").args(args).output().map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            HarnessError::Missing(e)
        } else {
            HarnessError::Io(e)
        }
    })?;
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    if !output.status.success() || text.contains("[ERR]") {
        return Err(HarnessError::Start(format!(
            "redis-cli {}: {}{}",
            args.join(" "),
            text,
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    Ok(text)
}

/// One command at the node on `port`.
pub fn cli_at(port: u16, args: &[&str]) -> Result<String, HarnessError> {
    let mut all = vec!["-p".to_string(), port.to_string()];
    all.extend(args.iter().map(|s| s.to_string()));
    cli(&all)
}

/// Reads `CLUSTER NODES` lines: `<id> <ip:port@bus> <flags> <primary> … <slots…>`.
fn parse_cluster_nodes(text: &str) -> Vec<ClusterNode> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (id, address, flags) = (fields.first()?, fields.get(1)?, fields.get(2)?);
            if flags.contains("fail") || flags.contains("noaddr") {
                return None;
            }
            let port = address
                .split('@')
                .next()?
                .rsplit(':')
                .next()?
                .parse()
                .ok()?;
            let slots = fields
                .iter()
                .skip(8)
                .filter(|f| !f.starts_with('['))
                .filter_map(|range| match range.split_once('-') {
                    Some((s, e)) => Some((s.parse().ok()?, e.parse().ok()?)),
                    None => range.parse().ok().map(|s| (s, s)),
                })
                .collect();
            Some(ClusterNode {
                id: id.to_string(),
                port,
                primary: flags.contains("master"),
                slots,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_nodes_lines_are_read() {
        let text = "\
07c3 127.0.0.1:30004@31004 slave e7d1 0 1426238317239 4 connected
e7d1 127.0.0.1:30001@31001 myself,master - 0 0 1 connected 0-5460 7000 [93->-292f]
292f 127.0.0.1:30002@31002 master,fail - 0 0 2 connected 5461-10922
";
        let nodes = parse_cluster_nodes(text);
        assert_eq!(nodes.len(), 2, "failed nodes are left out");
        assert!(!nodes[0].primary);
        assert_eq!(nodes[1].port, 30001);
        assert_eq!(nodes[1].slots, vec![(0, 5460), (7000, 7000)]);
    }
}
