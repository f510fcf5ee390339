//! Plaintext paths beside `[tls]` (ARCHITECTURE §8, issue 27 finding 6):
//! each is refused at config load, naming file, line and field, unless its
//! own `insecure_*` opt-in is set; with it the config loads and the start
//! log names exactly what it opens. A fragment in a Redis URL
//! (`#insecure`) is refused at load.

use leasehold_region_agent::config::AgentConfig;

const SECURE: &str = "region = \"eu\"\n\
listen = \"127.0.0.1:7101\"\n\
http_listen = \"127.0.0.1:7191\"\n\
pepper_file = \"pepper\"\n\
policy_file = \"policy.toml\"\n";

const TLS: &str = "[tls]\ntrust_domain = \"leasehold.local\"\nca_file = \"ca.pem\"\n\
cert_file = \"region-eu.pem\"\nkey_file = \"region-eu.key\"\n";

/// `SECURE`, then `top` (top-level settings from line 6 on), then `[tls]`.
fn config(top: &str) -> String {
    format!("{SECURE}{top}{TLS}")
}

fn error(text: &str) -> String {
    match AgentConfig::parse("eu.toml", text) {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(error) => error.to_string(),
    }
}

#[test]
fn a_plaintext_listener_beside_tls_needs_its_own_opt_in_and_is_logged() {
    for (setting, opt_in, opens) in [
        (
            "grpc_mtls",
            "insecure_grpc_plaintext",
            "Envoy RLS and ReloadPolicy",
        ),
        (
            "http_mtls",
            "insecure_http_plaintext",
            "/json (Envoy RLS as JSON: charges buckets), /health and /metrics",
        ),
    ] {
        let refused = error(&config(&format!("{setting} = false\n")));
        assert!(
            refused.starts_with(&format!("eu.toml:6: field {setting}: false with [tls]")),
            "{refused}"
        );
        assert!(
            refused.contains(&format!("set {opt_in} = true")),
            "{refused}"
        );
        let chosen = config(&format!("{setting} = false\n{opt_in} = true\n"));
        let loaded = AgentConfig::parse("eu.toml", &chosen).expect("opted in");
        let logged = loaded.plaintext_paths().log_at_start();
        assert_eq!(logged.len(), 1, "{logged:?}");
        assert!(logged[0].starts_with(opt_in), "{}", logged[0]);
        assert!(logged[0].contains(opens), "{}", logged[0]);
        // The other listener's opt-in alone does not do.
        let other = if opt_in == "insecure_grpc_plaintext" {
            "insecure_http_plaintext"
        } else {
            "insecure_grpc_plaintext"
        };
        let wrong = error(&config(&format!("{setting} = false\n{other} = true\n")));
        assert!(
            wrong.contains(&format!("field {setting}"))
                || wrong.contains(&format!("field {other}")),
            "{wrong}"
        );
    }
}

#[test]
fn redis_plaintext_beside_tls_needs_its_opt_in_with_or_without_a_password() {
    let url = "redis_url = \"redis://127.0.0.1:6379/\"\n";
    let refused = error(&config(url));
    assert!(
        refused.starts_with("eu.toml:6: field redis_url: a redis:// URL with [tls]"),
        "{refused}"
    );
    assert!(
        refused.contains("insecure_redis_plaintext = true"),
        "{refused}"
    );
    // With an ACL password file (which would cross in clear): refused too.
    let with_password =
        format!("{SECURE}{url}[redis]\nusername = \"agent\"\npassword_file = \"redis.pw\"\n{TLS}");
    assert!(error(&with_password).contains("field redis_url: a redis:// URL with [tls]"));
    let cluster = "redis_cluster = [\"redis://127.0.0.1:7000/\", \"redis://127.0.0.1:7001/\"]\n";
    assert!(error(&config(cluster)).starts_with("eu.toml:6: field redis_cluster:"));
    let chosen = config(&format!("{url}insecure_redis_plaintext = true\n"));
    let loaded = AgentConfig::parse("eu.toml", &chosen).expect("opted in");
    let logged = loaded.plaintext_paths().log_at_start();
    assert_eq!(logged.len(), 1);
    assert!(
        logged[0].contains("redis:// is plaintext TCP"),
        "{}",
        logged[0]
    );
    // rediss:// needs no opt-in, and an opt-in that opens nothing is refused.
    assert!(AgentConfig::parse("eu.toml", &config("redis_url = \"rediss://h:1/\"\n")).is_ok());
    let stray = error(&config(
        "redis_url = \"rediss://h:1/\"\ninsecure_redis_plaintext = true\n",
    ));
    assert!(
        stray.starts_with("eu.toml:7: field insecure_redis_plaintext: true, but"),
        "{stray}"
    );
}

#[test]
fn without_tls_the_whole_process_choice_stays_and_opt_ins_are_refused() {
    let plaintext = format!("plaintext = true\n{SECURE}redis_url = \"redis://127.0.0.1:6379/\"\n");
    let loaded = AgentConfig::parse("eu.toml", &plaintext).expect("plaintext = true as before");
    assert!(loaded.plaintext_paths().log_at_start().is_empty());
    let stray = error(&format!("{plaintext}insecure_redis_plaintext = true\n"));
    assert!(
        stray.starts_with("eu.toml:8: field insecure_redis_plaintext: true without [tls]"),
        "{stray}"
    );
}

#[test]
fn a_fragment_in_a_redis_url_is_refused_at_load() {
    for (top, field) in [
        (
            "redis_url = \"rediss://u:secret@127.0.0.1:6380/#insecure\"\n",
            "redis_url",
        ),
        (
            "redis_cluster = [\"rediss://127.0.0.1:7000/#insecure\"]\n",
            "redis_cluster",
        ),
    ] {
        for text in [config(top), format!("plaintext = true\n{SECURE}{top}")] {
            let refused = error(&text);
            assert!(refused.contains(&format!("field {field}:")), "{refused}");
            assert!(refused.contains("#insecure"), "{refused}");
            assert!(!refused.contains("secret"), "{refused}");
        }
    }
}

/// Issue 27 finding 8: with `[tls]` every allocator address names its node
/// (`node/<id>@host:port`), so the agent accepts only that node there.
#[test]
fn with_tls_every_allocator_address_names_its_node() {
    let global = |allocators: &str| {
        format!(
            "{SECURE}{TLS}[global]\nallocators = [{allocators}]\n[[global.pool]]\nid = \"api-rate\"\n"
        )
    };
    let bare = error(&global("\"node/1@127.0.0.1:7301\", \"127.0.0.1:7302\""));
    assert!(
        bare.starts_with("eu.toml:12: field global.allocators[1]: 127.0.0.1:7302 names no node id"),
        "{bare}"
    );
    assert!(bare.contains("node/<id>@host:port"), "{bare}");
    let pinned = global("\"node/1@127.0.0.1:7301\", \"node/2@127.0.0.1:7302\"");
    let loaded = AgentConfig::parse("eu.toml", &pinned).expect("pinned");
    assert_eq!(
        loaded.global.map(|g| g.allocators[1].clone()).as_deref(),
        Some("node/2@127.0.0.1:7302")
    );
    let bad_id = error(&global("\"node/0@127.0.0.1:7301\""));
    assert!(bad_id.contains("field global.allocators[0]"), "{bad_id}");
    // Plaintext: a bare address still loads (there is no identity to check).
    let plaintext = format!(
        "plaintext = true\n{SECURE}[global]\nallocators = [\"127.0.0.1:7301\"]\n[[global.pool]]\nid = \"api-rate\"\n"
    );
    assert!(AgentConfig::parse("eu.toml", &plaintext).is_ok());
}
