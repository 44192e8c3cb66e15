//! `kvroute simulate --capacity` end to end on a tiny synthetic workload: the files it writes,
//! and that its answers are boundaries (each policy's max rate multiplier passes when simulated
//! on its own, half as much again fails; its worker count passes, one fewer fails). Counts and
//! attainments only, never host timings.

use kvroute::policy::PolicyKind;
use kvroute::sim::cli::{run_capacity, run_one};
use kvroute::sim::{Scenario, SimulateArgs};

fn args(flags: &str) -> SimulateArgs {
    Scenario::parse("test", &format!("description = \"t\"\n[flags]\n{flags}"))
        .unwrap()
        .args
}

const TINY: &str = "synthetic = \"shared-prefix\"\nrequests = 120\nrate = 20.0\nprefixes = 4\nprefix-tokens = 1024\ninput-tokens = 256\noutput-tokens = 16\nworkers = 2\nslo-ttft = 0.3\npolicies = \"kv_aware,round_robin\"\ncapacity = true\ncapacity-precision = 0.05\n";

/// SLO attainment of `policy` in a plain simulation of `capacity_args`' workload at
/// `multiplier` on `workers` workers.
fn attainment(capacity_args: &SimulateArgs, policy: &str, multiplier: f64, workers: u32) -> f64 {
    let mut a = capacity_args.clone();
    a.capacity.capacity = false;
    a.out = None;
    a.workload.trace_speedup = Some(multiplier);
    a.workers = workers;
    a.policies = Some(vec![policy.to_string()]);
    let (trace, _) = a.workload().unwrap();
    let outcome = run_one(&a, &trace, "# t\n", None).unwrap();
    outcome.results.get(policy).unwrap().slo_attainment
}

#[test]
fn capacity_answers_are_boundaries_and_its_files_are_written() {
    let mut a = args(TINY);
    let dir = tempfile::tempdir().unwrap();
    a.out = Some(dir.path().to_path_buf());
    let capacity = run_capacity(&a).unwrap();
    for f in ["capacity.md", "capacity.json", "capacity.svg"] {
        assert!(dir.path().join(f).is_file(), "{f} missing");
    }
    let md = std::fs::read_to_string(dir.path().join("capacity.md")).unwrap();
    assert!(
        md.contains("| kv_aware |") && md.contains("| round_robin |"),
        "{md}"
    );
    let svg = std::fs::read_to_string(dir.path().join("capacity.svg")).unwrap();
    assert!(svg.contains("kv_aware") && svg.contains("target 90 %"));
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("capacity.json")).unwrap())
            .unwrap();
    assert_eq!(json["workers"], 2);
    assert_eq!(json["requests"], 120);

    for policy in [PolicyKind::KvAware, PolicyKind::RoundRobin] {
        let name = policy.to_string();
        let entry = &json["policies"][name.as_str()];
        let m = entry["max_multiplier"].as_f64().unwrap();
        assert_eq!(entry["at_bound"], false, "{name}");
        assert!(entry["probes"].as_u64().unwrap() >= 4, "{name}");
        assert!(attainment(&a, &name, m, 2) >= 0.9, "{name} at ×{m}");
        assert!(
            attainment(&a, &name, 1.5 * m, 2) < 0.9,
            "{name} at ×{}",
            1.5 * m
        );
        let w = u32::try_from(entry["workers_needed"].as_u64().unwrap()).unwrap();
        assert!(attainment(&a, &name, 1.0, w) >= 0.9, "{name} on {w}");
        if w > 1 {
            assert!(
                attainment(&a, &name, 1.0, w - 1) < 0.9,
                "{name} on {}",
                w - 1
            );
        }
    }

    // Probes are deterministic: running the policies in parallel changes nothing.
    let mut b = a.clone();
    b.jobs = 2;
    b.out = None;
    assert_eq!(run_capacity(&b).unwrap(), capacity);
}

#[test]
fn capacity_needs_an_slo_target() {
    let a = args(&TINY.replace("slo-ttft = 0.3\n", ""));
    let err = run_capacity(&a).unwrap_err().to_string();
    assert!(err.contains("--slo-ttft"), "{err}");
}
