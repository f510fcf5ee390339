//! The mix's traffic, pure: who a request comes from, which three buckets
//! it charges (tenant, route, client IP), their configured limits, and the
//! agent policy that states them. No I/O, no clock.

use rand09::Rng;
use rand_distr::Distribution;

/// Tenants the clients belong to (client k in tenant k mod TENANTS).
pub(crate) const TENANTS: u32 = 100;
/// Route groups, drawn uniformly: each one its own route rule. (The policy
/// check counts every rule that could share a request, route rules of
/// other groups included, and allows 8: tenant + 5 routes + 2 client.)
pub(crate) const ROUTES: u32 = 5;
/// Clients already over their limit (they send `OVER_LIMIT_SHARE` of the
/// requests, uniformly among them).
pub(crate) const FLAGGED_CLIENTS: u32 = 100;
/// Share of requests from flagged clients.
pub(crate) const OVER_LIMIT_SHARE: f64 = 0.2;
/// Zipf exponent of the normal clients' draw.
pub(crate) const ZIPF_S: f64 = 1.1;

/// A token bucket: `capacity` tokens, refilling `per_s` a second.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limit {
    pub(crate) capacity: u64,
    pub(crate) per_s: u64,
}

/// Per tenant, per (tenant, route) and per normal client: wide enough that
/// no normal request is refused at any throughput two cores reach (the
/// hottest client sends ~11% of all requests: 0.8 × 1 / H(100,000, 1.1)),
/// so the mix's refusals are the flagged clients'.
pub(crate) const TENANT_LIMIT: Limit = Limit {
    capacity: 1_000_000,
    per_s: 200_000,
};
pub(crate) const ROUTE_LIMIT: Limit = Limit {
    capacity: 1_000_000,
    per_s: 100_000,
};
pub(crate) const CLIENT_LIMIT: Limit = Limit {
    capacity: 100_000,
    per_s: 50_000,
};
/// A flagged client: 5 tokens, 1 a second (drained before each row).
pub(crate) const FLAGGED_LIMIT: Limit = Limit {
    capacity: 5,
    per_s: 1,
};

/// Who sent a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Client {
    /// A normal client, 1..=keys (Zipf rank).
    Normal(u64),
    /// A flagged client, 0..FLAGGED_CLIENTS.
    Flagged(u32),
}

/// One request of the mix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MixRequest {
    pub(crate) tenant: u32,
    pub(crate) route: u32,
    pub(crate) client: Client,
}

/// A bucket the mix charges, for counting admissions per bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum BucketId {
    Tenant(u32),
    Route(u32, u32),
    Client(u64),
    Flagged(u32),
}

impl BucketId {
    pub(crate) fn limit(self) -> Limit {
        match self {
            BucketId::Tenant(_) => TENANT_LIMIT,
            BucketId::Route(..) => ROUTE_LIMIT,
            BucketId::Client(_) => CLIENT_LIMIT,
            BucketId::Flagged(_) => FLAGGED_LIMIT,
        }
    }

    pub(crate) fn kind(self) -> &'static str {
        match self {
            BucketId::Tenant(_) => "tenant",
            BucketId::Route(..) => "route",
            BucketId::Client(_) => "client IP",
            BucketId::Flagged(_) => "flagged client IP",
        }
    }
}

impl MixRequest {
    /// The three buckets an admitted request was charged.
    pub(crate) fn buckets(self) -> [BucketId; 3] {
        let client = match self.client {
            Client::Normal(k) => BucketId::Client(k),
            Client::Flagged(f) => BucketId::Flagged(f),
        };
        [
            BucketId::Tenant(self.tenant),
            BucketId::Route(self.tenant, self.route),
            client,
        ]
    }

    pub(crate) fn flagged(self) -> bool {
        matches!(self.client, Client::Flagged(_))
    }

    /// The tenant's name in a row's namespace (`[a-z0-9-]{1,32}`).
    pub(crate) fn tenant_name(self, row: &str) -> String {
        format!("{row}-t{}", self.tenant)
    }

    pub(crate) fn route_name(self) -> String {
        format!("r{}", self.route)
    }

    /// The client's address: normal clients in 10.0.0.0/8, flagged ones in
    /// 198.51.100.0/24.
    pub(crate) fn ip(self) -> String {
        match self.client {
            Client::Normal(k) => format!("10.{}.{}.{}", (k >> 16) & 255, (k >> 8) & 255, k & 255),
            Client::Flagged(f) => format!("198.51.100.{f}"),
        }
    }

    /// The descriptor value that selects the client's rule.
    pub(crate) fn class(self) -> &'static str {
        if self.flagged() {
            "flagged"
        } else {
            "std"
        }
    }
}

/// The mix's draw: normal clients Zipf over `keys`, flagged ones uniform.
pub(crate) struct Workload {
    zipf: rand_distr::Zipf<f64>,
    keys: u64,
}

impl Workload {
    pub(crate) fn new(keys: u64) -> anyhow::Result<Self> {
        if keys == 0 || keys > 1 << 24 {
            anyhow::bail!("--keys must be in [1, 2^24] (client addresses are 10.x.y.z)");
        }
        Ok(Workload {
            zipf: rand_distr::Zipf::new(keys as f64, ZIPF_S)
                .map_err(|e| anyhow::anyhow!("Zipf over --keys: {e}"))?,
            keys,
        })
    }

    /// One request; `over_limit_only` draws only flagged clients.
    pub(crate) fn draw<R: Rng>(&self, rng: &mut R, over_limit_only: bool) -> MixRequest {
        let route = rng.random_range(0..ROUTES);
        if over_limit_only || rng.random_bool(OVER_LIMIT_SHARE) {
            let f = rng.random_range(0..FLAGGED_CLIENTS);
            return Self::flagged(f, route);
        }
        // Zipf samples lie in [1, keys]; the clamp keeps a float's edge in.
        let k = (self.zipf.sample(rng) as u64).clamp(1, self.keys);
        MixRequest {
            tenant: (k % u64::from(TENANTS)) as u32,
            route,
            client: Client::Normal(k),
        }
    }

    /// A request of flagged client `f` (its tenant fixed, as a client's is).
    pub(crate) fn flagged(f: u32, route: u32) -> MixRequest {
        MixRequest {
            tenant: f % TENANTS,
            route,
            client: Client::Flagged(f),
        }
    }
}

/// The agent's policy: domain `mix`, a tenant rule, one route rule per
/// route group, a client-IP rule per class. Fail closed, so a store error
/// is an error in the table, never an admission.
pub(crate) fn policy() -> String {
    let rule = |id: &str, scope: &str, matcher: &str, limit: Limit| {
        format!(
            "[[domain.rule]]\nid = \"{id}\"\nscope = \"{scope}\"\n{matcher}algorithm = \"token_bucket\"\n\
             capacity = {}\nrefill = {}\nperiod_ms = 1000\nfail_mode = \"closed\"\n",
            limit.capacity, limit.per_s
        )
    };
    let mut text = String::from("version = 1\n[[domain]]\nname = \"mix\"\n");
    text += &rule("tenant", "tenant", "", TENANT_LIMIT);
    for r in 0..ROUTES {
        text += &rule(
            &format!("route-r{r}"),
            "route",
            &format!("match = {{ route_group = \"r{r}\" }}\n"),
            ROUTE_LIMIT,
        );
    }
    text += &rule(
        "client",
        "user",
        "match = { descriptors = { class = \"std\" } }\n",
        CLIENT_LIMIT,
    );
    text += &rule(
        "client-flagged",
        "user",
        "match = { descriptors = { class = \"flagged\" } }\n",
        FLAGGED_LIMIT,
    );
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand09::SeedableRng;

    #[test]
    fn draws_stay_in_bounds_and_flag_about_a_fifth() {
        let workload = Workload::new(1_000).unwrap();
        let mut rng = rand09::rngs::StdRng::seed_from_u64(7);
        let (mut flagged, mut top) = (0u32, 0u32);
        for _ in 0..20_000 {
            let r = workload.draw(&mut rng, false);
            assert!(r.tenant < TENANTS && r.route < ROUTES);
            match r.client {
                Client::Normal(k) => {
                    assert!((1..=1_000).contains(&k), "{k}");
                    assert_eq!(u64::from(r.tenant), k % u64::from(TENANTS));
                    top += u32::from(k == 1);
                }
                Client::Flagged(f) => {
                    assert!(f < FLAGGED_CLIENTS);
                    flagged += 1;
                }
            }
        }
        // 20% ± a wide margin (the draw is seeded: this is exact per seed).
        assert!((3_400..4_600).contains(&flagged), "{flagged}");
        // Zipf: rank 1 is the single most drawn client by far (1/H ≈ 17%
        // of normal draws over 1,000 keys at s = 1.1).
        assert!(top > 2_000, "{top}");
        let only = workload.draw(&mut rng, true);
        assert!(only.flagged());
    }

    #[test]
    fn zero_keys_are_refused() {
        assert!(Workload::new(0).is_err());
        assert!(Workload::new(1).is_ok());
    }

    #[test]
    fn a_request_charges_its_tenant_route_and_client() {
        let r = MixRequest {
            tenant: 3,
            route: 5,
            client: Client::Normal(70_000),
        };
        assert_eq!(
            r.buckets(),
            [
                BucketId::Tenant(3),
                BucketId::Route(3, 5),
                BucketId::Client(70_000)
            ]
        );
        assert_eq!(r.ip(), "10.1.17.112");
        assert_eq!(r.tenant_name("r2"), "r2-t3");
        assert_eq!(Workload::flagged(104, 0).tenant, 4);
        assert_eq!(Workload::flagged(4, 0).ip(), "198.51.100.4");
        assert_eq!(BucketId::Flagged(4).limit(), FLAGGED_LIMIT);
    }

    #[test]
    fn the_policy_parses_with_every_rule() {
        let bundle = leasehold_region_agent::policy::parse("mix.toml", &policy(), None).unwrap();
        assert_eq!(bundle.domains["mix"].rules.len(), 3 + ROUTES as usize);
    }
}
