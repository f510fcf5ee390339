//! Same seed, same trace: a scenario with a leader crash, run twice with one
//! seed, one run after the other, alone in this process (two simulations on
//! concurrent threads of one process can diverge: see the crate docs).

use leasehold_sim::run::run;
use leasehold_sim::scenario::Scenario;

fn scenario(name: &str) -> Scenario {
    let path = format!("{}/scenarios/{name}.toml", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap();
    Scenario::parse(&path, &text).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn the_same_seed_gives_the_same_trace_and_another_seed_may_not() {
    let s = scenario("leader-crash");
    let first = run(&s, 7).unwrap();
    let again = run(&s, 7).unwrap();
    let other = run(&s, 8).unwrap();
    assert_eq!(first.hash, again.hash, "seed 7 replayed differently");
    assert_eq!(first.trace, again.trace);
    assert!(!first.trace.samples.is_empty());
    assert!(
        !first.trace.events.is_empty(),
        "the leader crash was applied"
    );
    assert_ne!(first.hash, other.hash, "seeds 7 and 8 gave the same trace");
    eprintln!("seed 7: {} twice; seed 8: {}", first.hash, other.hash);
}
