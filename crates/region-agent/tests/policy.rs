//! Policy bundles (ARCHITECTURE §3.4–§3.6): every §3.6 rejection names its
//! file, line, rule and field; the shipped bundles parse; resolution order;
//! the holder never rolls back and never shows half a bundle; the file
//! watcher installs, refuses and ignores; random input never panics.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use leasehold_region_agent::policy::validate::TagKind;
use leasehold_region_agent::policy::{
    checksum, parse, spawn_file_watch, Algorithm, Bundle, FileWatch, InstallError, Installed,
    PolicyError, PolicyErrors, PolicyHolder, PollOutcome, Problem, RequestView, ResolveError,
    Scope, MAX_BUNDLE_BYTES, MAX_ERRORS,
};
use proptest::prelude::*;

const FILE: &str = "t.toml";

// ---------------------------------------------------------------- helpers

/// A bundle of one domain "api" holding `rules` (TOML text).
fn bundle_text(version: u64, rules: &str) -> String {
    format!("version = {version}\n\n[[domain]]\nname = \"api\"\n{rules}")
}

/// A token bucket rule, plus `extra` lines (which may override nothing:
/// use `rule_with` to choose every line).
fn bucket(id: &str, scope: &str, extra: &str) -> String {
    format!(
        "\n[[domain.rule]]\nid = \"{id}\"\nscope = \"{scope}\"\nalgorithm = \"token_bucket\"\n\
         capacity = 20\nrefill = 2\nperiod_ms = 1000\nfail_mode = \"open\"\n{extra}"
    )
}

/// A rule of exactly these lines.
fn rule_with(lines: &[&str]) -> String {
    format!("\n[[domain.rule]]\n{}\n", lines.join("\n"))
}

/// 1-based line of the only line containing `marker`.
fn line_of(text: &str, marker: &str) -> usize {
    let hits: Vec<usize> = text
        .lines()
        .enumerate()
        .filter(|(_, line)| line.contains(marker))
        .map(|(i, _)| i + 1)
        .collect();
    assert_eq!(
        hits.len(),
        1,
        "marker {marker:?} must be on exactly one line"
    );
    hits[0]
}

/// 1-based line of the `[[domain.rule]]` header of rule `id`.
fn header_of(text: &str, id: &str) -> usize {
    let id_line = line_of(text, &format!("id = \"{id}\""));
    text.lines()
        .take(id_line)
        .enumerate()
        .filter(|(_, line)| line.trim() == "[[domain.rule]]")
        .map(|(i, _)| i + 1)
        .last()
        .expect("a rule header before the id")
}

fn errors_of(text: &str) -> PolicyErrors {
    match parse(FILE, text, None) {
        Ok(bundle) => panic!("accepted an invalid bundle (version {})", bundle.version),
        Err(errors) => errors,
    }
}

/// The error about (rule, field); checks it names file, line, rule and
/// field in its message, and that the message contains `needle`.
fn rejected(text: &str, line: usize, rule: &str, field: &str, needle: &str) -> PolicyError {
    let errors = errors_of(text);
    let error = errors
        .errors()
        .iter()
        .find(|e| e.rule.as_deref() == Some(rule) && e.field.as_deref() == Some(field))
        .unwrap_or_else(|| panic!("no error for rule {rule} field {field} in:\n{errors}"))
        .clone();
    let message = error.to_string();
    let prefix = format!("{FILE}:{line}: rule {rule}: field {field}: ");
    assert!(
        message.starts_with(&prefix),
        "{message:?} should start with {prefix:?}"
    );
    assert!(
        message.contains(needle),
        "{message:?} should contain {needle:?}"
    );
    assert_eq!(error.line, Some(line));
    error
}

fn ok(text: &str) -> Bundle {
    parse(FILE, text, None).unwrap_or_else(|e| panic!("refused:\n{e}\n---\n{text}"))
}

fn deploy(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/policies")
        .join(name)
}

fn read_deploy(name: &str) -> String {
    std::fs::read_to_string(deploy(name)).expect("shipped bundle")
}

fn view<'a>(
    domain: &'a str,
    route_group: &'a str,
    method: &'a str,
    descriptors: &'a BTreeMap<String, String>,
) -> RequestView<'a> {
    RequestView {
        domain,
        route_group,
        method,
        descriptors,
    }
}

fn ids(rules: &[&leasehold_region_agent::policy::Rule]) -> Vec<String> {
    rules.iter().map(|r| r.id.as_str().to_string()).collect()
}

// ------------------------------------------------- §3.6 rejections, one each

#[test]
fn cost_above_capacity_is_refused_at_the_cost_line() {
    let text = bundle_text(1, &bucket("p-read", "user", "cost = 21"));
    rejected(
        &text,
        line_of(&text, "cost = 21"),
        "p-read",
        "cost",
        "exceeds capacity 20",
    );
}

#[test]
fn zero_refill_is_refused() {
    let text = bundle_text(
        1,
        &bucket("p-read", "user", "").replace("refill = 2", "refill = 0"),
    );
    let line = line_of(&text, "refill = 0");
    rejected(
        &text,
        line,
        "p-read",
        "refill",
        "must be an integer in [1, 1099511627]",
    );
}

#[test]
fn capacity_above_two_to_the_forty_millitokens_is_refused() {
    let text = bucket("p-read", "user", "").replace("capacity = 20", "capacity = 1099511628");
    let text = bundle_text(1, &text);
    let line = line_of(&text, "capacity = 1099511628");
    rejected(
        &text,
        line,
        "p-read",
        "capacity",
        "must be an integer in [1, 1099511627]",
    );
}

#[test]
fn capacity_times_period_above_two_to_the_fifty_two_is_refused() {
    // 1,000,000 tokens × 1000 × 10,000,000 ms = 10^16 > 2^52 ≈ 4.5 × 10^15.
    let rule = bucket("p-big", "tenant", "")
        .replace("capacity = 20", "capacity = 1000000")
        .replace("period_ms = 1000", "period_ms = 10000000");
    let text = bundle_text(1, &rule);
    let line = line_of(&text, "capacity = 1000000");
    rejected(&text, line, "p-big", "capacity", "exceeds 2^52");
}

#[test]
fn negative_and_non_integer_numbers_are_out_of_range() {
    let text = bundle_text(
        1,
        &bucket("p-read", "user", "slack_ms = -1\nidempotent_ttl_ms = 1.5"),
    );
    let line = line_of(&text, "slack_ms = -1");
    rejected(
        &text,
        line,
        "p-read",
        "slack_ms",
        "must be an integer in [0, 1099511627776]",
    );
    let line = line_of(&text, "idempotent_ttl_ms");
    rejected(
        &text,
        line,
        "p-read",
        "idempotent_ttl_ms",
        "[1, 1099511627776]",
    );
}

#[test]
fn missing_fail_mode_is_refused_at_the_rule() {
    let rule = bucket("p-read", "user", "").replace("fail_mode = \"open\"\n", "");
    let text = bundle_text(1, &rule);
    rejected(
        &text,
        header_of(&text, "p-read"),
        "p-read",
        "fail_mode",
        "missing",
    );
}

#[test]
fn unknown_fail_mode_is_refused() {
    let text = bundle_text(
        1,
        &bucket("p-read", "user", "").replace("\"open\"", "\"maybe\""),
    );
    let line = line_of(&text, "fail_mode");
    rejected(
        &text,
        line,
        "p-read",
        "fail_mode",
        "must be one of \"open\", \"closed\"",
    );
}

#[test]
fn rule_id_outside_the_charset_is_refused_and_the_rule_named_by_position() {
    let text = bundle_text(
        1,
        &format!(
            "{}{}",
            bucket("ok-1", "user", ""),
            bucket("P-Read", "user", "")
        ),
    );
    let line = line_of(&text, "P-Read");
    rejected(&text, line, "#2", "id", "must match [a-z0-9_-]{1,64}");
}

#[test]
fn domain_name_outside_the_charset_is_refused() {
    let text = bundle_text(1, &bucket("p-read", "user", "")).replace("\"api\"", "\"API_v1\"");
    let errors = errors_of(&text);
    let error = errors.first();
    assert_eq!(
        error.to_string(),
        format!("{FILE}:4: domain #1: field name: must match [a-z0-9-]{{1,30}}")
    );
}

#[test]
fn duplicate_domain_names_are_refused_at_the_second() {
    let one = bundle_text(1, &bucket("p-read", "user", ""));
    let text = format!("{one}\n[[domain]]\nname = \"api\" # again\n");
    let errors = errors_of(&text);
    let error = errors.first();
    assert_eq!(error.field.as_deref(), Some("name"));
    assert_eq!(error.domain.as_deref(), Some("api"));
    let line = line_of(&text, "# again");
    assert!(
        error.to_string().starts_with(&format!(
            "{FILE}:{line}: domain api: field name: duplicate (first at line 4)"
        )),
        "{error}"
    );
}

#[test]
fn duplicate_rule_ids_are_refused_at_the_second() {
    let text = bundle_text(
        1,
        &format!(
            "{}{}",
            bucket("p-read", "user", ""),
            bucket("p-read", "user", "# second")
        ),
    );
    let id_lines: Vec<usize> = text
        .lines()
        .enumerate()
        .filter(|(_, l)| l.trim() == "id = \"p-read\"")
        .map(|(i, _)| i + 1)
        .collect();
    let [first, second] = id_lines[..] else {
        panic!("two ids expected")
    };
    let error = rejected(
        &text,
        second,
        "p-read",
        "id",
        &format!("duplicate (first at line {first})"),
    );
    assert_eq!(
        error.problem,
        Problem::Duplicate {
            first_line: Some(first)
        }
    );
}

#[test]
fn version_zero_is_refused_at_line_one() {
    let text = bundle_text(0, &bucket("p-read", "user", ""));
    let error = errors_of(&text).first().clone();
    assert_eq!(
        error.to_string(),
        format!("{FILE}:1: field version: must be an integer in [1, 9223372036854775807]")
    );
}

#[test]
fn global_checked_rule_sharing_a_request_with_a_tenant_rule_spans_two_hash_tags() {
    let text = bundle_text(
        1,
        &format!(
            "{}{}",
            bucket("p-tenant", "tenant", ""),
            bucket("p-global", "global", "")
        ),
    );
    let line = line_of(&text, "scope = \"global\"");
    let tenant_line = header_of(&text, "p-tenant");
    rejected(
        &text,
        line,
        "p-global",
        "scope",
        &format!("rule p-tenant (at line {tenant_line}) whose hash tag is the tenant, while this rule's is g-api"),
    );
}

#[test]
fn global_rule_is_fine_when_leased_or_on_a_disjoint_route() {
    let leased = bucket("p-global", "global", "leased = { gateways = 1 }")
        .replace("capacity = 20", "capacity = 100");
    ok(&bundle_text(
        1,
        &format!("{}{leased}", bucket("p-tenant", "tenant", "")),
    ));
    let read = bucket("p-read", "user", "match = { route_group = \"read\" }");
    let catalog = bucket(
        "p-catalog",
        "global",
        "match = { route_group = \"catalog\" }",
    );
    ok(&bundle_text(1, &format!("{read}{catalog}")));
}

#[test]
fn nine_checked_rules_sharing_a_request_are_refused_eight_are_fine() {
    let rules = |n: usize| {
        (1..=n)
            .map(|i| bucket(&format!("t{i}"), "tenant", ""))
            .collect::<String>()
    };
    ok(&bundle_text(1, &rules(8)));
    let text = bundle_text(1, &rules(9));
    let line = header_of(&text, "t1");
    rejected(
        &text,
        line,
        "t1",
        "match",
        "can share a request with 9 checked rules (itself included), at most 8",
    );
    assert_eq!(
        errors_of(&text).errors().len(),
        9,
        "one error per rule of the cluster"
    );
}

#[test]
fn rules_on_different_methods_never_share_a_request() {
    let rules = (1..=9)
        .map(|i| {
            let method = if i % 2 == 0 { "GET" } else { "POST" };
            bucket(
                &format!("t{i}"),
                "tenant",
                &format!("match = {{ method = \"{method}\" }}"),
            )
        })
        .collect::<String>();
    ok(&bundle_text(1, &rules));
}

#[test]
fn non_token_bucket_checked_rule_cannot_share_a_request() {
    let window = rule_with(&[
        "id = \"w\"",
        "scope = \"user\"",
        "algorithm = \"fixed_window\"",
        "capacity = 10",
        "period_ms = 60000",
        "fail_mode = \"closed\"",
    ]);
    let text = bundle_text(1, &format!("{}{window}", bucket("p-tenant", "tenant", "")));
    let line = line_of(&text, "fixed_window");
    let tenant_line = header_of(&text, "p-tenant");
    let needle = format!("a fixed_window rule can share a request with checked rule p-tenant (at line {tenant_line})");
    rejected(&text, line, "w", "algorithm", &needle);
    // Alone (a disjoint route), the same rule is fine.
    let alone = window.replace(
        "fail_mode",
        "match = { route_group = \"login\" }\nfail_mode",
    );
    ok(&bundle_text(
        1,
        &format!(
            "{}{alone}",
            bucket("p-tenant", "tenant", "match = { route_group = \"read\" }")
        ),
    ));
}

#[test]
fn leased_is_only_for_plain_token_buckets() {
    let gcra = bucket("g", "tenant", "leased = { gateways = 2 }").replace("token_bucket", "gcra");
    let text = bundle_text(1, &gcra);
    rejected(
        &text,
        line_of(&text, "leased"),
        "g",
        "leased",
        "only a token_bucket rule can be leased",
    );
    let text = bundle_text(
        1,
        &bucket("s", "tenant", "security = true\nleased = { gateways = 2 }"),
    );
    rejected(
        &text,
        line_of(&text, "leased"),
        "s",
        "leased",
        "security rules are never leased",
    );
    let text = bundle_text(
        1,
        &bucket("d", "tenant", "shadow = true\nleased = { gateways = 2 }"),
    );
    rejected(
        &text,
        line_of(&text, "leased"),
        "d",
        "leased",
        "shadow rules are never leased",
    );
}

#[test]
fn leased_block_larger_than_the_capacity_is_refused() {
    // B = max(10, ..) = 10 > capacity 5: no gateway could ever lease a block.
    let rule = bucket("small", "tenant", "leased = { gateways = 2 }")
        .replace("capacity = 20", "capacity = 5");
    let text = bundle_text(1, &rule);
    rejected(
        &text,
        line_of(&text, "leased"),
        "small",
        "leased",
        "block of 10 tokens exceeds capacity 5",
    );
}

#[test]
fn concurrency_cap_must_come_with_the_concurrency_algorithm_and_only_with_it() {
    let missing = rule_with(&[
        "id = \"c\"",
        "scope = \"tenant\"",
        "algorithm = \"concurrency\"",
        "fail_mode = \"closed\"",
    ]);
    let text = bundle_text(1, &missing);
    rejected(&text, header_of(&text, "c"), "c", "concurrency", "missing");
    let stray = bucket(
        "b",
        "tenant",
        "concurrency = { max_in_flight = 3, lease_ttl_ms = 1000 }",
    );
    let text = bundle_text(1, &stray);
    let line = line_of(&text, "max_in_flight");
    rejected(
        &text,
        line,
        "b",
        "concurrency",
        "only for algorithm = \"concurrency\"",
    );
}

#[test]
fn max_in_flight_above_one_hundred_thousand_is_refused() {
    let rule = rule_with(&[
        "id = \"c\"",
        "scope = \"tenant\"",
        "algorithm = \"concurrency\"",
        "concurrency = { max_in_flight = 100001, lease_ttl_ms = 60000 }",
        "fail_mode = \"closed\"",
    ]);
    let text = bundle_text(1, &rule);
    let line = line_of(&text, "max_in_flight");
    rejected(
        &text,
        line,
        "c",
        "concurrency.max_in_flight",
        "must be an integer in [1, 100000]",
    );
}

#[test]
fn concurrency_rule_takes_no_rate_fields() {
    let rule = rule_with(&[
        "id = \"c\"",
        "scope = \"tenant\"",
        "algorithm = \"concurrency\"",
        "capacity = 3",
        "concurrency = { max_in_flight = 3, lease_ttl_ms = 60000 }",
        "fail_mode = \"closed\"",
    ]);
    let text = bundle_text(1, &rule);
    rejected(
        &text,
        line_of(&text, "capacity = 3"),
        "c",
        "capacity",
        "its limit is concurrency.max_in_flight",
    );
}

#[test]
fn invalid_local_fail_mode_rate_is_refused() {
    let local = "fail_mode = { local = { capacity = 5, refill = 0, period_ms = 4000 } }";
    let text = bundle_text(
        1,
        &bucket("p-read", "user", "").replace("fail_mode = \"open\"", local),
    );
    let line = line_of(&text, "local");
    rejected(
        &text,
        line,
        "p-read",
        "fail_mode.local.refill",
        "must be an integer in [1, 1099511627]",
    );
    // A local bucket smaller than the cost could never admit.
    let local = "fail_mode = { local = { capacity = 5, refill = 1, period_ms = 4000 } }\ncost = 6";
    let text = bundle_text(
        1,
        &bucket("p-read", "user", "").replace("fail_mode = \"open\"", local),
    );
    let line = line_of(&text, "local");
    rejected(
        &text,
        line,
        "p-read",
        "fail_mode.local.capacity",
        "cost 6 exceeds capacity 5",
    );
    // Missing part of the local rate, written as a sub-table: the line is the field's.
    let rule = bucket("p-read", "user", "").replace("fail_mode = \"open\"\n", "")
        + "[domain.rule.fail_mode.local]\ncapacity = 5\nrefill = 1\n";
    let text = bundle_text(1, &rule);
    let line = line_of(&text, "[domain.rule.fail_mode.local]");
    rejected(
        &text,
        line,
        "p-read",
        "fail_mode.local.period_ms",
        "missing",
    );
}

#[test]
fn unknown_fields_are_refused_wherever_they_are() {
    let text = bundle_text(
        1,
        &bucket("p-read", "user", "burst = 5\nmatch = { route = \"x\" }"),
    );
    rejected(
        &text,
        line_of(&text, "burst"),
        "p-read",
        "burst",
        "unknown field",
    );
    rejected(
        &text,
        line_of(&text, "route ="),
        "p-read",
        "match.route",
        "unknown field",
    );
    let text = format!(
        "owner = \"me\"\n{}",
        bundle_text(1, &bucket("p-read", "user", ""))
    );
    assert_eq!(
        errors_of(&text).first().to_string(),
        format!("{FILE}:1: field owner: unknown field")
    );
}

#[test]
fn window_algorithm_refill_must_equal_capacity() {
    let rule = bucket("w", "user", "").replace("token_bucket", "sliding_counter");
    let text = bundle_text(1, &rule);
    rejected(
        &text,
        line_of(&text, "refill = 2"),
        "w",
        "refill",
        "must equal capacity (20) for a window algorithm",
    );
}

#[test]
fn sliding_log_cost_must_be_one() {
    let rule = bucket("log", "user", "cost = 2")
        .replace("token_bucket", "sliding_log")
        .replace("refill = 2\n", "");
    let text = bundle_text(1, &rule);
    rejected(
        &text,
        line_of(&text, "cost = 2"),
        "log",
        "cost",
        "must be 1 for sliding_log",
    );
}

#[test]
fn unknown_scope_or_algorithm_names_the_choices() {
    let text = bundle_text(
        1,
        &bucket("p", "planet", "").replace("token_bucket", "leaky"),
    );
    rejected(
        &text,
        line_of(&text, "planet"),
        "p",
        "scope",
        "must be one of \"user\", \"route\", \"tenant\", \"global\"",
    );
    rejected(
        &text,
        line_of(&text, "leaky"),
        "p",
        "algorithm",
        "\"token_bucket\", \"fixed_window\"",
    );
}

#[test]
fn route_scope_needs_a_route_group() {
    let text = bundle_text(1, &bucket("p-export", "route", ""));
    rejected(
        &text,
        header_of(&text, "p-export"),
        "p-export",
        "match.route_group",
        "missing",
    );
}

#[test]
fn bad_match_values_are_refused_at_their_line() {
    let matcher = "match = { method = \"get\", descriptors = { \"Plan Tier\" = \"gold\" } }";
    let text = bundle_text(1, &bucket("p", "user", matcher));
    let line = line_of(&text, "match");
    rejected(&text, line, "p", "match.method", "must match [A-Z]{1,64}");
    rejected(
        &text,
        line,
        "p",
        "match.descriptors.Plan Tier",
        "must match [a-z0-9_.-]{1,64}",
    );
}

#[test]
fn wrong_types_are_refused() {
    let text = bundle_text(1, &bucket("p", "user", "shadow = \"yes\"\nmatch = 3"));
    rejected(
        &text,
        line_of(&text, "shadow"),
        "p",
        "shadow",
        "must be true or false",
    );
    rejected(
        &text,
        line_of(&text, "match = 3"),
        "p",
        "match",
        "must be a table",
    );
}

#[test]
fn toml_syntax_errors_carry_file_and_line() {
    let text = bundle_text(1, &bucket("p", "user", "cost = = 3"));
    let error = errors_of(&text).first().clone();
    let line = line_of(&text, "cost = = 3");
    assert!(matches!(error.problem, Problem::Syntax(_)), "{error}");
    assert!(
        error.to_string().starts_with(&format!("{FILE}:{line}: ")),
        "{error}"
    );
}

#[test]
fn a_bundle_needs_a_domain_and_a_version() {
    let error = errors_of("version = 3\n").first().clone();
    assert_eq!(
        error.to_string(),
        format!("{FILE}:1: field domain: missing (required)")
    );
    let text = bundle_text(1, &bucket("p", "user", "")).replace("version = 1\n", "");
    assert_eq!(
        errors_of(&text).first().to_string(),
        format!("{FILE}:1: field version: missing (required)")
    );
}

#[test]
fn every_error_is_reported_up_to_twenty() {
    let text = bundle_text(
        1,
        &format!(
            "{}{}",
            bucket("a", "user", "cost = 99"),
            bucket("b", "user", "").replace("refill = 2", "refill = 0")
        ),
    )
    .replace("version = 1", "version = 0");
    let errors = errors_of(&text);
    let fields: Vec<_> = errors
        .errors()
        .iter()
        .map(|e| e.field.clone().unwrap())
        .collect();
    assert_eq!(fields, ["version", "cost", "refill"], "{errors}");
    assert_eq!(errors.to_string().lines().count(), 3);

    let many = (1..=30)
        .map(|i| {
            bucket(
                &format!("r{i}"),
                "user",
                "match = { route_group = \"x\" }\ncost = 99",
            )
            .replace("route_group = \"x\"", &format!("route_group = \"g{i}\""))
        })
        .collect::<String>();
    let errors = errors_of(&bundle_text(1, &many));
    assert_eq!(errors.errors().len(), MAX_ERRORS);
    assert_eq!(errors.omitted(), 10);
    assert!(
        errors.to_string().ends_with("(and 10 more errors)"),
        "{errors}"
    );
}

#[test]
fn bundle_over_one_mebibyte_is_refused_unread() {
    let text = format!(
        "{}\n#{}",
        bundle_text(1, &bucket("p", "user", "")),
        "x".repeat(MAX_BUNDLE_BYTES)
    );
    let error = errors_of(&text).first().clone();
    assert!(
        matches!(
            error.problem,
            Problem::TooLarge {
                max_bytes: MAX_BUNDLE_BYTES,
                ..
            }
        ),
        "{error}"
    );
    assert!(
        error
            .to_string()
            .starts_with(&format!("{FILE}: bundle is ")),
        "{error}"
    );
}

// ------------------------------------------------------------- checksums

#[test]
fn checksum_is_the_sha256_of_the_exact_text_and_a_mismatch_is_refused() {
    let text = read_deploy("dev.toml");
    let sum = checksum(&text);
    assert_eq!(sum.len(), 64);
    assert_eq!(ok(&text).checksum, sum);
    let upper = format!("  {}\n", sum.to_ascii_uppercase());
    assert_eq!(parse(FILE, &text, Some(&upper)).unwrap().checksum, sum);
    let other = checksum(&format!("{text} "));
    assert_ne!(other, sum);
    let error = parse(FILE, &text, Some(&other))
        .unwrap_err()
        .first()
        .clone();
    assert_eq!(
        error.problem,
        Problem::ChecksumMismatch {
            expected: other.clone(),
            actual: sum.clone()
        }
    );
    assert!(
        error
            .to_string()
            .starts_with(&format!("{FILE}: sha256 {sum} does not match")),
        "{error}"
    );
    let error = parse(FILE, &text, Some("abc")).unwrap_err().first().clone();
    assert_eq!(error.problem, Problem::BadExpectedChecksum);
}

// ------------------------------------------------- shipped bundles, resolve

#[test]
fn shipped_bundles_parse() {
    let dev = parse("dev.toml", &read_deploy("dev.toml"), None).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(dev.source, "dev.toml");
    let api = &dev.domains["api"];
    let read = dev.rule("api", "p-read").unwrap();
    assert_eq!(
        (
            read.scope,
            read.rate.capacity_tokens,
            read.rate.refill_tokens,
            read.rate.period_ms
        ),
        (Scope::User, 20, 2, 1000)
    );
    assert!(matches!(
        read.fail_mode,
        leasehold_region_agent::policy::FailMode::Local(_)
    ));
    let export = dev.rule("api", "p-export").unwrap();
    assert_eq!((export.scope, export.cost_tokens), (Scope::Route, 10));
    assert_eq!(
        export.fail_mode,
        leasehold_region_agent::policy::FailMode::Closed
    );
    assert_eq!(dev.rule("api", "p-tenant").unwrap().scope, Scope::Tenant);
    let global = dev.rule("api", "p-global").unwrap();
    assert_eq!(
        (global.scope, global.leased.map(|l| l.gateways)),
        (Scope::Global, Some(4))
    );
    assert_eq!(api.rules.len(), 4);
    assert!(dev.rule("api", "nope").is_none() && dev.rule("nope", "p-read").is_none());

    let example =
        parse("example.toml", &read_deploy("example.toml"), None).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(example.version, 42);
    let algorithms: BTreeSet<_> = example
        .domains
        .values()
        .flat_map(|d| d.rules.iter().map(|r| r.algorithm.as_str()))
        .collect();
    let all: BTreeSet<_> = Algorithm::ALL.iter().map(|a| a.as_str()).collect();
    assert_eq!(algorithms, all, "example.toml shows every algorithm");
    let rules: Vec<_> = example.domains.values().flat_map(|d| &d.rules).collect();
    assert!(rules.iter().any(|r| r.shadow) && rules.iter().any(|r| r.security));
    assert!(rules.iter().any(|r| r.idempotent_ttl_ms.is_some()));
    assert!(rules.iter().any(|r| !r.matcher.descriptors.is_empty()));
    let scopes: BTreeSet<_> = rules.iter().map(|r| r.scope).collect();
    assert_eq!(scopes.len(), 4, "every scope");
    assert!(
        example
            .domains
            .values()
            .any(|d| d.envoy != Default::default()),
        "example.toml shows [domain.envoy]"
    );
    assert_eq!(example.check(), Ok(()));
}

#[test]
fn resolution_orders_user_route_tenant_global_and_splits_the_kinds() {
    // File order is the reverse of scope order within each kind.
    let leased = |id: &str, scope: &str| {
        bucket(
            id,
            scope,
            "leased = { gateways = 1 }\nmatch = { route_group = \"read\" }",
        )
        .replace("capacity = 20", "capacity = 100")
    };
    let read = "match = { route_group = \"read\" }";
    let rules = [
        leased("l-global", "global"),
        leased("l-tenant", "tenant"),
        bucket("c-tenant", "tenant", ""),
        bucket("c-route", "route", read),
        leased("l-route", "route"),
        bucket("c-user", "user", read),
        bucket("c-tenant-2", "tenant", ""),
        leased("l-user", "user"),
        rule_with(&[
            "id = \"k\"",
            "scope = \"tenant\"",
            "algorithm = \"concurrency\"",
            "concurrency = { max_in_flight = 3, lease_ttl_ms = 60000 }",
            "fail_mode = \"closed\"",
        ]),
        bucket(
            "other-route",
            "user",
            "match = { route_group = \"export\" }",
        ),
    ]
    .concat();
    let bundle = ok(&bundle_text(1, &rules));
    let none = BTreeMap::new();
    let resolved = bundle.resolve(&view("api", "read", "GET", &none)).unwrap();
    assert_eq!(
        ids(&resolved.checked),
        ["c-user", "c-route", "c-tenant", "c-tenant-2"]
    );
    assert_eq!(
        ids(&resolved.leased),
        ["l-user", "l-route", "l-tenant", "l-global"]
    );
    assert_eq!(ids(&resolved.concurrency), ["k"]);
    // A request with no route group sees only the rules that set none.
    let resolved = bundle.resolve(&view("api", "", "", &none)).unwrap();
    assert_eq!(ids(&resolved.checked), ["c-tenant", "c-tenant-2"]);
    assert!(resolved.leased.is_empty());
}

#[test]
fn resolution_of_the_example_matches_methods_and_descriptors() {
    let bundle = ok(&read_deploy("example.toml"));
    let gold: BTreeMap<String, String> = [("plan".to_string(), "gold".to_string())].into();
    let none = BTreeMap::new();
    let read = bundle.resolve(&view("api", "read", "get", &gold)).unwrap();
    assert_eq!(ids(&read.checked), ["p-read", "p-tenant", "p-gold-trial"]);
    let post = bundle.resolve(&view("api", "read", "POST", &none)).unwrap();
    assert_eq!(ids(&post.checked), ["p-tenant"]);
    let export = bundle
        .resolve(&view("api", "export", "POST", &none))
        .unwrap();
    assert_eq!(ids(&export.checked), ["p-export", "p-tenant"]);
    assert_eq!(ids(&export.concurrency), ["p-export-inflight"]);
    let catalog = bundle
        .resolve(&view("api", "catalog", "GET", &none))
        .unwrap();
    assert_eq!(
        (ids(&catalog.checked), ids(&catalog.leased)),
        (vec!["p-tenant".to_string()], vec!["p-global".to_string()])
    );
    let signup = bundle
        .resolve(&view("auth", "signup", "POST", &none))
        .unwrap();
    assert!(signup.is_empty(), "the descriptor source=web is absent");
    let web: BTreeMap<String, String> = [("source".to_string(), "web".to_string())].into();
    let signup = bundle
        .resolve(&view("auth", "signup", "POST", &web))
        .unwrap();
    assert_eq!(ids(&signup.checked), ["signup-global"]);
    assert_eq!(
        bundle.domains["auth"].global_tag().unwrap().as_str(),
        "g-auth"
    );
}

#[test]
fn unknown_domain_is_an_error() {
    let bundle = ok(&read_deploy("dev.toml"));
    let none = BTreeMap::new();
    assert_eq!(
        bundle.resolve(&view("billing", "read", "GET", &none)),
        Err(ResolveError::UnknownDomain("billing".into()))
    );
}

#[test]
fn hand_built_bundles_are_checked_and_never_resolve_past_eight() {
    let mut bundle = ok(&bundle_text(1, &bucket("p-read", "user", "")));
    assert_eq!(bundle.check(), Ok(()));
    let rules = &mut bundle.domains.get_mut("api").unwrap().rules;
    rules[0].cost_tokens = 21;
    let errors = bundle.check().unwrap_err();
    assert_eq!(
        errors.first().to_string(),
        format!("{FILE}: rule p-read: field cost: cost 21 exceeds capacity 20: no request could ever pass")
    );
    // Nine co-matching checked rules: `parse` refuses them, `resolve` too.
    let rules = &mut bundle.domains.get_mut("api").unwrap().rules;
    rules[0].cost_tokens = 1;
    let template = rules[0].clone();
    for i in 1..9 {
        let mut rule = template.clone();
        rule.id = leasehold_region_agent::key::RuleId::parse(&format!("r{i}")).unwrap();
        rules.push(rule);
    }
    assert!(bundle.check().is_err());
    let none = BTreeMap::new();
    assert_eq!(
        bundle.resolve(&view("api", "", "", &none)),
        Err(ResolveError::TooManyRules { count: 9, max: 8 })
    );
}

// ------------------------------------------------------------ block size

#[test]
fn block_is_a_quarter_second_of_rate_over_gateways_at_least_ten() {
    // r = 10,000/s, N = 20: ceil(0.25 × 10,000 / 20) = 125.
    let fast = bucket("fast", "global", "leased = { gateways = 20 }")
        .replace("capacity = 20", "capacity = 10000")
        .replace("refill = 2", "refill = 10000");
    // r = 1/s, N = 1: ceil(0.25) = 1, raised to 10.
    let slow = bucket(
        "slow",
        "global",
        "leased = { gateways = 1 }\nmatch = { route_group = \"x\" }",
    )
    .replace("refill = 2", "refill = 1");
    let bundle = ok(&bundle_text(1, &format!("{fast}{slow}")));
    assert_eq!(
        bundle.rule("api", "fast").unwrap().block_tokens(),
        Some(125)
    );
    assert_eq!(bundle.rule("api", "slow").unwrap().block_tokens(), Some(10));
    assert_eq!(
        bundle.rule("api", "fast").map(|r| r.is_checked()),
        Some(false)
    );
}

// ---------------------------------------------------------------- holder

fn versioned(version: u64) -> Bundle {
    ok(&bundle_text(version, &bucket("p-read", "user", "")))
}

#[test]
fn holder_accepts_only_a_higher_version() {
    let holder = PolicyHolder::new(versioned(5));
    assert_eq!(
        holder.install(versioned(6)),
        Ok(Installed::Switched {
            previous_version: 5,
            version: 6
        })
    );
    assert_eq!(
        holder.install(versioned(4)),
        Err(InstallError::Stale {
            current: 6,
            offered: 4
        })
    );
    assert_eq!(holder.current().version, 6);
    assert_eq!(
        holder.install(versioned(6)),
        Ok(Installed::Unchanged { version: 6 })
    );
}

#[test]
fn holder_refuses_a_second_content_for_the_same_version() {
    let holder = PolicyHolder::new(versioned(5));
    let before = holder.current();
    let other = ok(&bundle_text(5, &bucket("p-read", "user", "cost = 2")));
    match holder.install(other) {
        Err(InstallError::Conflict {
            version: 5,
            current_checksum,
            offered_checksum,
        }) => {
            assert_eq!(current_checksum, before.checksum);
            assert_ne!(offered_checksum, before.checksum);
        }
        other => panic!("expected a conflict, got {other:?}"),
    }
    assert!(Arc::ptr_eq(&before, &holder.current()), "nothing changed");
}

#[test]
fn concurrent_readers_always_see_a_whole_bundle_and_never_go_back() {
    const LAST: u64 = 60;
    let bundles: Vec<Bundle> = (1..=LAST).map(versioned).collect();
    let checksums: BTreeMap<u64, String> = bundles
        .iter()
        .map(|b| (b.version, b.checksum.clone()))
        .collect();
    let checksums = Arc::new(checksums);
    let holder = Arc::new(PolicyHolder::new(bundles[0].clone()));
    let done = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..4)
        .map(|_| {
            let (holder, done, checksums) = (holder.clone(), done.clone(), checksums.clone());
            std::thread::spawn(move || {
                let mut last = 0;
                let mut reads = 0u64;
                loop {
                    let finished = done.load(Ordering::Acquire);
                    let bundle = holder.current();
                    assert_eq!(
                        checksums.get(&bundle.version),
                        Some(&bundle.checksum),
                        "a torn bundle"
                    );
                    assert!(
                        bundle.version >= last,
                        "went back from {last} to {}",
                        bundle.version
                    );
                    last = bundle.version;
                    reads += 1;
                    if finished {
                        return (last, reads);
                    }
                }
            })
        })
        .collect();
    // Installs interleaved with stale offers, which must change nothing.
    for (i, bundle) in bundles.iter().enumerate().skip(1) {
        holder.install(bundle.clone()).unwrap();
        let stale = holder.install(bundles[i / 2].clone());
        assert!(
            matches!(stale, Err(InstallError::Stale { .. })),
            "{stale:?}"
        );
        std::thread::yield_now();
    }
    done.store(true, Ordering::Release);
    for reader in readers {
        let (last, reads) = reader.join().expect("reader");
        assert_eq!(last, LAST);
        assert!(reads >= 1);
    }
}

// --------------------------------------------------------------- watcher

/// Replaces the file's content at once (write aside, rename).
fn write_atomically(path: &Path, text: &str) {
    let aside = path.with_extension("tmp");
    std::fs::write(&aside, text).unwrap();
    std::fs::rename(&aside, path).unwrap();
}

#[test]
fn file_watch_installs_higher_refuses_invalid_and_ignores_lower() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bundle.toml");
    write_atomically(&path, &bundle_text(2, &bucket("p-read", "user", "")));
    let holder = Arc::new(PolicyHolder::new(versioned(1)));
    let mut watch = FileWatch::new(path.clone(), holder.clone());
    assert_eq!(
        watch.poll(),
        PollOutcome::Installed(Installed::Switched {
            previous_version: 1,
            version: 2
        })
    );
    assert_eq!(watch.poll(), PollOutcome::Same);

    write_atomically(
        &path,
        &bundle_text(3, &bucket("p-read", "user", "cost = 99")),
    );
    match watch.poll() {
        PollOutcome::Refused(errors) => {
            assert_eq!(
                errors.first().to_string().split(": field").next(),
                Some("bundle.toml:14: rule p-read")
            );
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(
        watch.poll(),
        PollOutcome::Same,
        "an unchanged bad file is looked at once"
    );
    assert_eq!(holder.version(), 2);

    write_atomically(&path, &bundle_text(1, &bucket("p-read", "user", "")));
    assert_eq!(
        watch.poll(),
        PollOutcome::NotInstalled(InstallError::Stale {
            current: 2,
            offered: 1
        })
    );
    assert_eq!(holder.version(), 2);
}

#[test]
fn file_watch_verifies_the_sidecar_checksum() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bundle.toml");
    let text = bundle_text(2, &bucket("p-read", "user", ""));
    write_atomically(&path, &text);
    let sidecar = dir.path().join("bundle.toml.sha256");
    std::fs::write(
        &sidecar,
        format!("{}  bundle.toml\n", checksum("something else")),
    )
    .unwrap();
    let holder = Arc::new(PolicyHolder::new(versioned(1)));
    let mut watch = FileWatch::new(path.clone(), holder.clone());
    match watch.poll() {
        PollOutcome::Refused(errors) => {
            assert!(
                matches!(errors.first().problem, Problem::ChecksumMismatch { .. }),
                "{errors}"
            )
        }
        other => panic!("expected a checksum refusal, got {other:?}"),
    }
    assert_eq!(holder.version(), 1);
    // Fixing the sidecar alone is enough: it is part of what is watched.
    std::fs::write(&sidecar, format!("{}\n", checksum(&text))).unwrap();
    assert_eq!(
        watch.poll(),
        PollOutcome::Installed(Installed::Switched {
            previous_version: 1,
            version: 2
        })
    );
}

#[test]
fn file_watch_refuses_a_file_over_the_cap_and_a_missing_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bundle.toml");
    let holder = Arc::new(PolicyHolder::new(versioned(1)));
    let mut watch = FileWatch::new(path.clone(), holder.clone());
    assert!(
        matches!(watch.poll(), PollOutcome::Refused(e) if matches!(e.first().problem, Problem::Io(_)))
    );
    std::fs::write(&path, "#".repeat(MAX_BUNDLE_BYTES + 1)).unwrap();
    match watch.poll() {
        PollOutcome::Refused(errors) => assert_eq!(
            errors.first().problem,
            Problem::TooLarge {
                bytes: MAX_BUNDLE_BYTES as u64 + 1,
                max_bytes: MAX_BUNDLE_BYTES
            }
        ),
        other => panic!("expected a size refusal, got {other:?}"),
    }
    assert_eq!(holder.version(), 1);
}

/// Polls `condition` every 10 ms, at most 5 s; returns whether it held.
async fn eventually(mut condition: impl FnMut() -> bool) -> bool {
    for _ in 0..500 {
        if condition() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    condition()
}

/// Samples `condition` every 10 ms for 30 samples (many watcher polls);
/// returns whether it held at every sample.
async fn throughout(mut condition: impl FnMut() -> bool) -> bool {
    for _ in 0..30 {
        if !condition() {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    condition()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawned_watch_reloads_a_changed_file_and_keeps_the_bundle_on_bad_ones() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bundle.toml");
    write_atomically(&path, &bundle_text(1, &bucket("p-read", "user", "")));
    let holder = Arc::new(PolicyHolder::new(versioned(1)));
    let task = spawn_file_watch(path.clone(), holder.clone(), Duration::from_millis(10));

    write_atomically(&path, &bundle_text(2, &bucket("p-read", "user", "")));
    assert!(
        eventually(|| holder.version() == 2).await,
        "version 2 installed"
    );
    let installed = holder.current();

    // Invalid, then lower: the bundle in force stays through many polls.
    // (FileWatch tests above prove each look refuses them; this proves the
    // spawned loop keeps going.)
    write_atomically(
        &path,
        &bundle_text(3, &bucket("p-read", "user", "cost = 99")),
    );
    let kept = throughout(|| Arc::ptr_eq(&installed, &holder.current())).await;
    assert!(kept, "an invalid bundle replaced version 2");
    write_atomically(
        &path,
        &bundle_text(1, &bucket("p-read", "user", "cost = 3")),
    );
    let kept = throughout(|| Arc::ptr_eq(&installed, &holder.current())).await;
    assert!(kept, "a lower version replaced version 2");
    write_atomically(
        &path,
        &bundle_text(4, &bucket("p-read", "user", "cost = 4")),
    );
    assert!(
        eventually(|| holder.version() == 4).await,
        "version 4 installed after bad ones"
    );
    assert_eq!(
        holder.current().rule("api", "p-read").unwrap().cost_tokens,
        4
    );
    task.abort();
}

// -------------------------------------------------------------- proptest

/// What every parsed bundle must satisfy, checked from outside.
fn assert_invariants(text: &str, bundle: &Bundle) {
    assert_eq!(bundle.checksum, checksum(text));
    assert!(bundle.version >= 1);
    assert_eq!(bundle.check(), Ok(()));
    for (name, domain) in &bundle.domains {
        assert_eq!(name, &domain.name);
        // Requests built from every value the domain's rules mention.
        let mut groups: BTreeSet<&str> = ["", "zz"].into();
        let mut methods: BTreeSet<&str> = ["", "GET"].into();
        let mut descriptors = BTreeMap::new();
        for rule in &domain.rules {
            groups.extend(rule.matcher.route_group.as_deref());
            methods.extend(rule.matcher.method.as_deref());
            descriptors.extend(rule.matcher.descriptors.clone());
        }
        let empty = BTreeMap::new();
        for group in &groups {
            for method in &methods {
                for descriptors in [&empty, &descriptors] {
                    let resolved = bundle
                        .resolve(&view(name, group, method, descriptors))
                        .unwrap();
                    assert!(resolved.checked.len() <= 8 && resolved.leased.len() <= 8);
                    assert!(resolved.concurrency.len() <= 8);
                    let tags: BTreeSet<_> = resolved
                        .checked
                        .iter()
                        .map(|r| r.scope.tag_kind() == TagKind::Global)
                        .collect();
                    assert!(tags.len() <= 1, "one hash tag per request");
                    if resolved
                        .checked
                        .iter()
                        .any(|r| r.algorithm != Algorithm::TokenBucket)
                    {
                        assert_eq!(resolved.checked.len(), 1);
                    }
                    for list in [&resolved.checked, &resolved.leased, &resolved.concurrency] {
                        assert!(list.windows(2).all(|w| w[0].scope <= w[1].scope));
                    }
                }
            }
        }
        for rule in &domain.rules {
            assert!(rule.cost_tokens <= rule.rate.capacity_tokens);
            assert!(rule.rate.refill_tokens >= 1);
            assert!(rule
                .block_tokens()
                .is_none_or(|b| b <= rule.rate.capacity_tokens));
        }
    }
}

const SNIPPETS: &[&str] = &[
    "0",
    "-1",
    "1",
    "21",
    "1099511628",
    "9223372036854775807",
    "1.5",
    "\"global\"",
    "\"tenant\"",
    "\"gcra\"",
    "true",
    "\n[[domain.rule]]\n",
    "\n[[domain]]\nname = \"api\"\n",
    "leased = { gateways = 3 }\n",
    "=",
    "{",
    "}",
    "[",
    "\"",
    "\n",
    "#",
    "concurrency = { max_in_flight = 2, lease_ttl_ms = 5 }\n",
    "1979-05-27",
    "\u{e9}",
    "security = true\n",
    "shadow = true\n",
    "match = { route_group = \"read\" }\n",
];

#[derive(Debug, Clone)]
enum Mutation {
    Insert { at: usize, snippet: usize },
    Delete { at: usize, len: usize },
    DuplicateLine { line: usize },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 0..SNIPPETS.len())
            .prop_map(|(at, snippet)| Mutation::Insert { at, snippet }),
        (any::<usize>(), 1..40usize).prop_map(|(at, len)| Mutation::Delete { at, len }),
        any::<usize>().prop_map(|line| Mutation::DuplicateLine { line }),
    ]
}

fn apply(text: &str, mutation: &Mutation) -> String {
    let boundary = |at: usize| {
        let mut at = at % (text.len() + 1);
        while !text.is_char_boundary(at) {
            at -= 1;
        }
        at
    };
    match *mutation {
        Mutation::Insert { at, snippet } => {
            let at = boundary(at);
            format!("{}{}{}", &text[..at], SNIPPETS[snippet], &text[at..])
        }
        Mutation::Delete { at, len } => {
            let start = boundary(at);
            let end = boundary(start + len.min(text.len() - start));
            format!("{}{}", &text[..start], &text[end.max(start)..])
        }
        Mutation::DuplicateLine { line } => {
            let lines: Vec<&str> = text.lines().collect();
            let line = line % lines.len().max(1);
            let mut out: Vec<&str> = lines.clone();
            if let Some(copy) = lines.get(line) {
                out.insert(line, copy);
            }
            out.join("\n")
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let text = String::from_utf8_lossy(&bytes);
        if let Ok(bundle) = parse(FILE, &text, None) {
            assert_invariants(&text, &bundle);
        }
    }

    #[test]
    fn mutated_bundles_parse_to_valid_bundles_or_errors(
        base in prop::sample::select(vec!["dev.toml", "example.toml"]),
        mutations in prop::collection::vec(mutation(), 1..5),
    ) {
        let mut text = read_deploy(base);
        for m in &mutations {
            text = apply(&text, m);
        }
        match parse(FILE, &text, None) {
            Ok(bundle) => assert_invariants(&text, &bundle),
            Err(errors) => {
                prop_assert!(!errors.errors().is_empty() && errors.errors().len() <= MAX_ERRORS);
                for error in errors.errors() {
                    prop_assert_eq!(&error.file, FILE);
                    prop_assert!(error.to_string().starts_with(FILE));
                }
            }
        }
    }
}

// ---------------------------------------------------------------- meters (issue 30)

/// `[[meter]]` tables before the domain, then `rules`.
fn metered_text(meters: &str, rules: &str) -> String {
    format!("version = 3\n{meters}\n[[domain]]\nname = \"api\"\n{rules}")
}

#[test]
fn a_rule_counts_toward_a_declared_meter_in_its_zone() {
    let text = metered_text(
        "[[meter]]\nname = \"api-calls\"\nperiod = \"month\"\ntime_zone = \"America/New_York\"\n\
         [[meter]]\nname = \"daily\"\nperiod = \"day\"\n",
        &bucket("p-read", "user", "meter = \"api-calls\""),
    );
    let bundle = ok(&text);
    assert_eq!(bundle.meters.len(), 2);
    let meter = &bundle.meters["api-calls"];
    assert_eq!(meter.time_zone, "America/New_York");
    assert_eq!(meter.calendar().unwrap().zone_name(), "America/New_York");
    assert_eq!(bundle.meters["daily"].time_zone, "UTC", "the default zone");
    let rule = bundle.rule("api", "p-read").unwrap();
    assert_eq!(rule.meter.as_deref(), Some("api-calls"));
}

#[test]
fn a_rule_naming_an_undeclared_meter_is_refused_at_its_line() {
    let text = metered_text("", &bucket("p-read", "user", "meter = \"nope\""));
    rejected(
        &text,
        line_of(&text, "meter = \"nope\""),
        "p-read",
        "meter",
        "not declared",
    );
    let text = metered_text("", &bucket("p-read", "user", "meter = \"Bad Name\""));
    rejected(
        &text,
        line_of(&text, "Bad Name"),
        "p-read",
        "meter",
        "[a-z0-9_-]{1,64}",
    );
}

#[test]
fn a_bad_meter_is_refused_naming_file_line_and_field() {
    let cases = [
        (
            "[[meter]]\nname = \"m\"\nperiod = \"month\"\ntime_zone = \"Mars/Olympus\"\n",
            "Mars/Olympus",
            "meter.time_zone",
            "IANA",
        ),
        (
            "[[meter]]\nname = \"m\"\nperiod = \"fortnight\"\n",
            "fortnight",
            "meter.period",
            "\"day\", \"week\", \"month\"",
        ),
        (
            "[[meter]]\nname = \"M!\"\nperiod = \"day\"\n",
            "M!",
            "meter.name",
            "[a-z0-9_-]{1,64}",
        ),
        (
            "[[meter]]\nname = \"m\"\nperiod = \"day\"\nreset = 3\n",
            "reset",
            "meter.reset",
            "unknown field",
        ),
    ];
    for (meters, marker, field, needle) in cases {
        let text = metered_text(meters, &bucket("p-read", "user", ""));
        let errors = errors_of(&text);
        let error = errors
            .errors()
            .iter()
            .find(|e| e.field.as_deref() == Some(field))
            .unwrap_or_else(|| panic!("no error for {field} in:\n{errors}"));
        assert_eq!(error.line, Some(line_of(&text, marker)), "{error}");
        let message = error.to_string();
        assert!(message.starts_with(&format!("{FILE}:")), "{message}");
        assert!(
            message.contains(needle),
            "{message:?} should contain {needle:?}"
        );
    }
    // The same name twice: the second is refused, naming the first's line.
    let text = metered_text(
        "[[meter]]\nname = \"m\"\nperiod = \"day\"\n[[meter]]\nname = \"m\" # again\nperiod = \"week\"\n",
        &bucket("p-read", "user", ""),
    );
    let errors = errors_of(&text);
    let error = errors
        .errors()
        .iter()
        .find(|e| e.field.as_deref() == Some("meter.name"))
        .unwrap();
    assert_eq!(error.line, Some(line_of(&text, "# again")));
    assert!(error.to_string().contains("duplicate"), "{error}");
}

// ---------------------------------------------------------------- placement (issue 30)

/// A login rule of 5 a minute per user, with `extra` lines.
fn login(extra: &str) -> String {
    format!(
        "\n[[domain.rule]]\nid = \"login\"\nscope = \"user\"\nalgorithm = \"token_bucket\"\n\
         capacity = 5\nrefill = 5\nperiod_ms = 60000\nfail_mode = \"closed\"\n{extra}"
    )
}

#[test]
fn a_split_security_rule_enforces_its_share_of_the_limit_in_each_region() {
    let text = format!(
        "version = 1\nregions = [\"eu\", \"us\", \"ap\"]\n\n[[domain]]\nname = \"api\"\n{}",
        login("security = true\nplacement = \"split\"")
    );
    let bundle = ok(&text);
    assert_eq!(bundle.regions, ["eu", "us", "ap"]);
    let rule = bundle.rule("api", "login").unwrap();
    assert_eq!(
        (rule.rate.capacity_tokens, rule.rate.refill_tokens),
        (1, 1),
        "⌊5/3⌋"
    );
    assert_eq!(rule.rate.period_ms, 60_000);
    let Some(leasehold_region_agent::policy::Placement::Split { regions, written }) =
        rule.placement
    else {
        panic!("split placement");
    };
    assert_eq!((regions, written.capacity_tokens), (3, 5));
}

#[test]
fn a_split_is_refused_where_it_cannot_hold() {
    let with = |regions: &str, extra: &str| {
        format!(
            "version = 1\n{regions}\n[[domain]]\nname = \"api\"\n{}",
            login(extra)
        )
    };
    let cases = [
        (
            with("regions = [\"eu\", \"us\"]", "placement = \"split\""),
            "security rules",
        ),
        (
            with("", "security = true\nplacement = \"split\""),
            "regions = [...]",
        ),
        (
            with(
                "regions = [\"eu\", \"us\"]",
                "security = true\nplacement = \"home\"",
            ),
            "\"split\"",
        ),
        (
            with(
                "regions = [\"a\", \"b\", \"c\", \"d\", \"e\", \"f\"]",
                "security = true\nplacement = \"split\"",
            ),
            "leaves 0 of 5 tokens",
        ),
    ];
    for (text, needle) in cases {
        rejected(
            &text,
            line_of(&text, "placement ="),
            "login",
            "placement",
            needle,
        );
    }
    let text = with("regions = [\"eu\", \"eu\"]", "security = true");
    let errors = errors_of(&text);
    let error = errors
        .errors()
        .iter()
        .find(|e| e.field.as_deref() == Some("regions"))
        .unwrap();
    assert_eq!(error.line, Some(line_of(&text, "regions =")), "{error}");
}

#[test]
fn a_home_placed_security_rule_names_its_home_and_what_to_do_without_it() {
    use leasehold_region_agent::policy::{Placement, Unreachable};
    let with = |regions: &str, extra: &str| {
        format!(
            "version = 1\n{regions}\n[[domain]]\nname = \"api\"\n{}",
            login(extra)
        )
    };
    let text = with(
        "regions = [\"eu\", \"us\", \"ap\"]",
        "security = true\nplacement = { home_region = \"eu\", unreachable = \"split\" }",
    );
    let bundle = ok(&text);
    let rule = bundle.rule("api", "login").unwrap();
    assert_eq!(rule.home_region(), Some("eu"));
    assert_eq!(
        rule.rate.capacity_tokens, 5,
        "the home enforces the whole limit"
    );
    let Some(Placement::Home {
        unreachable: Unreachable::Split { regions, local },
        ..
    }) = &rule.placement
    else {
        panic!("home placement with a split fallback");
    };
    assert_eq!(*regions, 3);
    assert_eq!(local.rate.capacity_tokens, 1, "⌊5/3⌋ decided locally");
    assert!(local.placement.is_none());
    // Closed by default, and without `regions`.
    let closed = ok(&with(
        "",
        "security = true\nplacement = { home_region = \"eu\" }",
    ));
    assert!(matches!(
        closed.rule("api", "login").unwrap().placement,
        Some(Placement::Home {
            unreachable: Unreachable::Closed,
            ..
        })
    ));
    let cases = [
        (
            with(
                "regions = [\"eu\", \"us\"]",
                "security = true\nplacement = { home_region = \"ap\" }",
            ),
            "home_region",
            "one of the bundle's regions",
        ),
        (
            with("", "security = true\nplacement = { home_region = \"EU\" }"),
            "home_region",
            "[a-z0-9-]",
        ),
        (
            with(
                "",
                "security = true\nplacement = { home_region = \"eu\", unreachable = \"split\" }",
            ),
            "unreachable",
            "regions = [...]",
        ),
        (
            with(
                "",
                "security = true\nplacement = { home_region = \"eu\", unreachable = \"open\" }",
            ),
            "unreachable",
            "\"closed\"",
        ),
        (
            with("", "placement = { home_region = \"eu\" }"),
            "",
            "security rules",
        ),
    ];
    for (text, field, needle) in cases {
        let errors = errors_of(&text).to_string();
        assert!(errors.contains(needle), "{needle}: {errors}");
        assert!(
            errors.contains(&format!(
                "placement{}",
                if field.is_empty() {
                    String::new()
                } else {
                    format!(".{field}")
                }
            )),
            "{field}: {errors}"
        );
    }
}
