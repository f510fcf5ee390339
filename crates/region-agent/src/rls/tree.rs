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

/// What one descriptor matched: the limit and its metric key
/// (`detailed_metric` puts the request's values in it).
#[derive(Clone, Debug, PartialEq)]
pub struct Matched<'a> {
    pub limit: &'a Limit,
    /// The limit's own key, unless `detailed_metric` built one.
    pub stats_key: Cow<'a, str>,
}

/// The limit `entries` (key, value pairs, in order) hit in `domain`, if any.
pub fn find<'a>(domain: &'a Domain, entries: &[(&str, &str)]) -> Option<Matched<'a>> {
    let mut level: &Level = &domain.root;
    let mut found = None;
    for (i, (key, value)) in entries.iter().enumerate() {
        let composite = format!("{key}_{value}");
        let node = level
            .nodes
            .get(&composite)
            .or_else(|| {
                level
                    .wildcards
                    .iter()
                    .find(|(_, parts)| wildcard_match(parts, &composite))
                    .and_then(|(pattern, _)| level.nodes.get(pattern))
            })
            .or_else(|| level.nodes.get(*key));
        let Some(node) = node else {
            break;
        };
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
        let mut key = domain.name.clone();
        for (k, v) in entries {
            key.push('.');
            key.push_str(k);
            key.push('_');
            key.push_str(v);
        }
        Cow::Owned(key)
    } else {
        Cow::Borrowed(limit.stats_key.as_str())
    };
    Some(Matched { limit, stats_key })
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
        find(domain, entries).map(|m| (m.limit.requests_per_unit, m.stats_key.into_owned()))
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
        assert!(find(&d, &[("key6", "foo")]).unwrap().limit.unlimited);
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
}
