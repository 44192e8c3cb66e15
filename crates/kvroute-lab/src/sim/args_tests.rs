//! Unit tests of the `simulate` flags (a file of their own to keep `args` readable).

use super::*;
use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: SimulateArgs,
}

/// `simulate`'s flags parsed as the command line gives them (the tier flags' tests use it too).
pub(in crate::sim) fn parse(flags: &[&str]) -> SimulateArgs {
    try_parse(flags).unwrap()
}

/// [`parse`], or clap's error.
pub(in crate::sim) fn try_parse(flags: &[&str]) -> Result<SimulateArgs, clap::Error> {
    Cli::try_parse_from(std::iter::once("simulate").chain(flags.iter().copied())).map(|c| c.args)
}

#[test]
fn defaults_are_the_dynamo_mocker_ones() {
    let a = parse(&[]);
    let w = &a.workload;
    assert_eq!(
        (w.requests, w.input_tokens, w.output_tokens),
        (1000, 512, 128)
    );
    assert_eq!((w.prefixes, w.prefix_tokens, w.think_time), (16, 2048, 5.0));
    assert_eq!((w.rate, w.block_tokens, w.turns), (10.0, 64, 4));
    assert_eq!(w.trace_block_size, 512);
    let c = a.engine_config();
    assert_eq!((c.block_size, c.num_blocks), (64, 16_384));
    assert_eq!((c.max_num_batched_tokens, c.max_num_seqs), (8192, 256));
    assert_eq!(c.timing.speedup, 1.0);
}

/// A scenario brings its own workload: a flag it would override is refused, not ignored
/// (`--requests` was silently dropped before).
#[test]
fn a_scenario_refuses_the_flags_it_would_ignore() {
    for extra in [
        &["--requests", "10"][..],
        &["--synthetic", "unique"],
        &["--workers", "8"],
        &["--num-blocks", "100"],
        &["--block-size", "32"],
        &["--prefill-a", "1"],
        &["--engine-speedup", "2"],
        &["--slo-ttft", "0.5"],
        &["--seed", "3"],
        &["--max-requests", "5"],
        &["--kv-transfer-bandwidth", "10"],
        &["--cpu-tier-ratio", "4"],
        &["--cpu-tier-events", "self-describing"],
        &["--tier-credit", "ignored"],
    ] {
        let mut flags = vec!["--scenario", "baseline"];
        flags.extend_from_slice(extra);
        let err = try_parse(&flags).err().map(|e| e.kind());
        assert_eq!(
            err,
            Some(clap::error::ErrorKind::ArgumentConflict),
            "{extra:?}"
        );
    }
    let ok = try_parse(&[
        "--scenario",
        "baseline",
        "--policies",
        "kv_aware",
        "--jobs",
        "2",
        "--kv-aware-no-calibrate",
    ])
    .unwrap();
    assert_eq!(ok.scenario.as_deref(), Some("baseline"));
}

#[test]
fn a_disaggregated_fleet_has_both_sides_and_the_link() {
    let a = parse(&[
        "--synthetic",
        "unique",
        "--prefill-workers",
        "4",
        "--decode-workers",
        "12",
        "--kv-transfer-bandwidth",
        "10",
        "--slo-itl",
        "0.05",
    ]);
    let c = a.sim_config().unwrap();
    assert_eq!(c.workers, 16);
    assert_eq!(
        c.pd,
        Some(PdSplit {
            prefill: 4,
            decode: 12
        })
    );
    assert_eq!(c.engine.transfer.bandwidth_bytes_per_s(), 1e10);
    assert_eq!(a.slo_itl, Some(0.05));
    let try_parse = |flags: &[&str]| {
        Cli::try_parse_from(std::iter::once("simulate").chain(flags.iter().copied()))
            .map(|c| c.args)
            .map_err(|e| e.kind())
    };
    use clap::error::ErrorKind;
    assert_eq!(
        try_parse(&["--prefill-workers", "2"]).err(),
        Some(ErrorKind::MissingRequiredArgument)
    );
    assert_eq!(
        try_parse(&[
            "--prefill-workers",
            "2",
            "--decode-workers",
            "2",
            "--workers",
            "4"
        ])
        .err(),
        Some(ErrorKind::ArgumentConflict)
    );
    assert_eq!(
        try_parse(&["--kv-transfer-bandwidth", "0"]).err(),
        Some(ErrorKind::ValueValidation)
    );
    let bad = parse(&["--slo-itl=-1"]);
    assert!(
        bad.sim_config()
            .unwrap_err()
            .to_string()
            .contains("--slo-itl")
    );
}

#[test]
fn capacity_flags_need_capacity_and_refuse_what_it_cannot_size() {
    use clap::error::ErrorKind;
    let try_parse = |flags: &[&str]| {
        Cli::try_parse_from(std::iter::once("simulate").chain(flags.iter().copied()))
            .map(|c| c.args)
            .map_err(|e| e.kind())
    };
    let a = parse(&[
        "--capacity",
        "--capacity-attainment",
        "0.95",
        "--capacity-precision",
        "0.05",
    ]);
    let spec = a.capacity.spec().unwrap();
    assert_eq!(
        (spec.attainment, spec.precision, spec.max_multiplier),
        (0.95, 0.05, 1024.0)
    );
    assert_eq!(spec.max_workers, 256);
    assert!(!parse(&[]).capacity.capacity);
    assert!(parse(&[]).capacity.spec().is_ok(), "the defaults are valid");
    assert_eq!(
        try_parse(&["--capacity-attainment", "0.9"]).err(),
        Some(ErrorKind::MissingRequiredArgument)
    );
    for other in [
        &["--scenario", "baseline"][..],
        &["--join-at", "3"],
        &["--restart-at", "0@3"],
        &["--prefill-workers", "1", "--decode-workers", "1"],
    ] {
        let mut flags = vec!["--capacity"];
        flags.extend_from_slice(other);
        assert_eq!(
            try_parse(&flags).err(),
            Some(ErrorKind::ArgumentConflict),
            "{other:?}"
        );
    }
    for (flag, bad) in [
        ("--capacity-attainment", "0"),
        ("--capacity-attainment", "1.5"),
        ("--capacity-attainment", "NaN"),
        ("--capacity-precision", "0"),
        ("--capacity-max-multiplier", "0.5"),
        ("--capacity-max-workers", "0"),
    ] {
        let err = parse(&["--capacity", flag, bad])
            .capacity
            .spec()
            .unwrap_err();
        assert!(err.to_string().contains(flag), "{flag} {bad}: {err}");
    }
}

#[test]
fn old_spellings_still_mean_what_they_meant() {
    // `simulate --speedup` always sped up the engine, `--speedup-trace` the trace.
    let old = parse(&[
        "--speedup",
        "3",
        "--speedup-trace",
        "2",
        "--trace-block-size",
        "64",
    ]);
    let new = parse(&[
        "--engine-speedup",
        "3",
        "--trace-speedup",
        "2",
        "--trace-block-size",
        "64",
    ]);
    assert_eq!(old, new);
    assert_eq!(old.core.engine_speedup, 3.0);
    assert_eq!(old.workload.trace_speedup, Some(2.0));
    assert_eq!(
        parse(&["--trace-block-tokens", "64"])
            .workload
            .trace_block_size,
        64
    );
}

#[test]
fn the_router_knows_its_engines_long_prefill_cap_unless_told_otherwise() {
    let cap = |flags: &[&str]| {
        parse(flags)
            .policy_settings()
            .kv_aware
            .long_prefill_token_threshold
    };
    assert_eq!(cap(&[]), 0);
    assert_eq!(cap(&["--long-prefill-token-threshold", "4096"]), 4096);
    let blind = [
        "--long-prefill-token-threshold",
        "4096",
        "--kv-aware-long-prefill-token-threshold",
        "0",
    ];
    assert_eq!(cap(&blind), 0);
    let engine = parse(&["--long-prefill-token-threshold", "4096"])
        .sim_config()
        .unwrap();
    assert_eq!(engine.engine.long_prefill_token_threshold, 4096);
}
