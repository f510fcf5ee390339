//! The pools file (`pools_file` in a node config): the pools a new
//! cluster's leader creates, each checked field by field with its line.

use leasehold_logging::quote;
use serde::Deserialize;

use crate::config::PoolConfig;
use crate::id::PoolId;

use super::*;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPools {
    #[serde(default)]
    pub(super) pool: Vec<toml::Table>,
}

/// The fields of a window pool's table besides `id` and `kind`.
pub(super) const WINDOW_FIELDS: &[&str] = &[
    "capacity_millitokens_per_window",
    "window_ms",
    "lease_ttl_ms",
    "regions",
];

/// The fields of a rate pool's table besides `id` and `kind`.
pub(super) const RATE_FIELDS: &[&str] = &[
    "limit_millitokens_per_s",
    "burst_millitokens",
    "burst_seconds",
    "floor_basis_points",
    "interval_ms",
    "max_raise_basis_points",
    "reclaim",
    "fallback_allowance_millitokens_per_s",
    "max_demand_multiple",
    "regions",
];

/// Each reclaim policy a file may name and its fields besides `policy`
/// (`silence_only` parses, to be refused by name below).
pub(super) const RECLAIM_FIELDS: &[(&str, &[&str])] = &[
    ("freeze", &[]),
    ("two_signal", &["silent_intervals"]),
    ("lease", &["share_ttl_ms", "max_drift_ms"]),
    ("silence_only", &["silent_intervals"]),
];

/// Parses a pools file: at most [`MAX_POOLS_IN_FILE`] `[[pool]]` tables
/// with `id`, `kind` (`window` | `rate`) and exactly the fields of that
/// kind's config (see [`crate::config`]); an unknown field, or one of the
/// other kind, is refused. Every number is checked against [`POOL_BOUNDS`],
/// every pool validated; errors name the file, the line of the field at
/// fault and the pool. The simulation-only reclaim policy (`silence_only`)
/// is refused: only pools seeded programmatically (`NodeConfig.pools`) may
/// carry it.
pub fn parse_pools(file: &str, text: &str) -> Result<Vec<SeedPool>, NodeConfigError> {
    let here = Located::new(file, text)?;
    let raw: RawPools = here.parse()?;
    if raw.pool.len() > MAX_POOLS_IN_FILE {
        return Err(here.error(
            &format!("pool[{MAX_POOLS_IN_FILE}]"),
            format!(
                "pool: {} pools, above the cap of {MAX_POOLS_IN_FILE}",
                raw.pool.len()
            ),
        ));
    }
    let mut pools: Vec<SeedPool> = Vec::new();
    for (index, table) in raw.pool.into_iter().enumerate() {
        let path = format!("pool[{index}]");
        let pool = parse_pool(&here, &path, table)?;
        if pools.iter().any(|p| p.pool == pool.pool) {
            return Err(here.error(
                &format!("{path}.id"),
                format!("pool {}: listed twice", pool.pool),
            ));
        }
        pools.push(pool);
    }
    Ok(pools)
}

/// One `[[pool]]` table at `path` (`pool[i]`).
pub(super) fn parse_pool(
    here: &Located<'_>,
    path: &str,
    mut table: toml::Table,
) -> Result<SeedPool, NodeConfigError> {
    let at = |key: &str, message: String| here.error(&format!("{path}.{key}"), message);
    let id = match table.remove("id") {
        Some(toml::Value::String(id)) => id,
        Some(_) => return Err(at("id", "pool: id: must be a string".into())),
        None => return Err(here.error(path, "pool: missing string field id")),
    };
    PoolId::parse(&id).map_err(|e| at("id", format!("pool {}: id: {e}", quote(&id))))?;
    let label = format!("pool {id}");
    let kind = match table.get("kind") {
        Some(toml::Value::String(kind)) => kind.clone(),
        _ => {
            return Err(at(
                "kind",
                format!("{label}: kind: missing; \"window\" or \"rate\""),
            ))
        }
    };
    let (fields, other, other_fields) = match kind.as_str() {
        "window" => (WINDOW_FIELDS, "rate", RATE_FIELDS),
        "rate" => (RATE_FIELDS, "window", WINDOW_FIELDS),
        _ => {
            return Err(at(
                "kind",
                format!(
                    "{label}: kind: {} is not \"window\" or \"rate\"",
                    quote(&kind)
                ),
            ))
        }
    };
    if let Some(key) = table
        .keys()
        .find(|key| *key != "kind" && !fields.contains(&key.as_str()))
    {
        let message = if other_fields.contains(&key.as_str()) {
            format!("{label}: {key}: a field of {other} pools, not of {kind} pools")
        } else {
            format!(
                "{label}: {}: unknown field; a {kind} pool takes id, kind, {}",
                quote(key),
                fields.join(", ")
            )
        };
        return Err(at(key, message));
    }
    if let Some(reclaim) = table.get("reclaim") {
        check_reclaim(reclaim).map_err(|(key, message)| at(&key, format!("{label}: {message}")))?;
    }
    if let Some(node) = here.tree.find(path) {
        here.bounds(node, POOL_BOUNDS, &format!("{label}: "))?;
    }
    let config: PoolConfig = toml::Value::Table(table)
        .try_into()
        .map_err(|e: toml::de::Error| here.error(path, format!("{label}: {}", e.message())))?;
    if config.is_simulation_only() {
        return Err(at(
            "reclaim",
            format!(
                "{label}: reclaim: silence_only is simulation only \
                 (unsafe: it reclaims without the health signal); use two_signal or lease"
            ),
        ));
    }
    config
        .validate()
        .map_err(|e| at(&e.field, format!("{label}: {e}")))?;
    Ok(SeedPool { pool: id, config })
}

/// `reclaim = { policy = …, … }` holds a known policy and only its fields;
/// returns the key at fault (relative to the pool) and why.
pub(super) fn check_reclaim(reclaim: &toml::Value) -> Result<(), (String, String)> {
    let toml::Value::Table(reclaim) = reclaim else {
        return Err((
            "reclaim".into(),
            "reclaim: must be a table such as { policy = \"two_signal\", silent_intervals = 3 }"
                .into(),
        ));
    };
    let policy = match reclaim.get("policy") {
        Some(toml::Value::String(policy)) => policy.as_str(),
        _ => {
            return Err((
                "reclaim".into(),
                "reclaim.policy: missing; freeze, two_signal or lease".into(),
            ))
        }
    };
    let Some((_, fields)) = RECLAIM_FIELDS.iter().find(|(name, _)| *name == policy) else {
        return Err((
            "reclaim.policy".into(),
            format!(
                "reclaim.policy: {} is not freeze, two_signal or lease",
                quote(policy)
            ),
        ));
    };
    if let Some(key) = reclaim
        .keys()
        .find(|key| *key != "policy" && !fields.contains(&key.as_str()))
    {
        let takes = if fields.is_empty() {
            "no other field".to_string()
        } else {
            fields.join(", ")
        };
        return Err((
            format!("reclaim.{key}"),
            format!(
                "reclaim.{}: not a field of policy {policy} (it takes {takes})",
                quote(key)
            ),
        ));
    }
    Ok(())
}
