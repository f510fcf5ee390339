//! What every `leasehold bench` measures the same way: decisions/s and
//! latency quantiles of concurrent callers, and the Redis server's own CPU
//! time (`INFO CPU`: `used_cpu_sys + used_cpu_user`) spent meanwhile, so a
//! run can be priced in decisions per Redis CPU-second — the figure that
//! decides how many Redis cores a fleet needs, and steadier on a noisy
//! machine than throughput.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;

/// Most latency samples kept per measurement (bounded memory).
const MAX_SAMPLES: usize = 2_000_000;

/// One measurement: throughput, latency quantiles, failed calls.
pub(crate) struct Run {
    pub(crate) rate: f64,
    pub(crate) decisions: u64,
    pub(crate) p50_us: u64,
    pub(crate) p99_us: u64,
    pub(crate) p999_us: u64,
    pub(crate) errors: u64,
}

/// Calls `call(task, i)` from `concurrency` tasks for `duration`; a call
/// returns how many decisions it made (0 = failed).
pub(crate) async fn measure<F, Fut>(concurrency: usize, duration: Duration, call: F) -> Run
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = u64> + Send,
{
    let call = Arc::new(call);
    let until = Instant::now() + duration;
    let started = Instant::now();
    let per_task = MAX_SAMPLES / concurrency.max(1);
    let mut tasks = Vec::new();
    for task in 0..concurrency {
        let call = call.clone();
        tasks.push(tokio::spawn(async move {
            let (mut samples, mut ok, mut errors, mut i) = (Vec::new(), 0u64, 0u64, 0u64);
            while Instant::now() < until {
                let t0 = Instant::now();
                let decided = call(task, i).await;
                if samples.len() < per_task {
                    samples.push(t0.elapsed().as_micros() as u64);
                }
                if decided > 0 {
                    ok += decided
                } else {
                    errors += 1
                }
                i += 1;
            }
            (samples, ok, errors)
        }));
    }
    let (mut all, mut ok, mut errors) = (Vec::new(), 0, 0);
    for task in tasks {
        if let Ok((samples, o, e)) = task.await {
            all.extend(samples);
            ok += o;
            errors += e;
        }
    }
    all.sort_unstable();
    Run {
        rate: ok as f64 / started.elapsed().as_secs_f64(),
        decisions: ok,
        p50_us: quantile(&all, 0.50),
        p99_us: quantile(&all, 0.99),
        p999_us: quantile(&all, 0.999),
        errors,
    }
}

/// The q-quantile of sorted samples (0 when there are none).
fn quantile(sorted: &[u64], q: f64) -> u64 {
    let at = ((sorted.len() as f64 * q) as usize).min(sorted.len().saturating_sub(1));
    sorted.get(at).copied().unwrap_or(0)
}

/// Reads a Redis server's CPU time, before and after a run.
pub(crate) struct RedisCpu {
    client: redis::Client,
}

impl RedisCpu {
    pub(crate) fn new(url: &str) -> anyhow::Result<Self> {
        Ok(RedisCpu {
            client: redis::Client::open(url).with_context(|| format!("Redis URL {url}"))?,
        })
    }

    /// `used_cpu_sys + used_cpu_user`, in seconds.
    pub(crate) fn seconds(&self) -> anyhow::Result<f64> {
        let mut conn = self.client.get_connection()?;
        let info: String = redis::cmd("INFO").arg("cpu").query(&mut conn)?;
        parse_cpu_seconds(&info).with_context(|| format!("no CPU times in INFO CPU: {info}"))
    }

    /// Runs `run` and returns its value with the Redis CPU-seconds it cost.
    pub(crate) async fn priced<T>(
        &self,
        run: impl std::future::Future<Output = anyhow::Result<T>>,
    ) -> anyhow::Result<(T, f64)> {
        let before = self.seconds()?;
        let value = run.await?;
        let after = self.seconds()?;
        Ok((value, (after - before).max(0.0)))
    }
}

/// One server's counters at one instant: CPU seconds and EVALSHA calls.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ServerCounters {
    pub(crate) cpu_s: f64,
    pub(crate) evalsha_calls: u64,
}

impl std::ops::Sub for ServerCounters {
    type Output = ServerCounters;
    fn sub(self, before: ServerCounters) -> ServerCounters {
        ServerCounters {
            cpu_s: (self.cpu_s - before.cpu_s).max(0.0),
            evalsha_calls: self.evalsha_calls.saturating_sub(before.evalsha_calls),
        }
    }
}

impl RedisCpu {
    /// CPU seconds and `cmdstat_evalsha` calls, from one `INFO`.
    pub(crate) fn counters(&self) -> anyhow::Result<ServerCounters> {
        let mut conn = self.client.get_connection()?;
        let info: String = redis::cmd("INFO")
            .arg("cpu")
            .arg("commandstats")
            .query(&mut conn)?;
        Ok(ServerCounters {
            cpu_s: parse_cpu_seconds(&info)
                .with_context(|| format!("no CPU times in INFO CPU: {info}"))?,
            evalsha_calls: parse_command_calls(&info, "evalsha"),
        })
    }
}

/// Several Redis servers read together (a cluster's primaries): each
/// server's CPU and EVALSHA calls before and after one run.
pub(crate) struct RedisCpus {
    servers: Vec<RedisCpu>,
}

impl RedisCpus {
    pub(crate) fn new(urls: &[String]) -> anyhow::Result<Self> {
        Ok(RedisCpus {
            servers: urls
                .iter()
                .map(|url| RedisCpu::new(url))
                .collect::<anyhow::Result<_>>()?,
        })
    }

    fn counters(&self) -> anyhow::Result<Vec<ServerCounters>> {
        self.servers.iter().map(RedisCpu::counters).collect()
    }

    /// Runs `run` and returns its value with what it cost each server, in
    /// the order of the URLs given.
    pub(crate) async fn priced<T>(
        &self,
        run: impl std::future::Future<Output = anyhow::Result<T>>,
    ) -> anyhow::Result<(T, Vec<ServerCounters>)> {
        let before = self.counters()?;
        let value = run.await?;
        let after = self.counters()?;
        Ok((
            value,
            after.into_iter().zip(before).map(|(a, b)| a - b).collect(),
        ))
    }
}

/// `calls=` of `cmdstat_<command>` in an `INFO commandstats` reply (0 when
/// the command never ran).
pub(crate) fn parse_command_calls(info: &str, command: &str) -> u64 {
    let prefix = format!("cmdstat_{command}:");
    info.lines()
        .find_map(|l| l.trim().strip_prefix(prefix.as_str()))
        .and_then(|rest| {
            rest.split(',')
                .find_map(|field| field.strip_prefix("calls="))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// This process's CPU time (user + system, all threads) in seconds, from
/// `/proc/self/stat`; None where there is no procfs. The bench process
/// holds the callers and the agent: its CPU per decision prices both ends
/// of the gRPC call, steadier than throughput on a shared machine.
pub(crate) fn process_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    parse_proc_stat_seconds(&stat, 100.0)
}

/// The CPU seconds of this process's threads whose name starts with
/// `prefix` (a runtime's workers, named by its builder).
pub(crate) fn threads_cpu_seconds(prefix: &str) -> Option<f64> {
    let mut total = 0.0;
    for entry in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let path = entry.path();
        let Ok(name) = std::fs::read_to_string(path.join("comm")) else {
            continue;
        };
        // comm holds at most 15 bytes of the name.
        let shown = &prefix[..prefix.len().min(15)];
        if !name.trim_end().starts_with(shown) {
            continue;
        }
        // schedstat's first field: nanoseconds on a CPU (stat's ticks
        // are 10 ms, too coarse for a mostly idle agent).
        let nanos = std::fs::read_to_string(path.join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok());
        let seconds = match nanos {
            Some(ns) => Some(ns as f64 / 1e9),
            None => std::fs::read_to_string(path.join("stat"))
                .ok()
                .and_then(|stat| parse_proc_stat_seconds(&stat, 100.0)),
        };
        total += seconds.unwrap_or(0.0);
    }
    Some(total)
}

/// utime + stime (fields 14 and 15, after the parenthesised name) over
/// `ticks_per_s`.
pub(crate) fn parse_proc_stat_seconds(stat: &str, ticks_per_s: f64) -> Option<f64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // after_name starts at field 3 (state): utime is field 14, stime 15.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / ticks_per_s)
}

/// `used_cpu_sys` + `used_cpu_user` of an `INFO CPU` reply.
pub(crate) fn parse_cpu_seconds(info: &str) -> Option<f64> {
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.trim().strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.trim().parse::<f64>().ok())
    };
    Some(field("used_cpu_sys")? + field("used_cpu_user")?)
}

/// Decisions per Redis CPU-second (0 when no CPU time was measured).
pub(crate) fn per_cpu_second(decisions: f64, cpu_s: f64) -> f64 {
    if cpu_s > 0.0 {
        decisions / cpu_s
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_cpu_seconds_from_info_cpu() {
        let info = "# CPU\r\nused_cpu_sys:0.072322\r\nused_cpu_user:0.221011\r\n\
                    used_cpu_sys_children:0.5\r\nused_cpu_user_children:0.5\r\n";
        let seconds = parse_cpu_seconds(info).unwrap();
        assert!((seconds - 0.293333).abs() < 1e-9, "{seconds}");
        assert_eq!(parse_cpu_seconds("# CPU\r\n"), None);
    }

    #[test]
    fn reads_process_cpu_from_proc_stat() {
        let stat = "4242 (leasehold (x)) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 4 0";
        assert_eq!(parse_proc_stat_seconds(stat, 100.0), Some(3.0));
        assert_eq!(parse_proc_stat_seconds("garbage", 100.0), None);
        assert!(process_cpu_seconds().is_some_and(|s| s >= 0.0));
    }

    #[test]
    fn reads_command_calls_from_info_commandstats() {
        let info = "# Commandstats\r\ncmdstat_evalsha:calls=1234,usec=99,usec_per_call=0.08\r\n\
                    cmdstat_info:calls=7,usec=1\r\n";
        assert_eq!(parse_command_calls(info, "evalsha"), 1234);
        assert_eq!(parse_command_calls(info, "info"), 7);
        assert_eq!(parse_command_calls(info, "hincrby"), 0);
    }

    #[test]
    fn quantiles_pick_from_sorted_samples() {
        let samples: Vec<u64> = (1..=1000).collect();
        assert_eq!(quantile(&samples, 0.5), 501);
        assert_eq!(quantile(&samples, 0.999), 1000);
        assert_eq!(quantile(&[], 0.99), 0);
    }

    #[test]
    fn no_cpu_time_prices_at_zero_not_infinity() {
        assert_eq!(per_cpu_second(10.0, 0.0), 0.0);
        assert_eq!(per_cpu_second(10.0, 2.0), 5.0);
    }
}
