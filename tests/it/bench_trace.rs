//! Mooncake trace parsing (real slice and malformed lines) and trace transforms.

use std::path::Path;

use kvroute::workload::trace::{MOONCAKE_BLOCK_TOKENS, Trace, TraceError, TraceRequest};

fn fixture() -> Trace {
    Trace::from_mooncake_file(Path::new("tests/fixtures/mooncake_head.jsonl")).unwrap()
}

fn req(arrival_s: f64, input: u32, ids: &[u64]) -> TraceRequest {
    TraceRequest {
        arrival_s,
        input_tokens: input,
        output_tokens: 10,
        hash_ids: ids.to_vec(),
        block_tokens: 4,
        session: None,
    }
}

#[test]
fn mooncake_slice_parses() {
    let t = fixture();
    assert_eq!(t.len(), 200);
    let first = &t.requests[0];
    assert_eq!(first.arrival_s, 0.0);
    assert_eq!(first.input_tokens, 6758);
    assert_eq!(first.output_tokens, 500);
    assert_eq!(first.hash_ids, (0..14).collect::<Vec<u64>>());
    assert_eq!(first.block_tokens, MOONCAKE_BLOCK_TOKENS);
    for r in &t.requests {
        assert_eq!(r.hash_ids.len(), r.input_tokens.div_ceil(512) as usize);
    }
    assert!(
        t.requests
            .windows(2)
            .all(|w| w[0].arrival_s <= w[1].arrival_s)
    );
    assert!(t.duration_s() > 0.0);
}

fn line_error(text: &str) -> (usize, String) {
    match Trace::from_mooncake_str(text) {
        Err(TraceError::Line { line, reason }) => (line, reason),
        other => panic!("expected a line error, got {other:?}"),
    }
}

const GOOD: &str = r#"{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}"#;

#[test]
fn malformed_json_names_its_line() {
    let text = format!("{GOOD}\n{GOOD}\n{{\"timestamp\": 5, \"input_length\n");
    let (line, _) = line_error(&text);
    assert_eq!(line, 3);
    let message = Trace::from_mooncake_str(&text).unwrap_err().to_string();
    assert!(message.starts_with("trace line 3:"), "{message}");
}

#[test]
fn missing_field_is_named() {
    let text = format!("{GOOD}\n{{\"timestamp\": 1, \"input_length\": 3, \"hash_ids\": []}}\n");
    let (line, reason) = line_error(&text);
    assert_eq!(line, 2);
    assert!(reason.contains("output_length"), "{reason}");
}

#[test]
fn mistyped_fields_are_rejected() {
    for bad in [
        r#"{"timestamp": 0, "input_length": "ten", "output_length": 2, "hash_ids": [1]}"#,
        r#"{"timestamp": 0, "input_length": -1, "output_length": 2, "hash_ids": [1]}"#,
        r#"{"timestamp": 0, "input_length": 1, "output_length": 2, "hash_ids": [1.5]}"#,
        r#"{"timestamp": "now", "input_length": 1, "output_length": 2, "hash_ids": []}"#,
        r#"[1, 2, 3]"#,
    ] {
        let (line, _) = line_error(&format!("\n{bad}"));
        assert_eq!(line, 2, "{bad}");
    }
}

#[test]
fn negative_timestamp_is_rejected() {
    let (line, reason) =
        line_error(r#"{"timestamp": -5, "input_length": 1, "output_length": 2, "hash_ids": []}"#);
    assert_eq!(line, 1);
    assert!(reason.contains("timestamp"), "{reason}");
}

#[test]
fn blank_lines_and_float_timestamps_are_fine() {
    let t = Trace::from_mooncake_str(&format!(
        "\n{GOOD}\n\n{{\"timestamp\": 1500.5, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [2]}}\n"
    ))
    .unwrap();
    assert_eq!(t.len(), 2);
    assert!((t.requests[1].arrival_s - 1.5005).abs() < 1e-12);
}

#[test]
fn missing_file_is_an_io_error() {
    let e = Trace::from_mooncake_file(Path::new("tests/fixtures/no-such.jsonl")).unwrap_err();
    assert!(matches!(e, TraceError::Io { .. }));
    assert!(e.to_string().contains("no-such.jsonl"));
}

#[test]
fn window_selects_and_rebases() {
    let t = Trace::new(vec![
        req(0.0, 1, &[1]),
        req(1.0, 2, &[2]),
        req(2.0, 3, &[3]),
        req(3.0, 4, &[4]),
    ]);
    let w = t.window(1.0, 3.0).unwrap();
    let got: Vec<(f64, u32)> = w
        .requests
        .iter()
        .map(|r| (r.arrival_s, r.input_tokens))
        .collect();
    assert_eq!(got, vec![(0.0, 2), (1.0, 3)]);
    assert!(t.window(2.0, 1.0).is_err());
    assert!(t.window(-1.0, 1.0).is_err());
}

#[test]
fn speed_up_divides_gaps() {
    let t = Trace::new(vec![
        req(10.0, 1, &[]),
        req(12.0, 1, &[]),
        req(16.0, 1, &[]),
    ]);
    let s = t.speed_up(2.0).unwrap();
    let arrivals: Vec<f64> = s.requests.iter().map(|r| r.arrival_s).collect();
    assert_eq!(arrivals, vec![10.0, 11.0, 13.0]);
    assert!(t.speed_up(0.0).is_err());
    assert!(t.speed_up(f64::NAN).is_err());
}

#[test]
fn input_cap_keeps_exact_prefix() {
    // Block size 4: 10 tokens = blocks [7, 8, 9(partial)].
    let t = Trace::new(vec![
        req(0.0, 10, &[7, 8, 9]),
        req(1.0, 5, &[7, 8]),
        req(2.0, 3, &[7]),
    ]);
    let c = t.cap_input(6).unwrap();
    assert_eq!(c.requests[0].input_tokens, 6);
    assert_eq!(c.requests[0].hash_ids, vec![7, 8]);
    assert_eq!(c.requests[1].input_tokens, 5);
    assert_eq!(c.requests[1].hash_ids, vec![7, 8]);
    assert_eq!(c.requests[2], t.requests[2]);
    let c = t.cap_input(8).unwrap();
    assert_eq!(c.requests[0].hash_ids, vec![7, 8]);
    assert!(t.cap_input(0).is_err());
}

#[test]
fn input_cap_on_mooncake_keeps_sharing() {
    let t = fixture();
    let c = t.cap_input(2048).unwrap();
    for (a, b) in t.requests.iter().zip(&c.requests) {
        assert!(b.input_tokens <= 2048);
        assert_eq!(b.input_tokens, a.input_tokens.min(2048));
        assert!(a.hash_ids.starts_with(&b.hash_ids));
        assert_eq!(b.hash_ids.len(), b.input_tokens.div_ceil(512) as usize);
    }
}

#[test]
fn block_size_can_be_overridden() {
    let t = fixture().with_block_tokens(64).unwrap();
    assert!(t.requests.iter().all(|r| r.block_tokens == 64));
    assert_eq!(t.requests[0].hash_ids, fixture().requests[0].hash_ids);
    assert!(fixture().with_block_tokens(0).is_err());
}
