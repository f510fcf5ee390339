//! Tests of `config.rs`, kept beside it so the code reads on its own.

use super::*;

fn parse(text: &str) -> Result<Domain, RlsConfigError> {
    parse_file("basic.yaml", text, &mut MAX_DESCRIPTORS.clone())
}

fn error(text: &str) -> String {
    parse(text).unwrap_err().to_string()
}

const BASIC: &str = r#"
domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit:
          unit: second
          requests_per_unit: 5
      - key: subkey1
        value: subvalue1
        rate_limit:
          unit: SECOND
          requests_per_unit: 10
  - key: key2
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: key2
    value: value3
  - key: key6
    rate_limit:
      unlimited: true
  - key: wild
    value: foo*
    shadow_mode: true
    rate_limit:
      name: wild
      replaces:
        - name: other
      unit: hour
      requests_per_unit: 3
"#;

#[test]
fn the_basic_tree_is_read_with_stats_keys_and_flags() {
    let domain = parse(BASIC).unwrap();
    assert_eq!(domain.name, "test-domain");
    let key1 = &domain.root.nodes["key1_value1"];
    assert!(key1.limit.is_none());
    let sub = key1.children.nodes["subkey1"].limit.as_ref().unwrap();
    assert_eq!((sub.requests_per_unit, sub.unit), (5, Some(Unit::Second)));
    assert_eq!(sub.stats_key, "test-domain.key1_value1.subkey1");
    let subvalue = key1.children.nodes["subkey1_subvalue1"]
        .limit
        .as_ref()
        .unwrap();
    assert_eq!(subvalue.requests_per_unit, 10);
    assert!(domain.root.nodes["key2_value3"].limit.is_none());
    let unlimited = domain.root.nodes["key6"].limit.as_ref().unwrap();
    assert!(unlimited.unlimited && unlimited.unit.is_none());
    let wild = domain.root.nodes["wild_foo*"].limit.as_ref().unwrap();
    assert!(wild.shadow_mode);
    assert_eq!(wild.replaces, vec!["other".to_string()]);
    assert_eq!(domain.root.wildcards.len(), 1);
    assert_eq!(domain.root.wildcards[0].1, vec!["wild_foo", ""]);
}

#[test]
fn upstream_load_errors_name_file_line_and_reason() {
    let cases = [
            ("domain: d\ndescriptors:\n  - ratelimit: 1\n", "basic.yaml:3: config error, unknown key 'ratelimit'"),
            ("", "basic.yaml:1: config file cannot have empty domain"),
            ("descriptors: []\n", "basic.yaml:1: config file cannot have empty domain"),
            ("domain: d\ndescriptors:\n  - value: v\n", "basic.yaml:3: descriptor has empty key"),
            (
                "domain: d\ndescriptors:\n  - key: k1\n    value: v1\n  - key: k1\n    value: v1\n",
                "basic.yaml:5: duplicate descriptor composite key 'd.k1_v1'",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: foo\n      requests_per_unit: 1\n",
                "basic.yaml:5: invalid rate limit unit 'foo'",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unlimited: true\n      unit: day\n",
                "basic.yaml:6: should not specify rate limit unit when unlimited",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: day\n      requests_per_unit: 1\n      replaces:\n        - name: \"\"\n",
                "basic.yaml:5: should not have an empty replaces entry",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      name: n\n      unit: day\n      requests_per_unit: 1\n      replaces:\n        - name: n\n",
                "basic.yaml:5: replaces should not contain name of same descriptor",
            ),
            (
                "domain: d\ndescriptors:\n  - a\n",
                "basic.yaml:3: config error, yaml file contains list of type other than map",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: day\n      requests_per_unit: -1\n",
                "basic.yaml:6: requests_per_unit: -1 is not an integer in [0, 4294967295]",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n",
                "basic.yaml:5: share_threshold can only be used with wildcard values (containing '*'), but found key 'k_v'",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    quota_mode: maybe\n",
                "basic.yaml:4: quota_mode: expected true or false",
            ),
        ];
    for (text, expected) in cases {
        assert_eq!(error(text), expected, "{text}");
    }
    let syntax = error("domain: d\ndescriptors:\n  - key: [a\n");
    assert!(syntax.starts_with("basic.yaml:"), "{syntax}");
}

#[test]
fn the_leasehold_extension_names_a_pool_and_a_fail_mode() {
    let text = "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      leasehold: {pool: api-rate, fail_mode: open}\n";
    let domain = parse(text).unwrap();
    let limit = domain.root.nodes["k"].limit.as_ref().unwrap();
    assert_eq!(
        limit.extension,
        Some(Extension {
            pool: Some("api-rate".into()),
            fail_mode: Some(ExtensionFailMode::Open),
            line: 7,
            ..Extension::default()
        })
    );
    assert_eq!(
        error(&text.replace("fail_mode: open", "fail_mode: maybe")),
        "basic.yaml:7: leasehold.fail_mode: 'maybe' must be open, closed or local"
    );
    assert_eq!(
        error(&text.replace("pool: api-rate", "pool: Api Rate")),
        "basic.yaml:7: leasehold.pool: 'Api Rate' is not a pool id ([a-z0-9-]{1,64})"
    );
    assert!(error(&text.replace("fail_mode", "bucket")).contains("unknown key 'leasehold.bucket'"));
}

fn ext(leasehold: &str, rate: &str) -> String {
    // `rate` as `{unit: …, requests_per_unit: …}`: its entries, one a line.
    let rate = rate
        .trim_matches(|c| c == '{' || c == '}')
        .replace(", ", "\n      ");
    format!("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      {rate}\n      leasehold: {leasehold}\n")
}

#[test]
fn the_extension_names_an_algorithm_a_burst_and_a_local_fail_mode() {
    let text = ext(
        "{algorithm: gcra, burst: 25, fail_mode: local}",
        "{unit: second, requests_per_unit: 10}",
    );
    let domain = parse(&text).unwrap();
    let limit = domain.root.nodes["k"].limit.as_ref().unwrap();
    assert_eq!(
        limit.extension,
        Some(Extension {
            algorithm: Some(Algorithm::Gcra),
            burst: Some(25),
            fail_mode: Some(ExtensionFailMode::Local),
            line: 7,
            ..Extension::default()
        })
    );
    for algorithm in [
        "token_bucket",
        "gcra",
        "fixed_window",
        "sliding_counter",
        "sliding_log",
    ] {
        let text = ext(
            &format!("{{algorithm: {algorithm}}}"),
            "{unit: minute, requests_per_unit: 60}",
        );
        let domain = parse(&text).unwrap();
        let limit = domain.root.nodes["k"].limit.as_ref().unwrap();
        let extension = limit.extension.as_ref().unwrap();
        assert_eq!(extension.algorithm.map(Algorithm::as_str), Some(algorithm));
    }
}

#[test]
fn bad_extensions_are_refused_naming_file_and_line() {
    let second = "{unit: second, requests_per_unit: 10}";
    let cases = [
            (
                ext("{algorithm: token_bucket, pool: api-rate}", second),
                "basic.yaml:7: leasehold.algorithm and leasehold.pool exclude each other",
            ),
            (
                ext("{algorithm: leaky_bucket}", second),
                "basic.yaml:7: leasehold.algorithm: unknown algorithm 'leaky_bucket' (known: token_bucket, gcra, fixed_window, sliding_counter, sliding_log)",
            ),
            (
                ext("{algorithm: fixed_window, burst: 20}", second),
                "basic.yaml:7: leasehold.burst: fixed_window has no burst",
            ),
            (
                ext("{algorithm: sliding_log, burst: 20}", second),
                "basic.yaml:7: leasehold.burst: sliding_log has no burst",
            ),
            (
                ext("{burst: 20}", second),
                "basic.yaml:7: leasehold.burst needs leasehold.algorithm token_bucket or gcra",
            ),
            (
                ext("{pool: api-rate, burst: 20}", second),
                "basic.yaml:7: leasehold.burst does not apply to a pool",
            ),
            (
                ext("{fail_mode: open}", second),
                "basic.yaml:7: leasehold.fail_mode needs leasehold.algorithm or leasehold.pool",
            ),
            (
                ext("{algorithm: token_bucket, burst: 0}", second),
                "basic.yaml:7: leasehold.burst: 0 is not an integer in [1, 1099511627]",
            ),
            (
                ext("{algorithm: token_bucket, burst: 1099511628}", second),
                "basic.yaml:7: leasehold.burst: 1099511628 is not an integer in [1, 1099511627]",
            ),
            (
                ext("{algorithm: token_bucket, burst: 1000000}", "{unit: year, requests_per_unit: 1}"),
                "basic.yaml:7: leasehold.burst: 1000000 at 1 per year is above 2^52",
            ),
            (
                ext("{algorithm: token_bucket}", "{unit: second, requests_per_unit: 0}"),
                "basic.yaml:7: requests_per_unit: 0 is outside [1, 1099511627] for a bucket",
            ),
            (
                ext("{algorithm: sliding_log}", "{unit: second, requests_per_unit: 100001}"),
                "basic.yaml:7: requests_per_unit: 100001 is outside [1, 100000] for sliding_log",
            ),
            (
                ext("{algorithm: token_bucket}", "{unlimited: true}"),
                "basic.yaml:6: leasehold: an unlimited rule counts nothing to extend",
            ),
            (
                ext("{pool: api-rate, fail_mode: local}", "{unit: second, requests_per_unit: 0}"),
                "basic.yaml:7: leasehold.fail_mode local: requests_per_unit: 0",
            ),
        ];
    for (text, expected) in cases {
        let got = error(&text);
        assert!(got.starts_with(expected), "{got}\nexpected: {expected}");
    }
}

#[test]
fn concurrency_is_refused_at_load_whichever_way_it_is_asked() {
    let second = "{unit: second, requests_per_unit: 10}";
    for leasehold in [
        "{algorithm: concurrency}",
        "{concurrency: {max_in_flight: 5}}",
        "{max_in_flight: 5}",
    ] {
        let got = error(&ext(leasehold, second));
        assert!(got.starts_with("basic.yaml:7: "), "{got}");
        assert!(got.contains("no release"), "{got}");
    }
    // The algorithm's line, when the map spans lines.
    let text = "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      leasehold:\n        fail_mode: open\n        algorithm: concurrency\n";
    assert!(error(text).starts_with("basic.yaml:9: leasehold.algorithm: concurrency"));
}

#[test]
fn known_keys_out_of_place_are_ignored_as_upstream_does() {
    let text = "domain: d\ndescriptors:\n  - key: k\n    unit: day\n    rate_limit:\n      unit: day\n      requests_per_unit: 1\n      shadow_mode: true\n";
    let domain = parse(text).unwrap();
    let limit = domain.root.nodes["k"].limit.as_ref().unwrap();
    // shadow_mode belongs to the descriptor, not to rate_limit.
    assert!(!limit.shadow_mode);
}

#[test]
fn a_domain_in_two_files_is_refused_and_files_merge_otherwise() {
    let a = "domain: a\ndescriptors:\n  - key: k\n";
    let b = "domain: b\n";
    let config = parse_files([("a.yaml", a), ("b.yaml", b)]).unwrap();
    assert_eq!(config.domains.len(), 2);
    let error = parse_files([("a.yaml", a), ("again.yaml", a)]).unwrap_err();
    assert_eq!(
        error.to_string(),
        "again.yaml:1: duplicate domain 'a' in config file"
    );
}

/// upstream's TestDomainMerge and TestDuplicateKeyDomainMerge
/// (test/config/merge_domain_key1.yaml, merge_domain_key2.yaml).
#[test]
fn merge_domains_joins_top_levels_and_refuses_a_key_held_twice() {
    let key1 = "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    rate_limit:\n      unit: minute\n      requests_per_unit: 10\n";
    let key2 = "domain: test-domain\ndescriptors:\n  - key: key2\n    value: value2\n    rate_limit:\n      unit: minute\n      requests_per_unit: 20\n";
    let refused = parse_files([("key1.yaml", key1), ("key2.yaml", key2)]).unwrap_err();
    assert_eq!(
        refused.to_string(),
        "key2.yaml:1: duplicate domain 'test-domain' in config file"
    );
    let config = parse_files_with([("key1.yaml", key1), ("key2.yaml", key2)], true).unwrap();
    assert_eq!(config.domains.len(), 1);
    let domain = &config.domains["test-domain"];
    assert_eq!(domain.file, "key1.yaml");
    let rpu = |composite: &str| {
        let limit = domain.root.nodes[composite].limit.as_ref().unwrap();
        (
            limit.requests_per_unit,
            limit.stats_key.clone(),
            limit.file.clone(),
        )
    };
    assert_eq!(
        rpu("key1_value1"),
        (10, "test-domain.key1_value1".into(), "key1.yaml".into())
    );
    assert_eq!(
        rpu("key2_value2"),
        (20, "test-domain.key2_value2".into(), "key2.yaml".into())
    );
    // The same file twice: its top-level key is held already.
    let twice = parse_files_with([("key1.yaml", key1), ("again.yaml", key1)], true).unwrap_err();
    assert_eq!(
        twice.to_string(),
        "again.yaml:3: duplicate descriptor composite key 'test-domain.key1_value1'"
    );
    // Nested keys merge nothing: a top-level key of its own is new.
    let nested = "domain: test-domain\ndescriptors:\n  - key: outer\n    descriptors:\n      - key: key1\n        value: value1\n        rate_limit: {unit: second, requests_per_unit: 1}\n";
    let config = parse_files_with([("key1.yaml", key1), ("nested.yaml", nested)], true).unwrap();
    assert!(config.domains["test-domain"].root.nodes["outer"]
        .children
        .nodes
        .contains_key("key1_value1"));
    // Wildcards keep file order; other domains load as ever.
    let wild_a = "domain: w\ndescriptors:\n  - key: p\n    value: a*\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
    let wild_b = "domain: w\ndescriptors:\n  - key: p\n    value: ab*\n    rate_limit: {unit: second, requests_per_unit: 2}\n";
    let config = parse_files_with(
        [("a.yaml", wild_a), ("b.yaml", wild_b), ("c.yaml", key1)],
        true,
    )
    .unwrap();
    let patterns: Vec<&str> = config.domains["w"]
        .root
        .wildcards
        .iter()
        .map(|(p, _)| p.as_str())
        .collect();
    assert_eq!(patterns, ["p_a*", "p_ab*"]);
    assert_eq!(config.domains.len(), 2);
}

#[test]
fn deep_trees_and_long_texts_are_refused() {
    let mut text = String::from("domain: d\ndescriptors:\n");
    let mut indent = String::from("  ");
    for _ in 0..=MAX_TREE_DEPTH {
        text.push_str(&format!("{indent}- key: k\n{indent}  descriptors:\n"));
        indent.push_str("    ");
    }
    assert!(error(&text).contains("nested deeper than 16 levels"));
    let long = format!("domain: d\ndescriptors:\n  - key: {}\n", "k".repeat(2_000));
    assert!(error(&long).contains("above the cap of 1024"));
}
