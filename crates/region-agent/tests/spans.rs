//! Every decision runs in a `decision` span carrying its decision id, the
//! pool of the deciding rule and the agent's Region — and never a raw
//! principal.

use std::sync::{Arc, Mutex};

use leasehold_proto::agent::v1 as pb;
use leasehold_region_agent::decide::{Counters, Decider};
use leasehold_region_agent::fallback::LocalFallback;
use leasehold_region_agent::global::room::GlobalRoom;
use leasehold_region_agent::key::KeyBuilder;
use leasehold_region_agent::metrics::AgentMetrics;
use leasehold_region_agent::policy::{self, PolicyHolder};
use leasehold_region_agent::store::memory::{MemoryStore, SystemClock};
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

const POLICY: &str = r#"
version = 1

[[domain]]
name = "pooled"

[[domain.rule]]
id = "g-rate"
scope = "global"
algorithm = "token_bucket"
pool = "rate"
match = { route_group = "rate" }
fail_mode = "closed"
"#;

/// (span name, field, value) of every span field recorded.
type Fields = Arc<Mutex<Vec<(String, String, String)>>>;

struct Capture(Fields);

struct Visitor<'a> {
    span: &'a str,
    fields: &'a Fields,
}

impl Visit for Visitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.push(field, value.to_string());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.push(field, format!("{value:?}"));
    }
}

impl Visitor<'_> {
    fn push(&mut self, field: &Field, value: String) {
        self.fields
            .lock()
            .unwrap()
            .push((self.span.to_string(), field.name().to_string(), value));
    }
}

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        _: &tracing::span::Id,
        _: Context<'_, S>,
    ) {
        attrs.record(&mut Visitor {
            span: attrs.metadata().name(),
            fields: &self.0,
        });
    }

    fn on_record(
        &self,
        id: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        ctx: Context<'_, S>,
    ) {
        let name = ctx.span(id).map_or("?", |span| span.name());
        values.record(&mut Visitor {
            span: name,
            fields: &self.0,
        });
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_decision_span_names_its_id_pool_and_region_and_no_principal() {
    let fields: Fields = Arc::default();
    let subscriber = tracing_subscriber::registry().with(Capture(fields.clone()));
    let _default = tracing::subscriber::set_default(subscriber);

    let clock = Arc::new(SystemClock);
    let decider = Decider {
        region: "eu".into(),
        store: Arc::new(MemoryStore::new(clock.clone())),
        keys: KeyBuilder::new(b"spans-test-pepper-0123456789").unwrap(),
        policy: Arc::new(PolicyHolder::new(
            policy::parse("spans.toml", POLICY, None).unwrap(),
        )),
        fallback: LocalFallback::new(100),
        metrics: AgentMetrics::new().unwrap(),
        counters: Counters::default(),
        clock,
        global: Arc::new(GlobalRoom::new(["rate".to_string()])),
        // Each test here reads the store on every call.
        denials: leasehold_region_agent::denial::SharedDenials::off(),
        agent_leases: leasehold_region_agent::lease::agent::AgentLeases::off(),
        quotas: std::sync::Arc::new(leasehold_region_agent::quota::totals::QuotaTotals::new(16)),
        quota_lateness_ms: 0,
        forwarder: None,
        metering: std::sync::Arc::new(leasehold_region_agent::meter::ledger::Metering::new(
            "eu",
            Default::default(),
        )),
    };
    let decision = decider
        .check(pb::CheckRequest {
            request_id: "span-1".into(),
            target: Some(pb::Target {
                domain: "pooled".into(),
                tenant: "acme".into(),
                principal: Some(pb::Principal {
                    r#type: "user".into(),
                    id: "user-secret-42".into(),
                }),
                route_group: "rate".into(),
                method: "GET".into(),
                descriptors: vec![],
            }),
            cost: 1,
            policy_version_seen: 0,
        })
        .await
        .expect("a valid request");
    assert_eq!(decision.policy_id, "g-rate");

    let fields = fields.lock().unwrap().clone();
    let value = |name: &str| {
        fields
            .iter()
            .find(|(span, field, _)| span == "decision" && field == name)
            .map(|(_, _, value)| value.clone())
    };
    assert_eq!(
        value("decision_id").as_deref(),
        Some("span-1"),
        "{fields:?}"
    );
    assert_eq!(value("region").as_deref(), Some("eu"), "{fields:?}");
    assert_eq!(value("pool").as_deref(), Some("rate"), "{fields:?}");
    assert_eq!(value("rule").as_deref(), Some("g-rate"), "{fields:?}");
    assert!(value("allowed").is_some(), "{fields:?}");
    assert!(
        !fields
            .iter()
            .any(|(_, _, value)| value.contains("user-secret-42")),
        "{fields:?}"
    );
}
