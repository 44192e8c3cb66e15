//! Reports: summary arithmetic, JSON round trip, Markdown and the comparison table.

use kvroute::report::{ClientOverhead, Slo, Summary, compare};
use kvroute::report::{Outcome, RequestRecord, RunResult};

fn rec(i: usize, ttft: f64, e2e: f64, outcome: Outcome, worker: &str) -> RequestRecord {
    RequestRecord {
        index: i,
        scheduled_s: i as f64,
        start_s: i as f64,
        ttft_s: outcome.is_ok().then_some(ttft),
        e2e_s: e2e,
        itl_mean_s: Some(0.01),
        itl_p99_s: Some(0.02),
        outcome,
        error: None,
        prompt_tokens: 100,
        completion_tokens: 10,
        cached_tokens: Some(50),
        worker: Some(worker.to_string()),
    }
}

fn result(name: &str, ttft_scale: f64) -> RunResult {
    let records: Vec<RequestRecord> = (0..10)
        .map(|i| {
            let outcome = if i == 9 {
                Outcome::Http { status: 503 }
            } else {
                Outcome::Ok
            };
            let w = if i % 2 == 0 { "w0" } else { "w1" };
            rec(
                i,
                0.1 * (i + 1) as f64 * ttft_scale,
                1.0 + i as f64 * 0.1,
                outcome,
                w,
            )
        })
        .collect();
    let slo = Slo {
        ttft_s: Some(0.5),
        e2e_s: Some(10.0),
    };
    RunResult {
        name: name.to_string(),
        target: "http://127.0.0.1:1".to_string(),
        workload: "test".to_string(),
        summary: Summary::from_records(&records, slo, 10.0),
        client: ClientOverhead {
            cpu_s: Some(0.01),
            cpu_per_request_us: Some(1000.0),
            late_sends: 1,
            waited_for_slot: 0,
            max_send_delay_s: 0.02,
        },
        records,
    }
}

#[test]
fn summary_counts_and_slo() {
    let r = result("kv_aware", 1.0);
    let s = &r.summary;
    assert_eq!((s.requests, s.ok, s.errors), (10, 9, 1));
    assert_eq!(s.errors_by_kind.get("http_503"), Some(&1));
    // TTFTs of ok requests: 0.1 … 0.9; ≤ 0.5 → 5 of 10 requests meet the target.
    assert!((s.slo_attainment - 0.5).abs() < 1e-9);
    assert!((s.goodput_rps - 0.5).abs() < 1e-9);
    assert!((s.throughput_rps - 0.9).abs() < 1e-9);
    assert_eq!(s.ttft_s.count, 9);
    assert!((s.ttft_s.p50 - 0.5).abs() < 1e-9);
    assert!((s.ttft_s.max - 0.9).abs() < 1e-9);
    assert!((s.cache_hit_rate.unwrap() - 0.5).abs() < 1e-9);
    assert_eq!(s.per_worker.get("w0"), Some(&5));
    assert_eq!(s.per_worker.get("w1"), Some(&5));
}

#[test]
fn missing_targets_are_met_and_failures_never() {
    let records = vec![
        rec(0, 9.0, 9.0, Outcome::Ok, "w"),
        rec(1, 0.0, 0.1, Outcome::Timeout, "w"),
    ];
    let s = Summary::from_records(&records, Slo::default(), 1.0);
    assert_eq!(s.slo_attainment, 0.5);
}

#[test]
fn json_round_trip() {
    let r = result("kv_aware", 1.0);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.json");
    r.write_json(&path).unwrap();
    let back = RunResult::read_json(&path).unwrap();
    assert_eq!(back, r);
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(v["summary"]["ttft_s"]["count"], 9);
    assert_eq!(v["records"][9]["outcome"]["kind"], "http");
    assert_eq!(v["records"][9]["outcome"]["status"], 503);
}

#[test]
fn reading_a_non_result_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("junk.json");
    std::fs::write(&path, "{\"hello\": 1}").unwrap();
    let e = RunResult::read_json(&path).unwrap_err().to_string();
    assert!(e.contains("junk.json"), "{e}");
}

#[test]
fn markdown_summary_has_the_numbers() {
    let md = result("kv_aware", 1.0).to_markdown();
    assert!(md.contains("# kvroute bench: kv_aware"));
    assert!(md.contains("attainment 50.0 %"));
    assert!(md.contains("http_503: 1"));
    assert!(md.contains("| TTFT | 500.0 | 500.0 |"), "{md}");
    assert!(md.contains("| w0 | 5 |"));
}

#[test]
fn compare_puts_runs_side_by_side() {
    let table = compare(&[result("kv_aware", 1.0), result("round_robin", 2.0)]);
    let mut lines = table.lines();
    assert_eq!(lines.next().unwrap(), "| metric | kv_aware | round_robin |");
    assert_eq!(lines.next().unwrap(), "|---|---:|---:|");
    assert!(
        table.contains("| TTFT p50 (ms) | 500.0 | 1000.0 |"),
        "{table}"
    );
    assert!(table.contains("| requests | 10 | 10 |"));
    assert!(
        table.contains("| SLO attainment (%) | 50.00 | 20.00 |"),
        "{table}"
    );
    // Every row has one cell per run.
    assert!(table.lines().all(|l| l.matches('|').count() == 4));
}
