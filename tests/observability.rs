//! deploy/observability cannot drift from the code: every metric the
//! Grafana dashboard and the alert rules name is one the allocator, the
//! agent or the gateway library registers (histogram series by their
//! `_bucket`/`_count`/`_sum` suffixes), and every alarm of the seeds has
//! a rule. `promtool check rules` checks the rules' syntax in CI (.ci/run).

use std::collections::BTreeSet;
use std::path::Path;

fn read(relative: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(relative))
        .unwrap_or_else(|e| panic!("{relative}: {e}"))
}

/// Every name the code registers.
fn registered() -> BTreeSet<&'static str> {
    leasehold_allocator::metrics::METRIC_NAMES
        .iter()
        .chain(leasehold_region_agent::metrics::METRIC_NAMES)
        .chain(leasehold_client::metrics::COUNTER_NAMES.iter())
        .copied()
        .collect()
}

/// The `leasehold_*` metric names in a PromQL expression.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = expr.as_bytes();
    let mut start = 0;
    while let Some(found) = expr[start..].find("leasehold_") {
        let begin = start + found;
        let preceded =
            begin > 0 && (bytes[begin - 1].is_ascii_alphanumeric() || bytes[begin - 1] == b'_');
        let mut end = begin;
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
            end += 1;
        }
        if !preceded {
            names.insert(expr[begin..end].to_string());
        }
        start = end;
    }
    names
}

/// The registered histograms (their series carry `_bucket`, `_count`,
/// `_sum`).
const HISTOGRAMS: [&str; 6] = [
    "leasehold_store_batch_calls",
    "leasehold_allocator_commands_per_entry",
    "leasehold_allocator_rpc_duration_seconds",
    "leasehold_store_latency_seconds",
    "leasehold_rpc_duration_seconds",
    "leasehold_allocator_sync_duration_seconds",
];

/// True when `name` is a registered metric or one of a histogram's series.
fn known(name: &str, registered: &BTreeSet<&'static str>) -> bool {
    registered.contains(name)
        || ["_bucket", "_count", "_sum"].iter().any(|suffix| {
            name.strip_suffix(suffix)
                .is_some_and(|base| HISTOGRAMS.contains(&base) && registered.contains(base))
        })
}

fn dashboard_exprs() -> Vec<String> {
    let dashboard: serde_json::Value =
        serde_json::from_str(&read("deploy/observability/grafana-dashboard.json"))
            .expect("the dashboard is JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(!panels.is_empty());
    let mut exprs = Vec::new();
    for panel in panels {
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "panel {} has no query", panel["title"]);
        for target in targets {
            exprs.push(target["expr"].as_str().expect("expr").to_string());
        }
    }
    exprs
}

#[test]
fn the_dashboard_uses_only_metrics_the_code_registers() {
    let registered = registered();
    let mut used = BTreeSet::new();
    for expr in dashboard_exprs() {
        let names = metric_names(&expr);
        assert!(!names.is_empty(), "no Leasehold metric in {expr}");
        for name in names {
            assert!(
                known(&name, &registered),
                "{name} (in {expr}) is registered nowhere"
            );
            used.insert(name);
        }
    }
    // The list: each of these is on a panel.
    for name in [
        "leasehold_allocator_raft_term",
        "leasehold_allocator_raft_apply_lag_entries",
        "leasehold_allocator_commands_per_entry_bucket",
        "leasehold_allocator_batcher_queue_depth",
        "leasehold_allocator_pool_shares_sum_millitokens_per_second",
        "leasehold_allocator_pool_unassigned_millitokens_per_second",
        "leasehold_allocator_pool_pending_release_millitokens_per_second",
        "leasehold_allocator_grants_total",
        "leasehold_allocator_reclaims_total",
        "leasehold_allocator_fenced_total",
        "leasehold_allocator_prober_verdicts_total",
        "leasehold_allocator_rpc_duration_seconds_bucket",
        "leasehold_rpc_duration_seconds_bucket",
        "leasehold_allocator_sync_failures_total",
        "leasehold_give_backs_total",
        "leasehold_concurrency_total",
    ] {
        assert!(used.contains(name), "no panel shows {name}");
    }
}

#[test]
fn the_alert_rules_use_only_registered_metrics_and_cover_the_alarms() {
    let registered = registered();
    let rules = read("deploy/observability/alerts.yml");
    let mut exprs = 0;
    let mut lines = rules.lines().peekable();
    while let Some(line) = lines.next() {
        let Some(rest) = line.trim_start().strip_prefix("expr:") else {
            continue;
        };
        exprs += 1;
        // A block scalar (`expr: |`) continues on the more indented lines.
        let mut expr = rest.trim().trim_start_matches('|').to_string();
        let indent = line.len() - line.trim_start().len();
        while let Some(next) = lines.peek() {
            let next_indent = next.len() - next.trim_start().len();
            if next.trim().is_empty() || next_indent <= indent {
                break;
            }
            expr.push(' ');
            expr.push_str(next.trim());
            lines.next();
        }
        let names = metric_names(&expr);
        assert!(!names.is_empty(), "no Leasehold metric in {expr}");
        for name in names {
            assert!(
                known(&name, &registered),
                "{name} (in {expr}) is registered nowhere"
            );
        }
    }
    assert!(exprs >= 6, "{exprs} rules");
    for alert in [
        "LeaseholdShareRecordStale",
        "LeaseholdSharesAboveLimit",
        "LeaseholdFallbackDecisions",
        "LeaseholdFailOpenBypass",
        "LeaseholdBreakerOpen",
        "LeaseholdAllocatorUnreachable",
    ] {
        assert!(rules.contains(&format!("alert: {alert}")), "no {alert}");
    }
    assert!(
        rules.contains("Metering lag"),
        "metering lag is accounted for"
    );
}

#[test]
fn a_name_the_code_does_not_register_is_caught() {
    let registered = registered();
    assert!(known(
        "leasehold_allocator_rpc_duration_seconds_count",
        &registered
    ));
    assert!(!known("leasehold_allocator_raft_term_count", &registered));
    assert!(!known("leasehold_no_such_metric", &registered));
    assert_eq!(
        metric_names("sum(rate(leasehold_a_total[5m])) / xleasehold_b"),
        BTreeSet::from(["leasehold_a_total".to_string()])
    );
}
