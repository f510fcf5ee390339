//! Which configured limit a request descriptor hits: upstream's
//! `GetLimit` walk (`src/config/config_impl.go`), pure.
//!
//! For each entry in order, at the current level: the exact composite key
//! `key_value`, else the level's first wildcard (config order) matching
//! `key_value`, else the key alone; nothing matched ends the walk. A limit
//! applies only at the node the **last** entry matched; a node with
//! children descends, one without ends the walk. There is no backtracking:
//! an exact match that limits nothing does not fall back to the key-only
//! sibling (upstream's "whitelist").

use std::borrow::Cow;

use super::config::{Domain, Level, Limit};

/// What one descriptor matched: the limit, its metric key and the values
/// its counter is keyed by.
#[derive(Clone, Debug, PartialEq)]
pub struct Matched<'a> {
    pub limit: &'a Limit,
    /// The limit's own key, unless `detailed_metric`, `value_to_metric` or
    /// `share_threshold` built one (upstream's `GetLimit`).
    pub stats_key: Cow<'a, str>,
    /// Entries matched through a `share_threshold` wildcard: (index, the
    /// wildcard value, `*` kept), which replaces the request's value in the
    /// counter's key so every matching value shares one counter.
    pub shared: Vec<(usize, &'a str)>,
}

impl<'a> Matched<'a> {
    /// The entries a counter is keyed by: `entries`, each shared one's
    /// value replaced by its wildcard.
    pub fn counter_entries<'e>(&self, entries: &[(&'e str, &'e str)]) -> Vec<(&'e str, &'e str)>
    where
        'a: 'e,
    {
        let mut keyed = entries.to_vec();
        for (i, pattern) in &self.shared {
            if let Some(entry) = keyed.get_mut(*i) {
                entry.1 = pattern;
            }
        }
        keyed
    }
}

/// The limit `entries` (key, value pairs, in order) hit in `domain`, if any.
///
/// `hide` stands in for every request value the metric key would hold (a
/// key-only or wildcard match under `value_to_metric` or
/// `detailed_metric`): a value can be an IP or a user id, and metric labels
/// never hold one (§3.2). Values written in the config (an exact match, a
/// wildcard pattern) stay readable. Upstream's keys: `hide` = identity.
pub fn find<'a>(
    domain: &'a Domain,
    entries: &[(&str, &str)],
    hide: &dyn Fn(&str) -> String,
) -> Option<Matched<'a>> {
    let mut level: &Level = &domain.root;
    let mut found = None;
    let mut shared: Vec<(usize, &'a str)> = Vec::new();
    // Per entry: whether its value is the config's (an exact match).
    let mut written: Vec<bool> = Vec::with_capacity(entries.len());
    // Upstream's value_to_metric key, built as the walk goes; needed only
    // when some flag on the path changes it from the limit's own key.
    let mut metric_key = domain.name.clone();
    let mut flagged = false;
    for (i, (key, value)) in entries.iter().enumerate() {
        let composite = format!("{key}_{value}");
        let mut wildcard: Option<&'a str> = None;
        let mut by_value = true;
        let node = level.nodes.get(&composite).or_else(|| {
            level
                .wildcards
                .iter()
                .find(|(_, parts)| wildcard_match(parts, &composite))
                .and_then(|(pattern, _)| {
                    wildcard = Some(pattern.as_str());
                    level.nodes.get(pattern)
                })
        });
        let node = node.or_else(|| {
            by_value = false;
            wildcard = None;
            level.nodes.get(*key)
        });
        let Some(node) = node else {
            break;
        };
        // The wildcard's value part (`key_files*` → `files*`).
        let pattern = wildcard.map(|p| p.strip_prefix(&format!("{key}_")).unwrap_or(p));
        if let (Some(pattern), true) = (pattern, node.share_threshold) {
            shared.push((i, pattern));
        }
        flagged |= node.value_to_metric || node.share_threshold;
        let exact = by_value && pattern.is_none();
        written.push(exact);
        let metric_value = match pattern {
            Some(pattern) if node.share_threshold => Cow::Borrowed(pattern),
            Some(_) if node.value_to_metric => hidden(value, hide),
            Some(pattern) => Cow::Borrowed(pattern),
            None if exact => Cow::Borrowed(*value),
            None if node.value_to_metric => hidden(value, hide),
            None => Cow::Borrowed(""),
        };
        metric_key.push('.');
        metric_key.push_str(key);
        if !metric_value.is_empty() {
            metric_key.push('_');
            metric_key.push_str(&metric_value);
        }
        if i + 1 == entries.len() {
            found = node.limit.as_ref();
        }
        if node.children.nodes.is_empty() {
            break;
        }
        level = &node.children;
    }
    let limit = found?;
    let stats_key = if limit.detailed_metric {
        // Shared entries show their wildcard, the others key_value.
        let mut key = domain.name.clone();
        for (i, (k, v)) in entries.iter().enumerate() {
            key.push('.');
            key.push_str(k);
            match shared.iter().find(|(at, _)| *at == i) {
                Some((_, pattern)) => {
                    key.push('_');
                    key.push_str(pattern);
                }
                None if shared.is_empty() || !v.is_empty() => {
                    key.push('_');
                    if written.get(i).copied().unwrap_or(false) {
                        key.push_str(v);
                    } else {
                        key.push_str(&hidden(v, hide));
                    }
                }
                None => {}
            }
        }
        Cow::Owned(key)
    } else if flagged {
        Cow::Owned(metric_key)
    } else {
        Cow::Borrowed(limit.stats_key.as_str())
    };
    Some(Matched {
        limit,
        stats_key,
        shared,
    })
}

/// A request's value as the metric key holds it (an empty one stays
/// empty: it names no one).
fn hidden<'v>(value: &'v str, hide: &dyn Fn(&str) -> String) -> Cow<'v, str> {
    if value.is_empty() {
        Cow::Borrowed(value)
    } else {
        Cow::Owned(hide(value))
    }
}

/// Upstream's `wildcardMatch`: `parts` is a pattern split on `*`; each `*`
/// matches any run of characters (possibly empty).
pub fn wildcard_match(parts: &[String], value: &str) -> bool {
    let [first, middle @ .., last] = parts else {
        return parts.first().is_some_and(|p| p == value);
    };
    if !value.starts_with(first.as_str()) || !value.ends_with(last.as_str()) {
        return false;
    }
    let fixed: usize = parts.iter().map(String::len).sum();
    if value.len() < fixed {
        return false;
    }
    let mut rest = &value[first.len()..value.len() - last.len()];
    for part in middle {
        match rest.find(part.as_str()) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::super::config::{parse_file, MAX_DESCRIPTORS};
    use super::*;

    /// Upstream's metric keys: request values unhidden.
    fn upstream(value: &str) -> String {
        value.to_string()
    }

    /// upstream test/config/basic_config.yaml, in substance.
    const BASIC: &str = r#"
domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit: {unit: second, requests_per_unit: 5}
      - key: subkey1
        value: subvalue1
        rate_limit: {unit: second, requests_per_unit: 10}
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: key2
    value: value2
    rate_limit: {unit: minute, requests_per_unit: 30}
  - key: key2
    value: value3
  - key: key5
    value: value5
    rate_limit: {unit: day, requests_per_unit: 15}
    descriptors:
      - key: subkey5
        value: subvalue5
        rate_limit: {unit: hour, requests_per_unit: 25}
  - key: key6
    rate_limit: {unlimited: true}
  - key: key7
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 70}
"#;

    /// upstream test/config/wildcard.yaml, in substance.
    const WILD: &str = r#"
domain: test-domain
descriptors:
  - key: wild
    value: foo*
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: noWild
    value: foo
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: midWild
    value: bar*b
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: multiWild
    value: foo*bar*baz
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: nestedWild
    value: val1
    descriptors:
      - key: wild
        value: goo*
        rate_limit: {unit: minute, requests_per_unit: 20}
"#;

    fn domain(text: &str) -> Domain {
        parse_file("t.yaml", text, &mut MAX_DESCRIPTORS.clone()).unwrap()
    }

    fn hit(domain: &Domain, entries: &[(&str, &str)]) -> Option<(u32, String)> {
        find(domain, entries, &upstream)
            .map(|m| (m.limit.requests_per_unit, m.stats_key.into_owned()))
    }

    #[test]
    fn the_basic_walk_takes_the_most_specific_node_at_the_last_entry() {
        let d = domain(BASIC);
        let s = |k: &str| k.to_string();
        assert_eq!(
            hit(&d, &[("key1", "value1"), ("subkey1", "something")]),
            Some((5, s("test-domain.key1_value1.subkey1")))
        );
        assert_eq!(
            hit(&d, &[("key1", "value1"), ("subkey1", "subvalue1")]),
            Some((10, s("test-domain.key1_value1.subkey1_subvalue1")))
        );
        assert_eq!(hit(&d, &[("key1", "value1")]), None);
        assert_eq!(hit(&d, &[("key1", "something")]), None);
        assert_eq!(hit(&d, &[("key2", "value2"), ("subkey", "subvalue")]), None);
        assert_eq!(
            hit(&d, &[("key2", "something")]),
            Some((20, s("test-domain.key2")))
        );
        assert_eq!(
            hit(&d, &[("key2", "value2")]),
            Some((30, s("test-domain.key2_value2")))
        );
        // Whitelisted exact value: no fallback to key2's 20/min.
        assert_eq!(hit(&d, &[("key2", "value3")]), None);
        // No fallback to the parent's limit or to another value.
        assert_eq!(
            hit(&d, &[("key5", "value5"), ("subkey5", "subvalue")]),
            None
        );
        assert_eq!(
            hit(&d, &[("key5", "value5")]),
            Some((15, s("test-domain.key5_value5")))
        );
        assert!(
            find(&d, &[("key6", "foo")], &upstream)
                .unwrap()
                .limit
                .unlimited
        );
        assert_eq!(
            hit(&d, &[("key7", "unspecified_value")]),
            Some((70, s("test-domain.key7_unspecified_value")))
        );
        assert_eq!(hit(&d, &[]), None);
    }

    #[test]
    fn wildcards_match_anywhere_in_the_value_and_exact_keys_win() {
        let d = domain(WILD);
        let key = |entries: &[(&str, &str)]| hit(&d, entries).map(|(_, k)| k);
        assert_eq!(
            key(&[("wild", "foo1")]).as_deref(),
            Some("test-domain.wild_foo*")
        );
        assert_eq!(
            key(&[("wild", "foo2")]).as_deref(),
            Some("test-domain.wild_foo*")
        );
        assert_eq!(key(&[("wild", "bar")]), None);
        assert_eq!(key(&[("noWild", "foo1")]), None);
        for value in ["barb", "barab", "bar123b"] {
            assert!(key(&[("midWild", value)]).is_some(), "{value}");
        }
        for value in ["bara", "xbarb"] {
            assert!(key(&[("midWild", value)]).is_none(), "{value}");
        }
        assert!(key(&[("multiWild", "foobarbaz")]).is_some());
        assert!(key(&[("multiWild", "foo123baz")]).is_none());
        assert_eq!(
            key(&[("nestedWild", "val1"), ("wild", "goo2")]).as_deref(),
            Some("test-domain.nestedWild_val1.wild_goo*")
        );
    }

    /// upstream test/config/share_threshold.yaml, in substance.
    const SHARE: &str = r#"
domain: test-domain
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: files
    value: top/*
    share_threshold: true
    descriptors:
      - key: files
        value: nested/*
        share_threshold: true
        rate_limit: {unit: minute, requests_per_unit: 300}
  - key: route
    value: api/*
    share_threshold: true
    value_to_metric: true
    descriptors:
      - key: method
        rate_limit: {unit: minute, requests_per_unit: 60}
  - key: service
    value: svc/*
    share_threshold: true
    descriptors:
      - key: endpoint
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 80}
  - key: path
    value: path/*
    share_threshold: true
    descriptors:
      - key: file
        value: file/*
        share_threshold: false
        descriptors:
          - key: type
            rate_limit: {unit: minute, requests_per_unit: 120}
  - key: file
    value: test1
    rate_limit: {unit: minute, requests_per_unit: 50}
  - key: file
    value: test*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: midroute
    value: /api*v2
    share_threshold: true
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 80}
"#;

    /// upstream README example 10 (value_to_metric), and its wildcard case.
    const VALUE_TO_METRIC: &str = r#"
domain: example10
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {unit: minute, requests_per_unit: 60}
  - key: user
    value_to_metric: true
    descriptors:
      - key: action
        value: read*
        value_to_metric: true
        descriptors:
          - key: resource
            rate_limit: {unit: minute, requests_per_unit: 100}
  - key: plain
    value: p*
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: detailed
    value_to_metric: true
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 1}
"#;

    /// (stats key, the counter's entries) of a match.
    fn keyed(domain: &Domain, entries: &[(&str, &str)]) -> (String, Vec<(String, String)>) {
        let m = find(domain, entries, &upstream).expect("matches");
        let counter = m
            .counter_entries(entries)
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        (m.stats_key.into_owned(), counter)
    }

    fn owned(entries: &[(&str, &str)]) -> Vec<(String, String)> {
        entries
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn share_threshold_keys_every_matching_value_to_one_counter_as_upstream() {
        let d = domain(SHARE);
        for value in ["files/a.pdf", "files/b.csv", "files/c.txt"] {
            assert_eq!(
                keyed(&d, &[("files", value)]),
                (
                    "test-domain.files_files/*".to_string(),
                    owned(&[("files", "files/*")])
                ),
                "{value}"
            );
        }
        assert_eq!(
            keyed(&d, &[("files", "top/x"), ("files", "nested/y")]),
            (
                "test-domain.files_top/*.files_nested/*".to_string(),
                owned(&[("files", "top/*"), ("files", "nested/*")])
            )
        );
        // share_threshold wins over value_to_metric in the metric key.
        assert_eq!(
            keyed(&d, &[("route", "api/v1"), ("method", "GET")]),
            (
                "test-domain.route_api/*.method".to_string(),
                owned(&[("route", "api/*"), ("method", "GET")])
            )
        );
        // ... and in detailed_metric's.
        assert_eq!(
            keyed(&d, &[("service", "svc/user"), ("endpoint", "get")]).0,
            "test-domain.service_svc/*.endpoint_get"
        );
        // A wildcard without share_threshold keeps a counter per value.
        assert_eq!(
            keyed(
                &d,
                &[("path", "path/foo"), ("file", "file/doc1"), ("type", "pdf")]
            ),
            (
                "test-domain.path_path/*.file_file/*.type".to_string(),
                owned(&[("path", "path/*"), ("file", "file/doc1"), ("type", "pdf")])
            )
        );
        // An exact value wins over the shared wildcard and is not shared.
        assert_eq!(
            keyed(&d, &[("file", "test1")]),
            (
                "test-domain.file_test1".to_string(),
                owned(&[("file", "test1")])
            )
        );
        assert_eq!(
            keyed(&d, &[("file", "test23")]).1,
            owned(&[("file", "test*")])
        );
        // A middle wildcard shares too.
        assert_eq!(
            keyed(&d, &[("midroute", "/api/x/v2")]),
            (
                "test-domain.midroute_/api*v2".to_string(),
                owned(&[("midroute", "/api*v2")])
            )
        );
    }

    #[test]
    fn value_to_metric_puts_the_request_value_in_the_metric_key_as_upstream() {
        let d = domain(VALUE_TO_METRIC);
        let key = |entries: &[(&str, &str)]| keyed(&d, entries).0;
        assert_eq!(
            key(&[
                ("route", "api"),
                ("http_method", "GET"),
                ("subject_id", "123")
            ]),
            "example10.route_api.http_method_GET.subject_id"
        );
        assert_eq!(
            key(&[
                ("route", "web"),
                ("http_method", "POST"),
                ("subject_id", "456")
            ]),
            "example10.route_web.http_method_POST.subject_id"
        );
        assert_eq!(
            key(&[
                ("user", "alice"),
                ("action", "readfile"),
                ("resource", "documents")
            ]),
            "example10.user_alice.action_readfile.resource"
        );
        // Without the flag a wildcard keeps its pattern.
        assert_eq!(key(&[("plain", "pq")]), "example10.plain_p*");
        // detailed_metric takes precedence.
        assert_eq!(key(&[("detailed", "v")]), "example10.detailed_v");
        // The counter is still per value.
        assert_eq!(keyed(&d, &[("plain", "pq")]).1, owned(&[("plain", "pq")]));
    }

    #[test]
    fn wildcard_match_is_upstreams() {
        let parts = |p: &str| p.split('*').map(str::to_string).collect::<Vec<_>>();
        assert!(wildcard_match(&parts("a_*"), "a_x"));
        assert!(wildcard_match(&parts("a_*"), "a_"));
        assert!(wildcard_match(&parts("a_*b*b"), "a_bb"));
        assert!(!wildcard_match(&parts("a_*b*b"), "a_b"));
        assert!(wildcard_match(&parts("exact"), "exact"));
        assert!(!wildcard_match(&parts("exact"), "exact2"));
    }

    proptest::proptest! {
        #[test]
        fn a_pattern_matches_itself_with_stars_filled(
            pieces in proptest::collection::vec("[a-c]{0,3}", 1..5),
            fills in proptest::collection::vec("[a-d]{0,3}", 4),
        ) {
            let pattern = pieces.join("*");
            let parts: Vec<String> = pattern.split('*').map(str::to_string).collect();
            let mut value = String::new();
            for (i, piece) in pieces.iter().enumerate() {
                if i > 0 {
                    value.push_str(&fills[i - 1]);
                }
                value.push_str(piece);
            }
            proptest::prop_assert!(wildcard_match(&parts, &value), "{} {}", pattern, value);
        }
    }

    #[test]
    fn request_values_reach_the_metric_key_only_hidden() {
        let d = domain(
            r#"
domain: d
descriptors:
  - key: user
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: client
    value: sk_*
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: ip
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: plan
    value: gold
    value_to_metric: true
    descriptors:
      - key: user
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 1}
"#,
        );
        let hide = |v: &str| format!("#{}", v.len());
        let key =
            |entries: &[(&str, &str)]| find(&d, entries, &hide).map(|m| m.stats_key.into_owned());
        assert_eq!(key(&[("user", "u@x.io")]).as_deref(), Some("d.user_#6"));
        assert_eq!(
            key(&[("client", "sk_live")]).as_deref(),
            Some("d.client_#7")
        );
        assert_eq!(key(&[("ip", "10.0.0.1")]).as_deref(), Some("d.ip_#8"));
        // The config's own value stays readable beside a hidden one.
        assert_eq!(
            key(&[("plan", "gold"), ("user", "bob")]).as_deref(),
            Some("d.plan_gold.user_#3")
        );
    }
}
