//! Issue 34: the mistakes a first deployment made silently, each now refused with its fix or
//! reported (flags over file values, the builtin tokenizer under KV events).

use std::path::Path;

use super::*;

/// The config of `text` under the flags `args`.
fn build(text: &str, args: &ServeArgs) -> Result<Config, ConfigError> {
    Config::build(parse_file(text, Path::new("test.toml"))?, args)
}

fn refusal(text: &str, args: &ServeArgs) -> (String, String) {
    match build(text, args) {
        Err(ConfigError::Invalid { key, message }) => (key, message),
        other => panic!("not refused: {other:?}"),
    }
}

fn worker_flag(flag: &str) -> ServeArgs {
    ServeArgs {
        workers: vec![flag.into()],
        ..Default::default()
    }
}

#[test]
fn the_engines_bind_address_is_refused_in_flags_and_files() {
    let (key, message) = refusal("", &worker_flag("http://h:8000=m@tcp://*:5557"));
    assert_eq!(key, "--worker #1");
    assert!(message.contains("tcp://HOST:5557"), "{message}");
    let file = "[[workers]]\nurl = \"http://h:8000\"\nkv_events = \"tcp://h:5557\"\n\
                kv_replay = \"tcp://*:5558\"\n";
    let (key, message) = refusal(file, &ServeArgs::default());
    assert_eq!(key, "workers[0].kv_replay");
    assert!(message.contains("tcp://HOST:5558"), "{message}");
}

#[test]
fn a_port_written_as_a_model_name_is_refused() {
    let (key, message) = refusal("", &worker_flag("http://h:8000=m@5557"));
    assert_eq!(key, "--worker #1");
    assert!(message.contains("m@tcp://HOST:5557"), "{message}");
}

#[test]
fn one_endpoint_for_events_and_replay_is_refused() {
    let (_, message) = refusal(
        "",
        &worker_flag("http://h:8000=m@tcp://h:5557@tcp://h:5557"),
    );
    assert!(message.contains("also the events endpoint"), "{message}");
}

#[test]
fn a_flag_over_a_file_value_is_recorded_with_its_variable() {
    let file = "policy = \"round_robin\"\n[server]\nlisten = \"127.0.0.1:9001\"\n\
                [tokens]\ndefault_block_size = 32\n";
    let args = ServeArgs {
        listen: Some("127.0.0.1:9002".into()),
        block_size: Some(64),
        ..Default::default()
    };
    let c = build(file, &args).unwrap();
    assert_eq!(c.listen.port(), 9002);
    assert_eq!(c.default_block_size, 64);
    let seen: Vec<(String, String)> = c
        .overrides
        .iter()
        .map(|o| (o.variable(), o.key.clone()))
        .collect();
    assert_eq!(
        seen,
        [
            ("KVROUTE_LISTEN".into(), "server.listen".into()),
            (
                "KVROUTE_BLOCK_SIZE".into(),
                "tokens.default_block_size".into()
            ),
        ]
    );
    // A flag with no file value to replace is no override.
    assert!(build("", &args).unwrap().overrides.is_empty());
}

#[test]
fn the_tokenizer_flag_lists_a_model_or_replaces_its_tokenizer() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().display().to_string();
    let args = ServeArgs {
        tokenizers: vec![format!("llama={path}"), format!("qwen={path}")],
        block_size: Some(32),
        ..Default::default()
    };
    let file = "[[models]]\nname = \"qwen\"\ntokenizer = \"builtin\"\nblock_size = 64\n";
    let c = build(file, &args).unwrap();
    let qwen = c.model("qwen");
    assert_eq!(qwen.tokenizer, TokenizerSource::Path(dir.path().into()));
    assert_eq!(qwen.block_size, 64, "the model's own block size stays");
    let llama = c.model("llama");
    assert_eq!(llama.tokenizer, TokenizerSource::Path(dir.path().into()));
    assert_eq!(llama.block_size, 32);
    assert_eq!(c.overrides[0].key, "models[0].tokenizer");
    assert_eq!(c.overrides[0].variable(), "KVROUTE_TOKENIZER");
    for bad in ["llama", "=x", "llama=", "llama=/nonexistent/tokenizer.json"] {
        let args = ServeArgs {
            tokenizers: vec![bad.into()],
            ..Default::default()
        };
        let (key, message) = refusal("", &args);
        assert!(key.starts_with("--tokenizer"), "{bad}: {key}");
        assert!(message.contains("tokenizer.json"), "{bad}: {message}");
    }
    let args = ServeArgs {
        block_size: Some(0),
        ..Default::default()
    };
    assert_eq!(refusal("", &args).0, "block_size");
}

#[test]
fn kv_events_under_the_builtin_tokenizer_are_warned_about() {
    let c = build("", &worker_flag("http://h:8000=m@tcp://h:5557")).unwrap();
    let warnings = c.builtin_tokenizer_warnings();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("model `m`"), "{}", warnings[0]);
    assert!(warnings[0].contains("--tokenizer"), "{}", warnings[0]);
    // Discovered models, no tokenizer anywhere: the worker is named.
    let c = build("", &worker_flag("http://h:8000@tcp://h:5557")).unwrap();
    let warnings = c.builtin_tokenizer_warnings();
    assert!(warnings[0].contains("worker `h:8000`"), "{warnings:?}");
    // Discovered workers publishing events, the only model builtin (the shipped overlay's
    // case before issue 34).
    let file = "[[models]]\nname = \"llama\"\ntokenizer = \"builtin\"\n\
                [discovery.dns]\nname = \"vllm.svc\"\nport = 8000\nkv_events_port = 5557\n";
    let warnings = build(file, &ServeArgs::default())
        .unwrap()
        .builtin_tokenizer_warnings();
    assert!(warnings[0].contains("[discovery.dns]"), "{warnings:?}");
    // No events, or a real tokenizer: nothing to say.
    let c = build("", &worker_flag("http://h:8000=m")).unwrap();
    assert!(c.builtin_tokenizer_warnings().is_empty());
    let dir = tempfile::tempdir().unwrap();
    let args = ServeArgs {
        tokenizers: vec![format!("m={}", dir.path().display())],
        ..worker_flag("http://h:8000=m@tcp://h:5557")
    };
    assert!(
        build("", &args)
            .unwrap()
            .builtin_tokenizer_warnings()
            .is_empty()
    );
}
