//! A pool's kind: the one fact about a pool that a refusal may name
//! without knowing the pool's state (so errors need not import the pools).

use serde::{Deserialize, Serialize};

/// Which kind a pool is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PoolKind {
    Window,
    Rate,
}
