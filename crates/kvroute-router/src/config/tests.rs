//! Tests of the whole configuration: defaults, flags over file, errors that name their key,
//! the example file, and the keys that moved to `[server]`.

use std::path::Path;

use super::*;
use crate::policy::PolicyKind;

fn load(text: &str) -> Result<Config, ConfigError> {
    Config::from_toml(text, Path::new("test.toml"))
}

#[test]
fn defaults() {
    let c = load("").unwrap();
    assert_eq!(c.listen.to_string(), DEFAULT_LISTEN);
    assert_eq!(c.policy, DEFAULT_POLICY);
    assert_eq!(c.max_body_bytes, 32 << 20);
    assert!(c.workers.is_empty());
}

#[test]
fn worker_flags() {
    let w = parse_worker_flag("http://127.0.0.1:8101").unwrap();
    assert_eq!(w.id, "127.0.0.1:8101");
    assert!(w.models.is_empty());
    let w = parse_worker_flag("http://h:1=a,b@tcp://h:5557").unwrap();
    assert_eq!(w.models, ["a", "b"]);
    assert_eq!(w.kv_events.as_deref(), Some("tcp://h:5557"));
    assert!(
        parse_worker_flag("ftp://x")
            .unwrap_err()
            .to_string()
            .contains("http")
    );
}

#[test]
fn flags_override_file() {
    let args = ServeArgs {
        listen: Some("127.0.0.1:9999".into()),
        policy: Some(PolicyKind::Random),
        workers: vec!["http://127.0.0.1:2=m".into()],
        ..Default::default()
    };
    let file = parse_file(
        "listen = \"127.0.0.1:1\"\npolicy = \"round_robin\"\n[[workers]]\nurl = \"http://127.0.0.1:1\"\n",
        Path::new("f"),
    )
    .unwrap();
    let c = Config::build(file, &args).unwrap();
    assert_eq!(c.listen.port(), 9999);
    assert_eq!(c.policy, PolicyKind::Random);
    assert_eq!(c.workers.len(), 2);
}

#[test]
fn errors_name_the_key() {
    let cases = [
        ("listen = \"nope\"", "listen"),
        ("policy = \"fastest\"", "policy"),
        ("[proxy]\nretries = 50", "proxy.retries"),
        ("[health]\ninterval_s = -1", "health.interval_s"),
        ("[[workers]]\nurl = \"ftp://x\"", "workers[0].url"),
        (
            "[[workers]]\nurl = \"http://a:1\"\nkv_events = \"a:1\"",
            "workers[0].kv_events",
        ),
        (
            "[[workers]]\nurl = \"http://a:1\"\n[[workers]]\nurl = \"http://a:1\"",
            "workers",
        ),
        (
            "[[models]]\nname = \"m\"\nttft_target_ms = 0",
            "models[0].ttft_target_ms",
        ),
        (
            "[limits]\nmax_concurrency = 4\n[priority]\nheadroom = 2\nfair_reserve = 2",
            "priority.fair_reserve",
        ),
    ];
    for (text, key) in cases {
        match load(text) {
            Err(ConfigError::Invalid { key: k, .. }) => assert_eq!(k, key, "{text}"),
            other => panic!("{text}: {other:?}"),
        }
    }
}

#[test]
fn unknown_keys_are_rejected_with_their_name() {
    let e = load("polcy = \"random\"").unwrap_err().to_string();
    assert!(e.contains("polcy"), "{e}");
    let e = load("[proxy]\nretry = 1").unwrap_err().to_string();
    assert!(e.contains("retry"), "{e}");
}

#[test]
fn example_config_loads() {
    let text = include_str!("../../../../config/kvroute.example.toml");
    let c = load(text).unwrap();
    assert!(!c.workers.is_empty());
    assert_eq!(c.workers[0].kv_blocks, Some(27264));
    assert_eq!(c.workers[1].kv_blocks, None);
}

/// The engines' long-prefill cap is the cost model's to know: unset it is 0 (vLLM's default),
/// and the example says so.
#[test]
fn the_engines_long_prefill_cap_reaches_the_cost_model() {
    assert_eq!(load("").unwrap().kv_aware.long_prefill_token_threshold, 0);
    let c = load("[kv_aware]\nlong_prefill_token_threshold = 2048\n").unwrap();
    assert_eq!(c.kv_aware.long_prefill_token_threshold, 2048);
    let example = load(include_str!("../../../../config/kvroute.example.toml")).unwrap();
    assert_eq!(example.kv_aware.long_prefill_token_threshold, 0);
    let e = load("[kv_aware]\nlong_prefill_token_threshold = -1\n").unwrap_err();
    assert!(
        e.to_string().contains("long_prefill_token_threshold"),
        "{e}"
    );
}

/// The example's `[priority]` block is commented out (the defaults), but uncommented it loads
/// as documented.
#[test]
fn the_example_priority_block_loads_when_uncommented() {
    let text = include_str!("../../../../config/kvroute.example.toml");
    let start = text.find("# [priority]\n").unwrap();
    let end = start + text[start..].find("\n\n").unwrap();
    let block: String = text[start..end]
        .lines()
        .map(|l| l.strip_prefix("# ").unwrap_or(l.trim_start_matches('#')))
        .collect::<Vec<_>>()
        .join("\n");
    let c = load(&block).unwrap();
    assert_eq!(c.isolation, crate::shaping::Isolation::default());
    let p = c.priorities;
    assert_eq!(p.bands, ["high", "normal", "low"]);
    assert_eq!((p.default_band, p.sheddable), (1, vec![false, false, true]));
}

/// The example's `[discovery]` block is commented out (the example must not watch anything),
/// but uncommented it loads as documented.
#[cfg(feature = "kubernetes")]
#[test]
fn the_example_discovery_block_loads_when_uncommented() {
    let text = include_str!("../../../../config/kvroute.example.toml");
    let start = text.find("# [discovery]\n").unwrap();
    let end = start + text[start..].find("\n\n").unwrap();
    let block: String = text[start..end]
        .lines()
        .map(|l| l.strip_prefix("# ").unwrap_or(l.trim_start_matches('#')))
        .collect::<Vec<_>>()
        .join("\n");
    let d = load(&block).unwrap().discovery;
    let k = d.kubernetes.unwrap();
    assert_eq!(k.label_selector, "app.kubernetes.io/name=vllm");
    assert_eq!(k.namespace.as_deref(), Some("llm"));
    let dns = d.dns.unwrap();
    assert_eq!((dns.port, dns.kv_events_port), (8000, Some(5557)));
    assert_eq!(dns.data_parallel_size, 1);
    assert_eq!(d.drain_timeout, DEFAULT_DRAIN_TIMEOUT);
}

#[test]
fn dns_discovered_workers_may_be_data_parallel() {
    let dns = |extra: &str| {
        load(&format!(
            "[discovery.dns]\nname = \"vllm\"\nport = 8000\nkv_events_port = 5557\n{extra}"
        ))
    };
    let d = dns("kv_replay_port = 5567\ndata_parallel_size = 4")
        .unwrap()
        .discovery
        .dns
        .unwrap();
    assert_eq!(d.data_parallel_size, 4);
    for (extra, key) in [
        ("data_parallel_size = 0", "discovery.dns.data_parallel_size"),
        (
            "kv_replay_port = 5558\ndata_parallel_size = 2",
            "discovery.dns.kv_replay_port",
        ),
    ] {
        let e = dns(extra).unwrap_err().to_string();
        assert!(e.contains(key), "{extra}: {e}");
    }
}

#[test]
fn the_config_file_watch_is_off_unless_given_an_interval() {
    assert_eq!(load("").unwrap().config_reload_interval, None);
    let at = |v: &str| load(&format!("[server]\nconfig_reload_interval_s = {v}"));
    assert_eq!(at("0").unwrap().config_reload_interval, None);
    assert_eq!(
        at("2.5").unwrap().config_reload_interval,
        Some(std::time::Duration::from_millis(2500))
    );
    let e = at("-1").unwrap_err().to_string();
    assert!(e.contains("server.config_reload_interval_s"), "{e}");
}

#[test]
fn tracing_settings_are_checked() {
    let c = load(
        "[tracing]\nenabled = true\nendpoint = \"http://c:4318\"\nservice_name = \"r\"\n\
         sampling_ratio = 0.25",
    );
    if cfg!(feature = "otel") {
        let t = c.unwrap().tracing;
        assert_eq!(t.enabled, Some(true));
        assert_eq!(t.endpoint.as_deref(), Some("http://c:4318"));
        assert_eq!(t.sampling_ratio, Some(0.25));
    } else {
        assert!(c.unwrap_err().to_string().contains("otel"));
    }
    assert_eq!(load("").unwrap().tracing, TracingConfig::default());
    for (bad, key) in [
        ("[tracing]\nsampling_ratio = 1.5", "tracing.sampling_ratio"),
        ("[tracing]\nendpoint = \"c:4318\"", "tracing.endpoint"),
        ("[tracing]\nservice_name = \"\"", "tracing.service_name"),
    ] {
        let e = load(bad).unwrap_err().to_string();
        assert!(e.contains(key), "{bad}: {e}");
    }
}

#[test]
fn the_example_config_uses_no_deprecated_key() {
    let c = load(include_str!("../../../../config/kvroute.example.toml")).unwrap();
    assert!(c.deprecations.is_empty(), "{:?}", c.deprecations);
}

#[test]
fn a_model_names_the_engine_kind_that_renders_its_chats() {
    let c =
        load("[[models]]\nname = \"s\"\nengine = \"sglang\"\n[[models]]\nname = \"v\"").unwrap();
    assert_eq!(c.model("s").engine, crate::tokens::EngineKind::Sglang);
    assert_eq!(c.model("v").engine, crate::tokens::EngineKind::Vllm);
    assert_eq!(c.model("unlisted").engine, crate::tokens::EngineKind::Vllm);
}

#[test]
fn lora_adapters_name_their_base_model_and_take_its_tokenizer() {
    let c = load("[[models]]\nname = \"base\"\n[[models]]\nname = \"sql\"\nbase_model = \"base\"")
        .unwrap();
    assert_eq!(c.model("sql").base_model.as_deref(), Some("base"));
    assert_eq!(c.model("base").base_model, None);
    for (extra, key) in [
        ("base_model = \"sql\"", "models[0].base_model"),
        ("base_model = \"\"", "models[0].base_model"),
        (
            "base_model = \"b\"\nblock_size = 32",
            "models[0].block_size",
        ),
        (
            "base_model = \"b\"\ntokenizer = \"builtin\"",
            "models[0].tokenizer",
        ),
        (
            "base_model = \"b\"\nengine = \"sglang\"",
            "models[0].engine",
        ),
        ("engine = \"trt\"", "models[0].engine"),
    ] {
        let e = load(&format!("[[models]]\nname = \"sql\"\n{extra}"))
            .unwrap_err()
            .to_string();
        assert!(e.contains(key), "{extra}: {e}");
    }
}

#[test]
fn a_zero_kv_capacity_is_rejected_with_its_key() {
    let e = load("[[workers]]\nurl = \"http://127.0.0.1:1\"\nkv_blocks = 0")
        .unwrap_err()
        .to_string();
    assert!(e.contains("workers[0].kv_blocks"), "{e}");
}

#[test]
fn front_door_keys_live_under_server() {
    let c = load(
        "[server]\nlisten = \"127.0.0.1:9001\"\nmax_body_bytes = 4096\nshutdown_grace_s = 2.0\nheader_read_timeout_s = 3.0\nbody_read_timeout_s = 4.0",
    )
    .unwrap();
    assert_eq!(c.listen.port(), 9001);
    assert_eq!(c.max_body_bytes, 4096);
    assert_eq!(c.shutdown_grace, Duration::from_secs(2));
    assert_eq!(c.header_read_timeout, Duration::from_secs(3));
    assert_eq!(c.body_read_timeout, Duration::from_secs(4));
    assert!(c.deprecations.is_empty());
    let e = load("[server]\nmax_body_bytes = 10")
        .unwrap_err()
        .to_string();
    assert!(e.contains("`server.max_body_bytes`"), "{e}");
}

#[test]
fn old_front_door_keys_still_work_with_a_warning_naming_the_new_key() {
    let c = load(
        "listen = \"127.0.0.1:9002\"\nmax_body_bytes = 4096\nshutdown_grace_s = 2.0\n[proxy]\nheader_read_timeout_s = 3.0\nbody_read_timeout_s = 4.0",
    )
    .unwrap();
    assert_eq!(c.listen.port(), 9002);
    assert_eq!(c.max_body_bytes, 4096);
    assert_eq!(c.shutdown_grace, Duration::from_secs(2));
    assert_eq!(c.header_read_timeout, Duration::from_secs(3));
    assert_eq!(c.body_read_timeout, Duration::from_secs(4));
    assert_eq!(c.deprecations, MOVED_TO_SERVER);
    let warnings: Vec<String> = c.deprecations.iter().map(ToString::to_string).collect();
    assert_eq!(
        warnings,
        [
            "`listen` is deprecated; use `server.listen`",
            "`max_body_bytes` is deprecated; use `server.max_body_bytes`",
            "`shutdown_grace_s` is deprecated; use `server.shutdown_grace_s`",
            "`proxy.header_read_timeout_s` is deprecated; use `server.header_read_timeout_s`",
            "`proxy.body_read_timeout_s` is deprecated; use `server.body_read_timeout_s`",
        ]
    );
    // A bad value is reported under the key the operator wrote.
    let e = load("[proxy]\nbody_read_timeout_s = -1")
        .unwrap_err()
        .to_string();
    assert!(e.contains("`proxy.body_read_timeout_s`"), "{e}");
}

#[test]
fn a_front_door_key_at_both_places_is_an_error() {
    for (text, key) in [
        (
            "listen = \"127.0.0.1:1\"\n[server]\nlisten = \"127.0.0.1:2\"",
            "server.listen",
        ),
        (
            "max_body_bytes = 4096\n[server]\nmax_body_bytes = 4096",
            "server.max_body_bytes",
        ),
        (
            "shutdown_grace_s = 1.0\n[server]\nshutdown_grace_s = 1.0",
            "server.shutdown_grace_s",
        ),
        (
            "[proxy]\nheader_read_timeout_s = 1.0\n[server]\nheader_read_timeout_s = 1.0",
            "server.header_read_timeout_s",
        ),
        (
            "[proxy]\nbody_read_timeout_s = 1.0\n[server]\nbody_read_timeout_s = 1.0",
            "server.body_read_timeout_s",
        ),
    ] {
        match load(text) {
            Err(ConfigError::Invalid { key: k, message }) => {
                assert_eq!(k, key, "{text}");
                assert!(message.contains("deprecated"), "{message}");
            }
            other => panic!("{text}: {other:?}"),
        }
    }
}

#[test]
fn the_listen_flag_overrides_server_listen() {
    let args = ServeArgs {
        listen: Some("127.0.0.1:9999".into()),
        ..Default::default()
    };
    let file = parse_file("[server]\nlisten = \"127.0.0.1:1\"\n", Path::new("f")).unwrap();
    assert_eq!(Config::build(file, &args).unwrap().listen.port(), 9999);
}

#[test]
fn connection_keys_are_read_and_checked() {
    let c = load("").unwrap();
    assert_eq!(c.connections, Connections::default());
    assert_eq!(c.connections.max_connections, None, "derived at start");
    let c = load(
        "[server]\nidle_timeout_s = 5.0\nmax_connections = 100\nhttp2_keepalive_interval_s = 3.0\nhttp2_keepalive_timeout_s = 2.0\n",
    )
    .unwrap();
    assert_eq!(c.connections.idle_timeout, Duration::from_secs(5));
    assert_eq!(c.connections.max_connections, Some(100));
    assert_eq!(
        c.connections.http2_keepalive_interval,
        Duration::from_secs(3)
    );
    assert_eq!(
        c.connections.http2_keepalive_timeout,
        Duration::from_secs(2)
    );
    for (text, key) in [
        ("[server]\nmax_connections = 0", "server.max_connections"),
        ("[server]\nidle_timeout_s = 0.0", "server.idle_timeout_s"),
        (
            "[server]\nhttp2_keepalive_timeout_s = -1.0",
            "server.http2_keepalive_timeout_s",
        ),
    ] {
        let e = load(text).unwrap_err().to_string();
        assert!(e.contains(key), "{text}: {e}");
    }
}

#[test]
fn defaults_are_the_named_constants() {
    let c = load("").unwrap();
    assert_eq!(c.shutdown_grace, DEFAULT_SHUTDOWN_GRACE);
    assert_eq!(c.header_read_timeout, DEFAULT_HEADER_READ_TIMEOUT);
    assert_eq!(c.body_read_timeout, DEFAULT_BODY_READ_TIMEOUT);
    assert_eq!(c.max_body_bytes as u64, DEFAULT_MAX_BODY_BYTES);
    assert_eq!(c.default_block_size, DEFAULT_BLOCK_SIZE);
    assert_eq!(c.token_cache_bytes, DEFAULT_TOKEN_CACHE_MB << 20);
    assert_eq!(c.seed, DEFAULT_SEED);
    let proxy = ProxyConfig::default();
    assert_eq!(c.proxy.connect_timeout, proxy.connect_timeout);
    assert_eq!(c.proxy.total_timeout, proxy.total_timeout);
    assert_eq!(c.proxy.retries, proxy.retries);
    assert_eq!(c.breaker, BreakerConfig::default());
    assert_eq!(c.index, IndexSettings::default());
    assert_eq!(c.limits, Limits::default());
    assert_eq!(c.kv_aware, KvAwareConfig::default());
    assert_eq!(
        c.model("unlisted").forward_cache_salt,
        DEFAULT_FORWARD_CACHE_SALT
    );
}

/// What an operator tripped on (issue 14, item 15): an empty tenant model list was accepted
/// and refused every request; a missing file printed its OS error twice; a huge number was
/// printed digit by digit.
#[test]
fn operator_slips_get_one_clear_message() {
    let tenant = |models: &str| {
        format!(
            "[[tenants]]\nname = \"t\"\napi_key_sha256 = \"{}\"\n{models}",
            "ab".repeat(32)
        )
    };
    match load(&tenant("models = []")) {
        Err(ConfigError::Invalid { key, message }) => {
            assert_eq!(key, "tenants[0].models");
            assert!(message.contains("lists no model"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert!(load(&tenant("models = [\"\"]")).is_err());
    assert!(load(&tenant("models = [\"m\"]")).is_ok());
    assert!(load(&tenant("")).is_ok());

    let args = ServeArgs {
        config: Some("/nonexistent/kvroute.toml".into()),
        ..Default::default()
    };
    let e = anyhow::Error::from(Config::load(&args).unwrap_err());
    let shown = format!("{e:#}");
    assert_eq!(
        shown.matches("No such file").count(),
        1,
        "the OS error once: {shown}"
    );
    assert!(shown.contains("/nonexistent/kvroute.toml"), "{shown}");

    let e = load("[health]\ninterval_s = 1e300")
        .unwrap_err()
        .to_string();
    assert!(e.contains("1e300"), "{e}");
    assert!(e.len() < 200, "{e}");
}

/// A worker URL pasted with the OpenAI `/v1` suffix routes to the server, not `/v1/v1/…`.
#[test]
fn a_worker_url_ending_in_v1_means_the_server() {
    let c = load("[[workers]]\nurl = \"http://127.0.0.1:8101/v1\"\n").unwrap();
    assert_eq!(c.workers[0].url.to_string(), "http://127.0.0.1:8101");
    let w = parse_worker_flag("http://h:1/v1/=m").unwrap();
    assert_eq!(w.url.to_string(), "http://h:1");
}

#[test]
fn breaker_keys_are_validated_and_the_old_count_is_deprecated() {
    let c = load(
        "[proxy]\nbreaker_window_s = 30\nbreaker_min_requests = 20\nbreaker_failure_rate = 0.25\nbreaker_open_s = 5",
    )
    .unwrap();
    assert_eq!(
        c.breaker,
        BreakerConfig {
            window: Duration::from_secs(30),
            min_requests: 20,
            failure_rate: 0.25,
            open_for: Duration::from_secs(5),
        }
    );
    assert!(c.deprecations.is_empty());
    let old = load("[proxy]\nbreaker_failures = 7").unwrap();
    assert_eq!(old.breaker.min_requests, 7);
    assert_eq!(
        old.deprecations
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        ["`proxy.breaker_failures` is deprecated; use `proxy.breaker_min_requests`"]
    );
    for (text, key) in [
        (
            "[proxy]\nbreaker_failure_rate = 0",
            "proxy.breaker_failure_rate",
        ),
        (
            "[proxy]\nbreaker_failure_rate = 1.5",
            "proxy.breaker_failure_rate",
        ),
        (
            "[proxy]\nbreaker_failure_rate = nan",
            "proxy.breaker_failure_rate",
        ),
        (
            "[proxy]\nbreaker_min_requests = 0",
            "proxy.breaker_min_requests",
        ),
        ("[proxy]\nbreaker_failures = 0", "proxy.breaker_failures"),
        ("[proxy]\nbreaker_window_s = 0", "proxy.breaker_window_s"),
        (
            "[proxy]\nbreaker_failures = 3\nbreaker_min_requests = 3",
            "proxy.breaker_min_requests",
        ),
    ] {
        let e = load(text).unwrap_err().to_string();
        assert!(e.contains(&format!("`{key}`")), "{text}: {e}");
    }
}

#[test]
fn metrics_listen_is_an_address_apart_from_listen() {
    let c = load("[server]\nmetrics_listen = \"127.0.0.1:9100\"").unwrap();
    assert_eq!(c.metrics_listen, Some("127.0.0.1:9100".parse().unwrap()));
    assert_eq!(load("").unwrap().metrics_listen, None);
    for text in [
        "[server]\nmetrics_listen = \"nope\"",
        "[server]\nlisten = \"127.0.0.1:9100\"\nmetrics_listen = \"0.0.0.0:9100\"",
    ] {
        let e = load(text).unwrap_err().to_string();
        assert!(e.contains("`server.metrics_listen`"), "{text}: {e}");
    }
    // A worker at the metrics address is the router itself.
    let e = load("[server]\nmetrics_listen = \"127.0.0.1:9100\"\n[[workers]]\nurl = \"http://127.0.0.1:9100\"")
        .unwrap_err()
        .to_string();
    assert!(e.contains("own listen address"), "{e}");
}

#[test]
fn the_body_budget_follows_the_body_limit_and_must_hold_one_body() {
    let c = load("").unwrap();
    assert_eq!(c.limits.max_body_bytes_in_flight, 4 * c.max_body_bytes);
    let c = load("[server]\nmax_body_bytes = 4096").unwrap();
    assert_eq!(c.limits.max_body_bytes_in_flight, 4 * 4096);
    let c =
        load("[server]\nmax_body_bytes = 4096\n[limits]\nmax_body_bytes_in_flight = 4096").unwrap();
    assert_eq!(c.limits.max_body_bytes_in_flight, 4096);
    let e = load("[server]\nmax_body_bytes = 4096\n[limits]\nmax_body_bytes_in_flight = 4095")
        .unwrap_err()
        .to_string();
    assert!(e.contains("`limits.max_body_bytes_in_flight`"), "{e}");
}

/// Prefix pieces bound what a queued prefill blocks: the policy is built with the smaller of
/// the piece and the engines' own cap, and with neither cap without pieces.
#[test]
fn prefix_pieces_cap_the_policys_priced_wait() {
    let threshold = |text: &str| {
        load(text)
            .unwrap()
            .policy_settings()
            .kv_aware
            .long_prefill_token_threshold
    };
    assert_eq!(threshold(""), 0);
    assert_eq!(threshold("[proxy]\nprefill_piece_tokens = 16384\n"), 16_384);
    assert_eq!(
        threshold(
            "[proxy]\nprefill_piece_tokens = 16384\n[kv_aware]\nlong_prefill_token_threshold = 4096\n"
        ),
        4_096
    );
    assert_eq!(
        threshold("[kv_aware]\nlong_prefill_token_threshold = 4096\n"),
        4_096
    );
}
