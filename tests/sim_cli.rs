//! `leasehold sim run` as a user runs it: the built binary on library
//! scenarios, its report files, its exit codes and its errors.

use std::process::Command;

fn leasehold() -> Command {
    Command::new(env!("CARGO_BIN_EXE_leasehold"))
}

fn scenario(name: &str) -> String {
    format!(
        "{}/crates/sim/scenarios/{name}.toml",
        env!("CARGO_MANIFEST_DIR")
    )
}

#[test]
fn a_run_prints_its_verdict_and_writes_csv_and_svg() {
    let dir = tempfile_dir();
    let (csv, svg) = (dir.join("steady.csv"), dir.join("steady.svg"));
    let out = leasehold()
        .args(["sim", "run", &scenario("steady"), "--seed", "2", "--csv"])
        .arg(&csv)
        .arg("--svg")
        .arg(&svg)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.starts_with("steady seed 2: PASS"), "{stdout}");
    assert!(stdout.contains("bound api over 10 s"), "{stdout}");
    let csv = std::fs::read_to_string(&csv).unwrap();
    assert!(csv.starts_with("t_s,pool,region,admitted,enforced_per_s,mode,share,pending,pool\n"));
    // 20 s × 3 Regions, one pool.
    assert_eq!(csv.lines().count(), 1 + 20 * 3, "{csv}");
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(
        svg.contains("<svg")
            && svg.contains("eu share")
            && svg.contains("eu demand/s")
            && svg.contains("Σ admitted/s"),
        "{}",
        &svg[..200.min(svg.len())]
    );
}

#[test]
fn an_unsafe_scenario_reports_its_violation_and_meets_its_expectation() {
    let out = leasehold()
        .args([
            "sim",
            "run",
            &scenario("unsafe-unclamped-lease"),
            "--seed",
            "1",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    // expect_violation = true: the violation is the expected verdict.
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("VIOLATION [unsafe-unclamped-lease seed 1] enforced:"),
        "{stdout}"
    );
    assert!(stdout.contains("Σ enforced ="), "{stdout}");
}

#[test]
fn bad_scenarios_and_seed_ranges_are_refused_by_name() {
    let dir = tempfile_dir();
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "name = \"x\"\nduration_ms = \"soon\"\n").unwrap();
    let out = leasehold().args(["sim", "run"]).arg(&bad).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("bad.toml:2:"), "{stderr}");
    let out = leasehold()
        .args(["sim", "run", &scenario("steady"), "--seeds", "5..2"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--seeds"));
}

fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "leasehold-sim-cli-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
