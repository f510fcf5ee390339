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
    let out = leasehold().arg("dev").output().unwrap();
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
