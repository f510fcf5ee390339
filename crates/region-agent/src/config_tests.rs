//! Tests of `config.rs`, kept beside it so the code reads on its own.

use super::*;

const GOOD: &str = r#"plaintext = true
region = "eu"
listen = "127.0.0.1:7101"
http_listen = "127.0.0.1:7191"
pepper_file = "pepper"
policy_file = "policy.toml"
"#;

fn error(text: &str) -> String {
    AgentConfig::parse("eu.toml", text).unwrap_err().to_string()
}

#[test]
fn minimal_config_gets_defaults() {
    let c = AgentConfig::parse("eu.toml", GOOD).unwrap();
    assert_eq!(c.store.call_deadline_ms, 50);
    assert_eq!(c.fallback.max_keys, DEFAULT_MAX_KEYS);
    assert!(c.redis_url.is_none());
    assert_eq!(c.file, "eu.toml");
    assert_eq!(
        c.store.memory_max_keys,
        crate::store::memory::DEFAULT_MAX_KEYS
    );
    assert_eq!(c.limits, GrpcLimits::default());
    assert_eq!(c.http_limits, HttpLimits::default());
}

#[test]
fn ratelimit_cache_options_have_their_defaults_and_are_read() {
    let text = format!("{GOOD}[ratelimit]\nconfig_dir = \"rl\"\n");
    let options = AgentConfig::parse("eu.toml", &text)
        .unwrap()
        .ratelimit
        .unwrap()
        .options();
    assert!(!options.stop_increment_when_over_limit);
    assert_eq!(options.expiration_jitter_max_seconds, 300);
    // Unlike upstream, the local over-limit cache is on (it never admits).
    assert_eq!(
        options.local_cache_max_keys,
        crate::envoy::yaml_engine::DEFAULT_LOCAL_CACHE_KEYS
    );
    assert!(
        !options.merge_domains,
        "upstream's MERGE_DOMAIN_CONFIG is off"
    );
    let text = format!(
            "{GOOD}[ratelimit]\nconfig_dir = \"rl\"\nstop_increment_when_over_limit = true\nexpiration_jitter_max_seconds = 0\nlocal_cache_max_keys = 500\nmerge_domains = true\n"
        );
    let options = AgentConfig::parse("eu.toml", &text)
        .unwrap()
        .ratelimit
        .unwrap()
        .options();
    assert!(options.stop_increment_when_over_limit);
    assert_eq!(options.expiration_jitter_max_seconds, 0);
    assert_eq!(options.local_cache_max_keys, 500);
    assert!(options.merge_domains);
}

#[test]
fn coalescing_is_on_by_default_and_its_settings_are_read() {
    let c = AgentConfig::parse("eu.toml", GOOD).unwrap();
    let on = c.store.coalesce_config().expect("on by default");
    assert_eq!(on, crate::store::coalesce::CoalesceConfig::default());
    let text = format!(
        "{GOOD}[store]\ncoalesce = true\nmax_batch = 16\nmax_wait_us = 0\nmax_queue = 100\n"
    );
    let on = AgentConfig::parse("eu.toml", &text)
        .unwrap()
        .store
        .coalesce_config()
        .unwrap();
    assert_eq!(
        (on.max_batch, on.max_wait, on.max_queue),
        (16, Duration::ZERO, 100)
    );
    let off = format!("{GOOD}[store]\ncoalesce = false\n");
    let off = AgentConfig::parse("eu.toml", &off).unwrap();
    assert_eq!(off.store.coalesce_config(), None);
    let wrong = format!("{GOOD}[store]\ncoalesce = 1\n");
    assert_eq!(
        error(&wrong),
        "eu.toml:8: field store.coalesce: invalid type: integer `1`, expected a boolean"
    );
    let wrong = "coalesce = 1\n".to_string();
    assert!(
        error(&wrong).starts_with("eu.toml:1: "),
        "{}",
        error(&wrong)
    );
    let above = format!("{GOOD}[store]\nmax_batch = 65\n");
    assert_eq!(
        error(&above),
        "eu.toml:8: field store.max_batch: 65 is outside [1, 64]"
    );
}

#[test]
fn limits_tables_are_read() {
    let text = format!(
            "{GOOD}[store]\nmemory_max_keys = 10\n[limits]\nrequest_timeout_ms = 7\nmax_message_bytes = 8192\n[http_limits]\nidle_timeout_ms = 9\n"
        );
    let c = AgentConfig::parse("eu.toml", &text).unwrap();
    assert_eq!(c.store.memory_max_keys, 10);
    assert_eq!(c.limits.request_timeout_ms, 7);
    let limits = ListenerLimits {
        grpc: c.limits.clone(),
        http: c.http_limits.clone(),
    };
    assert_eq!(limits.grpc_message_bytes(), 8_192);
    assert_eq!(c.http_limits.idle_timeout_ms, 9);
    assert_eq!(c.http_limits.max_header_bytes, 16_384);
    assert_eq!(
        ListenerLimits::default().grpc_message_bytes(),
        AGENT_MAX_MESSAGE_BYTES as usize
    );
}

#[test]
fn errors_name_file_and_line() {
    let bad = GOOD.replace("listen = \"127.0.0.1:7101\"", "listen = \"nowhere\"");
    assert!(error(&bad).starts_with("eu.toml:3:"));
    let unknown = format!("{GOOD}\nbogus = 1\n");
    let e = error(&unknown);
    assert!(e.starts_with("eu.toml:8:"), "{e}");
    assert!(e.contains("bogus"), "{e}");
    assert!(error("region = = 1").starts_with("eu.toml:1:"));
    let file = format!("{GOOD}file = \"x\"\n");
    assert!(error(&file).contains("unknown field `file`"));
}

#[test]
fn numbers_past_their_range_name_file_line_and_range() {
    let huge = format!("{GOOD}[store]\ncall_deadline_ms = {}\n", i64::MAX);
    assert_eq!(
        error(&huge),
        format!(
            "eu.toml:8: field store.call_deadline_ms: {} is outside [1, 60000]",
            i64::MAX
        )
    );
    let zero = format!("{GOOD}[fallback]\nmax_keys = 0\n");
    assert_eq!(
        error(&zero),
        "eu.toml:8: field fallback.max_keys: 0 is outside [1, 10000000]"
    );
    let dotted = format!("store.max_in_flight = -5\n{GOOD}");
    assert_eq!(
        error(&dotted),
        "eu.toml:1: field store.max_in_flight: -5 is outside [1, 1000000]"
    );
    let phase = format!(
            "{GOOD}[global]\nallocators = [\"a:1\"]\n[[global.pool]]\nid = \"a\"\n[[global.pool]]\nid = \"b\"\nphase_ms = 3600001\n"
        );
    assert_eq!(
        error(&phase),
        "eu.toml:13: field global.pool[1].phase_ms: 3600001 is outside [0, 3600000]"
    );
}

#[test]
fn global_section_is_read_and_bad_values_name_file_line_and_field() {
    let with = format!(
            "{GOOD}\n[global]\nallocators = [\"http://127.0.0.1:7301\"]\n[[global.pool]]\nid = \"api-rate\"\n"
        );
    let c = AgentConfig::parse("eu.toml", &with).unwrap();
    let global = c.global.unwrap();
    assert_eq!(global.pools[0].id, "api-rate");
    let bad = with.replace("http://127.0.0.1:7301", "127.0.0.1");
    let e = error(&bad);
    assert!(
        e.starts_with("eu.toml:9: field global.allocators[0]"),
        "{e}"
    );
    let bad = with.replace("\"api-rate\"", "\"api rate\"");
    let e = error(&bad);
    assert!(e.starts_with("eu.toml:11: field global.pool[0].id"), "{e}");
    let water = with.replace(
        "id = \"api-rate\"",
        "id = \"api-rate\"\nchunk_millitokens = 10\nlow_water_millitokens = 10",
    );
    let e = error(&water);
    assert_eq!(
            e,
            "eu.toml:13: field global.pool[0].low_water_millitokens: 10 must be below chunk_millitokens (10)"
        );
}

const TLS: &str = "[tls]\ntrust_domain = \"leasehold.local\"\nca_file = \"ca.pem\"\ncert_file = \"region-eu.pem\"\nkey_file = \"region-eu-key.pem\"\n";

#[test]
fn a_config_without_tls_is_refused_unless_plaintext_is_chosen() {
    let secure_default = GOOD.replace("plaintext = true", "");
    let e = error(&secure_default);
    assert!(e.starts_with("eu.toml:1: field tls: absent"), "{e}");
    assert!(e.contains("plaintext = true"), "{e}");
    let c = AgentConfig::parse("eu.toml", GOOD).unwrap();
    assert!(c.grpc_tls().is_none() && c.http_tls().is_none());
    let both = format!("{GOOD}{TLS}");
    assert!(error(&both).starts_with("eu.toml:1: field plaintext: true with [tls]"));
}

#[test]
fn with_tls_both_listeners_are_mtls_unless_turned_off_one_by_one() {
    let secure = format!("{}{TLS}", GOOD.replace("plaintext = true", ""));
    let c = AgentConfig::parse("eu.toml", &secure).unwrap();
    assert!(c.grpc_tls().is_some() && c.http_tls().is_some());
    let http_off = secure.replace(
        "[tls]",
        "http_mtls = false\ninsecure_http_plaintext = true\n[tls]",
    );
    let c = AgentConfig::parse("eu.toml", &http_off).unwrap();
    assert!(c.grpc_tls().is_some() && c.http_tls().is_none());
    let grpc_off = secure.replace(
        "[tls]",
        "grpc_mtls = false\ninsecure_grpc_plaintext = true\n[tls]",
    );
    let c = AgentConfig::parse("eu.toml", &grpc_off).unwrap();
    assert!(c.grpc_tls().is_none() && c.http_tls().is_some());
    for field in ["grpc_mtls", "http_mtls"] {
        let without = format!("{GOOD}{field} = true\n");
        let e = error(&without);
        assert_eq!(
            e,
            format!("eu.toml:7: field {field}: needs [tls] (the agent's certificate and the CA)")
        );
    }
}

#[test]
fn bad_region_is_refused() {
    let bad = GOOD.replace("\"eu\"", "\"EU west\"");
    assert!(error(&bad).starts_with("eu.toml:2: field region: EU west must match"));
}

#[test]
fn one_address_for_both_listeners_is_refused_unless_the_port_is_chosen() {
    let same = GOOD.replace("7191", "7101");
    assert_eq!(
        error(&same),
        "eu.toml:4: field http_listen: 127.0.0.1:7101 is also listen's address"
    );
    let ephemeral = GOOD.replace("7191", "0").replace("7101", "0");
    assert!(AgentConfig::parse("eu.toml", &ephemeral).is_ok());
}

#[test]
fn malformed_redis_urls_are_refused_at_load_without_echoing_them() {
    for url in [
        "127.0.0.1:6379",
        "http://secret@h:1/",
        "redis://",
        "rediss://",
    ] {
        let text = format!("{GOOD}redis_url = \"{url}\"\n");
        let e = error(&text);
        assert!(
            e.starts_with("eu.toml:7: field redis_url: not a usable Redis URL"),
            "{url}: {e}"
        );
        assert!(!e.contains("secret"), "{e}");
    }
    let long = format!("{GOOD}redis_url = \"redis://{}\"\n", "h".repeat(3_000));
    assert!(error(&long).contains("above the cap of 2048"));
    let good = format!("{GOOD}redis_url = \"redis://user:pw@127.0.0.1:6379/0\"\n");
    assert!(AgentConfig::parse("eu.toml", &good).is_ok());
    // rustls is compiled in: rediss:// is a usable URL.
    let tls = format!("{GOOD}redis_url = \"rediss://h:1/\"\n");
    assert!(AgentConfig::parse("eu.toml", &tls).is_ok());
}

#[test]
fn a_redis_cluster_needs_one_to_64_node_urls_of_one_scheme_and_no_redis_url() {
    let good = format!(
        "{GOOD}redis_cluster = [\"redis://127.0.0.1:7000/\", \"redis://127.0.0.1:7001/\"]\n"
    );
    let config = AgentConfig::parse("eu.toml", &good).expect("a cluster");
    assert_eq!(config.redis_cluster.map(|s| s.len()), Some(2));
    let cases = [
        ("redis_cluster = []\n", "0 URLs; name 1 to 64"),
        (
            "redis_cluster = [\"redis://a:1/\"]\nredis_url = \"redis://a:1/\"\n",
            "set with redis_url",
        ),
        (
            "redis_cluster = [\"redis://secret@\"]\n",
            "URL 1: not a usable Redis URL",
        ),
        (
            "redis_cluster = [\"unix:///tmp/r.sock\"]\n",
            "URL 1: a cluster node is a redis://",
        ),
        (
            "redis_cluster = [\"redis://a:1/\", \"rediss://b:1/\"]\n",
            "mixes redis:// and rediss://",
        ),
    ];
    for (line, expected) in cases {
        let e = error(&format!("{GOOD}{line}"));
        assert!(
            e.starts_with("eu.toml:7: field redis_cluster: "),
            "{line}: {e}"
        );
        assert!(e.contains(expected), "{line}: {e}");
        assert!(!e.contains("secret"), "{e}");
    }
    let many: Vec<String> = (0..65)
        .map(|i| format!("\"redis://h:{}/\"", 7000 + i))
        .collect();
    let e = error(&format!("{GOOD}redis_cluster = [{}]\n", many.join(", ")));
    assert!(e.contains("65 URLs"), "{e}");
    // [redis] credentials and TLS go with a cluster as with one node.
    let tls =
        format!("{GOOD}redis_cluster = [\"redis://a:1/\"]\n[redis]\ntls_ca_file = \"ca.pem\"\n");
    assert!(error(&tls).contains("rediss://"), "{}", error(&tls));
}

#[test]
fn redis_credentials_need_a_redis_url_and_tls_files_need_rediss() {
    let no_url = format!("{GOOD}[redis]\nusername = \"agent\"\n");
    assert!(
        error(&no_url).contains("field redis:"),
        "{}",
        error(&no_url)
    );
    let plain = format!("{GOOD}redis_url = \"redis://h:1/\"\n[redis]\ntls_ca_file = \"ca.pem\"\n");
    let e = error(&plain);
    assert!(
        e.contains("field redis.tls_ca_file: TLS files need a rediss://"),
        "{e}"
    );
    let good = format!(
            "{GOOD}redis_url = \"rediss://h:1/\"\n[redis]\nusername = \"agent\"\npassword_file = \"p\"\ntls_ca_file = \"ca.pem\"\n"
        );
    let c = AgentConfig::parse("eu.toml", &good).unwrap();
    assert_eq!(c.redis.username.as_deref(), Some("agent"));
    let unknown = format!("{GOOD}redis_url = \"rediss://h:1/\"\n[redis]\npassword = \"x\"\n");
    assert!(
        error(&unknown).contains("unknown field"),
        "{}",
        error(&unknown)
    );
}

#[test]
fn empty_paths_are_refused() {
    let empty = GOOD.replace("\"pepper\"", "\"\"");
    assert_eq!(
        error(&empty),
        "eu.toml:5: field pepper_file: must not be empty"
    );
}

#[test]
fn deploy_configs_load() {
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/regions");
    for region in ["eu", "us", "ap"] {
        let path = deploy.join(format!("agent-{region}.toml"));
        let config = AgentConfig::load(&path).unwrap();
        assert_eq!(config.region, region);
        assert_eq!(config.file, path.display().to_string());
    }
}
