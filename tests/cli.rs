//! End-to-end checks of the `leasehold` binary as a newcomer runs it.

use std::process::Command;

fn leasehold() -> Command {
    Command::new(env!("CARGO_BIN_EXE_leasehold"))
}

#[test]
fn help_lists_every_component_command() {
    let out = leasehold().arg("--help").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for cmd in [
        "dev",
        "allocator",
        "agent",
        "pool",
        "region",
        "lease",
        "sim",
        "bench",
    ] {
        assert!(text.contains(cmd), "--help lacks {cmd}: {text}");
    }
}

#[test]
fn commands_not_yet_built_say_so_and_fail() {
    let out = leasehold().arg("lease").output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not yet available"));
}

#[test]
fn bench_store_prints_a_ratio_against_redis_benchmark() {
    let out = leasehold()
        .args(["bench", "store", "--seconds", "1", "--concurrency", "4"])
        .args(["--baseline-requests", "2000"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("ratio vs -P 1:"), "{text}");
    assert!(text.contains("(0 errors)"), "{text}");
}

#[test]
fn bench_envoy_prints_rls_to_check_ratios_and_every_answer_is_ok() {
    let out = leasehold()
        .args(["bench", "envoy", "--seconds", "1", "--concurrency", "2"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for label in [
        "ratio TOML RLS / native Check",
        "ratio YAML RLS / native Check",
    ] {
        assert!(text.contains(label), "{text}");
    }
    // Every call on the allow path was answered OK (no store error, no refusal).
    for line in text.lines().filter(|l| l.contains("decisions/s")) {
        assert!(line.ends_with("(0 errors)"), "{line}");
    }
}

#[test]
fn bench_agent_tls_prints_the_mtls_to_plaintext_ratio_of_one_run() {
    let out = leasehold()
        .args([
            "bench",
            "agent",
            "--tls",
            "--seconds",
            "1",
            "--concurrency",
            "2",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("ratio mTLS / plaintext: throughput"),
        "{text}"
    );
    // Every Check over mTLS was answered as a gateway's (none refused).
    let mtls_line = text
        .lines()
        .find(|l| l.contains("+ mTLS"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(mtls_line.contains("(0 errors)"), "{text}");
}

#[test]
fn agent_with_a_bad_config_names_the_file_and_line_and_exits() {
    let dir = std::env::temp_dir().join(format!("leasehold-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("agent-bad.toml");
    std::fs::write(
        &path,
        "plaintext = true\nregion = \"eu\"\nlisten = \"127.0.0.1:0\"\nhttp_listen = \"not an address\"\npepper_file = \"p\"\npolicy_file = \"x.toml\"\n",
    )
    .unwrap();
    let out = leasehold()
        .args(["agent", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("agent-bad.toml:4:"), "{stderr}");
    // A bad policy bundle names its file, line, rule and field.
    std::fs::write(dir.join("p"), "a-pepper-of-at-least-16-bytes").unwrap();
    std::fs::write(
        &path,
        "plaintext = true\nregion = \"eu\"\nlisten = \"127.0.0.1:0\"\nhttp_listen = \"127.0.0.1:0\"\npepper_file = \"p\"\npolicy_file = \"x.toml\"\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("x.toml"),
        "version = 1\n[[domain]]\nname = \"api\"\n[[domain.rule]]\nid = \"p-read\"\nscope = \"user\"\nalgorithm = \"token_bucket\"\ncapacity = 0\nrefill = 1\nperiod_ms = 1000\nfail_mode = \"open\"\n",
    )
    .unwrap();
    let out = leasehold()
        .args(["agent", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("x.toml:8: rule p-read: field capacity"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn region_remove_refuses_bad_input_naming_the_flag_before_connecting() {
    // Nothing listens on port 1: an answer proves the check came first.
    let nowhere = ["--allocator", "127.0.0.1:1"];
    let out = leasehold()
        .args(["region", "remove", "--pool", "rate"])
        .args(nowhere)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--region"), "{stderr}");
    for (pool, region, flag) in [("", "eu", "--pool"), ("rate", "e u", "--region")] {
        let out = leasehold()
            .args(["region", "remove", "--pool", pool, "--region", region])
            .args(nowhere)
            .output()
            .unwrap();
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(&format!("{flag}: invalid id")),
            "{pool:?} {region:?}: {stderr}"
        );
    }
    // Valid ids, no allocator: the error says which call failed.
    let out = leasehold()
        .args(["region", "remove", "--pool", "rate", "--region", "eu"])
        .args(nowhere)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("region remove --pool rate --region eu"),
        "{stderr}"
    );
}
