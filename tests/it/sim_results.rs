//! `kvroute simulate` results: determinism, the oracle bound, the results.json schema, and a
//! clear error for a malformed trace. Small synthetic workloads so debug builds take seconds.

use kvroute::sim::cli::run_one;
use kvroute::sim::{Scenario, SimulateArgs};

fn args(flags: &str) -> SimulateArgs {
    Scenario::parse("test", &format!("description = \"t\"\n[flags]\n{flags}"))
        .unwrap()
        .args
}

const SHARED: &str = "synthetic = \"shared-prefix\"\nrequests = 150\nrate = 40.0\nprefixes = 8\nprefix-tokens = 1024\ninput-tokens = 256\noutput-tokens = 16\nworkers = 3\nslo-ttft = 0.2\n";

#[test]
fn same_seed_gives_identical_results_json_and_files() {
    let a = args(&format!(
        "{SHARED}policies = \"kv_aware,random,power_of_two,cache_aware\"\n"
    ));
    let (trace, _) = a.workload().unwrap();
    let d1 = tempfile::tempdir().unwrap();
    let d2 = tempfile::tempdir().unwrap();
    run_one(&a, &trace, "# t\n", Some(d1.path())).unwrap();
    let mut b = a.clone();
    b.jobs = 2; // parallel threads must not change anything
    run_one(&b, &trace, "# t\n", Some(d2.path())).unwrap();
    let j1 = std::fs::read_to_string(d1.path().join("results.json")).unwrap();
    let j2 = std::fs::read_to_string(d2.path().join("results.json")).unwrap();
    assert_eq!(j1, j2);
    for f in [
        "summary.md",
        "ttft_cdf.svg",
        "load_kv_aware.svg",
        "load_random.svg",
    ] {
        assert!(d1.path().join(f).is_file(), "{f} missing");
    }

    // A different seed changes the workload, hence the results.
    let mut c = a.clone();
    c.seed = 1;
    let (trace_c, _) = c.workload().unwrap();
    let other = run_one(&c, &trace_c, "# t\n", None).unwrap();
    let first: serde_json::Value = serde_json::from_str(&j1).unwrap();
    assert_ne!(
        first["policies"]["kv_aware"]["ttft_s"]["mean"],
        serde_json::to_value(&other.results).unwrap()["policies"]["kv_aware"]["ttft_s"]["mean"]
    );
}

#[test]
fn results_json_has_every_documented_key_and_the_oracle_bounds_every_policy() {
    let a = args(SHARED);
    let (trace, _) = a.workload().unwrap();
    let dir = tempfile::tempdir().unwrap();
    run_one(&a, &trace, "# t\n", Some(dir.path())).unwrap();
    let text = std::fs::read_to_string(dir.path().join("results.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let policies = v["policies"].as_object().unwrap();
    assert_eq!(
        v.as_object().unwrap().len(),
        1,
        "top level is exactly `policies`"
    );
    let names: Vec<&str> = policies.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "kv_aware",
            "round_robin",
            "random",
            "least_request",
            "power_of_two",
            "cache_aware",
            "dynamo_cost",
            "pooled_cache",
            "oracle"
        ]
    );
    let oracle_mean = v["policies"]["oracle"]["ttft_s"]["mean"].as_f64().unwrap();
    assert!(oracle_mean > 0.0);
    for (name, p) in policies {
        for lat in ["ttft_s", "e2e_s"] {
            for k in ["mean", "p50", "p90", "p99"] {
                assert!(p[lat][k].as_f64().is_some(), "{name}.{lat}.{k}");
            }
        }
        for k in ["hit_rate", "slo_attainment"] {
            let x = p[k].as_f64().unwrap();
            assert!((0.0..=1.0).contains(&x), "{name}.{k} = {x}");
        }
        for k in ["preemptions", "requests", "errors"] {
            assert!(p[k].as_u64().is_some(), "{name}.{k}");
        }
        assert_eq!(p["requests"].as_u64(), Some(150));
        let mean = p["ttft_s"]["mean"].as_f64().unwrap();
        assert!(
            oracle_mean <= mean + 1e-12,
            "{name}: {mean} < oracle {oracle_mean}"
        );
        let p99 = p["e2e_s"]["p99"].as_f64().unwrap();
        assert!(
            p99 >= p["ttft_s"]["p99"].as_f64().unwrap() - 1e-12,
            "{name}"
        );
    }
    let md = std::fs::read_to_string(dir.path().join("summary.md")).unwrap();
    assert!(
        md.contains("| kv_aware |") && md.contains("| oracle |"),
        "{md}"
    );
}

#[test]
fn prompts_longer_than_an_engine_are_errors_not_panics() {
    let a = args(
        "synthetic = \"unique\"\nrequests = 20\nrate = 10.0\ninput-tokens = 800\noutput-tokens = 4\nworkers = 2\nnum-blocks = 16\npolicies = \"kv_aware,round_robin\"\n",
    );
    let (trace, _) = a.workload().unwrap();
    let out = run_one(&a, &trace, "# t\n", None).unwrap();
    for name in ["kv_aware", "round_robin", "oracle"] {
        let r = out.results.get(name).unwrap();
        assert_eq!(r.requests, 20);
        // 16 blocks × 64 tokens = 1,024 tokens: prompts of 400..1,200 tokens + 2..6 outputs.
        assert!(r.errors > 0 && r.errors < 20, "{name}: {} errors", r.errors);
    }
}

#[test]
fn malformed_trace_gives_a_clear_error_with_the_line_number() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.jsonl");
    std::fs::write(
        &path,
        "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 2, \"hash_ids\": [1]}\n{\"timestamp\": 5, \"input_length\": \"many\"}\n",
    )
    .unwrap();
    let a = args(&format!("trace = {:?}\n", path.display().to_string()));
    let e = a.workload().unwrap_err().to_string();
    assert!(e.contains("line 2"), "{e}");
}
