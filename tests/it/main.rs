//! The integration tests, one module per area, linked into one test binary (`it`) so CI links
//! once instead of once per file. Shared helpers live in [`support`].
//!
//! Run one area with a name filter: `cargo test --test it kv_routing`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test and bench code: a failed step should stop the run"
)]

mod support;

mod admin_api;
mod bench_cli;
mod bench_overhead;
mod bench_replay;
mod bench_report;
mod bench_router;
mod bench_synthesis;
mod bench_synthetic;
mod bench_trace;
mod body_admission;
mod body_memory;
mod burst_balance;
mod chaos;
mod config_reload;
mod connections;
mod data_parallel;
mod disaggregation;
mod disaggregation_pools;
mod discovery_dns;
mod discovery_kubernetes;
mod discovery_kubernetes_fleet;
mod endpoints;
mod engine_block_size;
mod engine_events;
mod engine_http;
mod engine_scrape_cost;
mod engine_tiers;
#[cfg(feature = "epp")]
mod epp;
#[cfg(feature = "epp")]
mod epp_fallbacks;
#[cfg(all(feature = "epp", feature = "kubernetes"))]
mod epp_pool;
#[cfg(feature = "epp")]
mod epp_responses;
mod error_bodies;
mod failure_classes;
mod first_deployment;
mod hostile_input;
mod index_exact;
mod index_model;
mod index_tiers;
mod index_workload;
mod kv_events_fixtures;
mod kv_events_proptest;
mod kv_events_zmq;
mod kv_replay;
mod kv_room;
mod kv_routing;
mod load_only_hits;
mod lora_routing;
mod manual_cli;
mod mixed_block_sizes;
mod mixed_contexts;
mod multimodal_routing;
mod openai_sdk;
mod placement_isolation;
mod prefill_pieces;
mod proptest_parsers;
mod readiness;
mod real_sglang;
mod real_sglang_contexts;
mod real_vllm;
mod real_vllm_contexts;
mod real_vllm_dp;
mod real_vllm_endpoints;
#[cfg(feature = "epp")]
mod real_vllm_epp;
mod real_vllm_lifecycle;
mod real_vllm_pd;
mod real_vllm_pieces;
mod real_vllm_quickstart;
mod real_vllm_routing;
mod reliability;
mod replica_bus;
mod request_ids;
mod responses_api;
mod router_lifecycle;
mod router_proxy;
mod router_replicas;
mod routing_loops;
mod routing_parity;
mod serve_cli;
mod session_hints;
mod shaping_bench;
mod shaping_floor;
mod shaping_signals;
mod sim_capacity;
mod sim_disaggregated;
mod sim_peer_index;
mod sim_results;
mod sim_routing;
mod stalled_clients;
mod stream_endings;
mod tls;
mod tokenize;
mod tokenizer_hub;
mod tokens_byte_bpe;
mod tokens_chat_templates;
mod tokens_jinja_parity;
mod tokens_segments;
mod trace_recording;
mod tracing_otlp;
mod traffic_shaping;
mod unauthenticated_reads;
mod worker_churn;
