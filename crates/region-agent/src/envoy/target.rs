//! An Envoy RLS descriptor of a TOML-policy domain as a native Check's
//! target (pure: no I/O, no clock).
//!
//! Envoy sends whatever its actions produce: any keys, any UTF-8 values (up
//! to the RLS bounds of `crate::envoy::service`), keys repeated, entries in any
//! number. None of that is refused here. The domain's `[domain.envoy]`
//! ([`EnvoyMapping`]) names which entries fill the tenant, the principal,
//! the route group and the method; every other entry is a descriptor rules
//! can match. For each key the first entry in request order counts (Envoy
//! emits its actions in order; a later repeat is ignored).
//!
//! A value no native field could hold (empty, spaces, non-ASCII, over 64
//! bytes; a tenant outside `[a-z0-9-]{1,32}`) is replaced by its keyed
//! stand-in ([`KeyBuilder::opaque`]): equal values share a bucket, the
//! value is never kept in clear, and no written rule can name it (rules
//! only name plain values), so such a request meets exactly the rules that
//! do not look at that field. Principals of any length are hashed as the
//! native Check hashes them (`type:id`, the entry key as the type), so an
//! Envoy caller and a gateway naming the same principal share its bucket.
//! A descriptor without a principal entry counts against one shared
//! `_anonymous` principal in user-scope rules (it never skips them).

use std::collections::BTreeMap;

use crate::key::{KeyBuilder, PrincipalHash, Tenant};
use crate::policy::{Domain, EnvoyMapping};
use crate::request::{RequestTarget, MAX_FIELD_LEN};

/// The principal of a descriptor that names none (see the module doc).
pub const ANONYMOUS_PRINCIPAL: &str = "_anonymous:";

/// The target `entries` (key, value, in request order) name in `domain`;
/// None when it names no tenant and the domain sets no `default_tenant`
/// (no rule can match it: upstream answers such a descriptor OK).
pub fn target_of(
    domain: &Domain,
    entries: &[(&str, &str)],
    keys: &KeyBuilder,
) -> Option<RequestTarget> {
    let mapping: &EnvoyMapping = &domain.envoy;
    let mut tenant: Option<&str> = None;
    let mut principal: Option<(&str, &str)> = None;
    let mut route_group: Option<&str> = None;
    let mut method: Option<&str> = None;
    let mut descriptors = BTreeMap::new();
    for &(key, value) in entries {
        if key == mapping.tenant_key {
            tenant.get_or_insert(value);
        } else if key == mapping.route_group_key {
            route_group.get_or_insert(value);
        } else if key == mapping.method_key {
            method.get_or_insert(value);
        } else if mapping.principal_keys.iter().any(|k| k == key) {
            principal.get_or_insert((key, value));
        } else {
            descriptors
                .entry(native_or_opaque(key, keys))
                .or_insert_with(|| native_or_opaque(value, keys));
        }
    }
    let tenant = match tenant {
        Some(raw) => Tenant::parse(raw)
            .or_else(|_| Tenant::parse(&keys.opaque(raw)))
            // `opaque` is `h-` and 16 hex: always a valid tenant.
            .ok()?,
        None => mapping.default_tenant.clone()?,
    };
    let principal: PrincipalHash = match principal {
        Some((kind, id)) => keys.principal_unchecked(&format!("{kind}:{id}")),
        None => keys.principal_unchecked(ANONYMOUS_PRINCIPAL),
    };
    Some(RequestTarget {
        domain: domain.name.clone(),
        tenant,
        principal: Some(principal),
        route_group: route_group
            .map(|v| native_or_opaque(v, keys))
            .unwrap_or_default(),
        method: method
            .map(|v| native_or_opaque(v, keys))
            .unwrap_or_default(),
        descriptors,
    })
}

/// `value` when a native field could hold it (1–64 bytes of printable
/// ASCII), else its keyed stand-in.
fn native_or_opaque(value: &str, keys: &KeyBuilder) -> String {
    let native =
        (1..=MAX_FIELD_LEN).contains(&value.len()) && value.bytes().all(|b| b.is_ascii_graphic());
    if native {
        value.to_string()
    } else {
        keys.opaque(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::parse;
    use leasehold_proto::agent::v1 as pb;
    use proptest::prelude::*;

    fn keys() -> KeyBuilder {
        KeyBuilder::new(b"envoy-target-test-pepper").unwrap()
    }

    fn domain(envoy: &str) -> Domain {
        let text = format!(
            "version = 1\n[[domain]]\nname = \"edge\"\n{envoy}\n[[domain.rule]]\nid = \"r\"\nscope = \"user\"\nalgorithm = \"token_bucket\"\ncapacity = 1\nrefill = 1\nperiod_ms = 1000\nfail_mode = \"open\"\n"
        );
        let bundle = parse("t.toml", &text, None).unwrap();
        bundle.domains["edge"].clone()
    }

    #[test]
    fn native_values_fill_the_fields_as_a_native_check_would() {
        let keys = keys();
        let d = domain("");
        let target = target_of(
            &d,
            &[
                ("tenant", "acme"),
                ("route_group", "read"),
                ("method", "GET"),
                ("remote_address", "203.0.113.7"),
                ("plan", "gold"),
            ],
            &keys,
        )
        .unwrap();
        let native = RequestTarget::from_proto(
            Some(pb::Target {
                domain: "edge".into(),
                tenant: "acme".into(),
                principal: Some(pb::Principal {
                    r#type: "remote_address".into(),
                    id: "203.0.113.7".into(),
                }),
                route_group: "read".into(),
                method: "GET".into(),
                descriptors: vec![pb::Descriptor {
                    key: "plan".into(),
                    value: "gold".into(),
                }],
            }),
            &keys,
        )
        .unwrap();
        assert_eq!(target, native);
    }

    #[test]
    fn values_no_native_field_holds_become_keyed_stand_ins() {
        let keys = keys();
        let d = domain("");
        let long = "x".repeat(1_000);
        let target = target_of(
            &d,
            &[
                ("tenant", "Zürich"),
                ("route_group", "a b"),
                ("city", "Zürich"),
                ("empty", ""),
                ("user", &long),
            ],
            &keys,
        )
        .unwrap();
        assert_eq!(target.tenant.as_str(), keys.opaque("Zürich"));
        assert_eq!(target.route_group, keys.opaque("a b"));
        assert_eq!(target.descriptors["city"], keys.opaque("Zürich"));
        assert_eq!(target.descriptors["empty"], keys.opaque(""));
        assert_eq!(
            target.principal,
            Some(keys.principal_unchecked(&format!("user:{long}")))
        );
        // Nothing of a value is kept in clear.
        assert!(!format!("{target:?}").contains("Zürich"));
    }

    #[test]
    fn the_first_of_a_repeated_key_counts() {
        let keys = keys();
        let d = domain("");
        let entries = [
            ("tenant", "acme"),
            ("header_match", "a"),
            ("header_match", "b"),
            ("tenant", "other"),
        ];
        let target = target_of(&d, &entries, &keys).unwrap();
        assert_eq!(target.tenant.as_str(), "acme");
        assert_eq!(target.descriptors["header_match"], "a");
    }

    #[test]
    fn without_a_tenant_only_a_default_tenant_gives_a_target() {
        let keys = keys();
        assert_eq!(target_of(&domain(""), &[("path", "/")], &keys), None);
        let d = domain("[domain.envoy]\ndefault_tenant = \"public\"\n");
        let target = target_of(&d, &[("path", "/")], &keys).unwrap();
        assert_eq!(target.tenant.as_str(), "public");
        assert_eq!(
            target.principal,
            Some(keys.principal_unchecked(ANONYMOUS_PRINCIPAL))
        );
    }

    #[test]
    fn the_mapping_names_any_entry_as_tenant_principal_route_or_method() {
        let keys = keys();
        let d = domain(
            "[domain.envoy]\ntenant_key = \"x-org\"\nprincipal_keys = [\"x-client\"]\nroute_group_key = \"path\"\nmethod_key = \":method\"\n",
        );
        let target = target_of(
            &d,
            &[
                ("x-org", "acme"),
                ("path", "/v1"),
                (":method", "POST"),
                ("x-client", "c-9"),
                ("user", "u-1"),
            ],
            &keys,
        )
        .unwrap();
        assert_eq!(target.tenant.as_str(), "acme");
        assert_eq!(target.route_group, "/v1");
        assert_eq!(target.method, "POST");
        assert_eq!(
            target.principal,
            Some(keys.principal_unchecked("x-client:c-9"))
        );
        // `user` is no principal key here: a plain descriptor.
        assert_eq!(target.descriptors["user"], "u-1");
    }

    #[test]
    fn a_mapping_naming_one_key_twice_or_a_bad_key_is_refused_naming_the_field() {
        let refused = |envoy: &str| {
            let text = format!("version = 1\n[[domain]]\nname = \"edge\"\n{envoy}\n");
            parse("t.toml", &text, None).unwrap_err().to_string()
        };
        let twice = refused("[domain.envoy]\ntenant_key = \"user\"\n");
        assert!(twice.contains("envoy.principal_keys"), "{twice}");
        assert!(twice.contains("also tenant_key"), "{twice}");
        let spaced = refused("[domain.envoy]\nmethod_key = \"a b\"\n");
        assert!(spaced.contains("t.toml:5"), "{spaced}");
        assert!(spaced.contains("envoy.method_key"), "{spaced}");
        let tenant = refused("[domain.envoy]\ndefault_tenant = \"Public\"\n");
        assert!(tenant.contains("envoy.default_tenant"), "{tenant}");
        let unknown = refused("[domain.envoy]\ntenant = \"x\"\n");
        assert!(unknown.contains("unknown field"), "{unknown}");
        let none = refused("[domain.envoy]\nprincipal_keys = []\n");
        assert!(none.contains("envoy.principal_keys"), "{none}");
    }

    proptest! {
        /// Any entries Envoy can send give a target whose fields a native
        /// Check would accept, and nothing of a non-native value in clear.
        #[test]
        fn any_entries_give_a_native_target(
            entries in proptest::collection::vec(
                (prop_oneof![
                    Just("tenant".to_string()),
                    Just("user".to_string()),
                    Just("route_group".to_string()),
                    Just("method".to_string()),
                    ".{0,8}",
                ], ".{0,80}"),
                0..20,
            )
        ) {
            let keys = keys();
            let d = domain("[domain.envoy]\ndefault_tenant = \"public\"\n");
            let refs: Vec<(&str, &str)> =
                entries.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let target = target_of(&d, &refs, &keys).unwrap();
            let plain = |v: &str| v.is_empty()
                || ((1..=64).contains(&v.len()) && v.bytes().all(|b| b.is_ascii_graphic()));
            prop_assert!(plain(&target.route_group));
            prop_assert!(plain(&target.method));
            for (k, v) in &target.descriptors {
                prop_assert!(plain(k) && !k.is_empty());
                prop_assert!(plain(v) && !v.is_empty());
            }
            prop_assert!(Tenant::parse(target.tenant.as_str()).is_ok());
        }
    }
}
