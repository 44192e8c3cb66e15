//! Issue 34: a tokenizer named by its Hugging Face id is fetched once, through `hf-hub`, into
//! the Hugging Face cache, and read from there on every later start, with the hub stopped; a
//! missing or gated model stops the start with the id, the endpoint and the hub's status.
//! The hub is a stand-in on 127.0.0.1 speaking its file API ([`crate::support::hub`]),
//! serving the real Qwen3 tokenizer.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kvroute::tokens::ModelTokens;
use kvroute::tokens::hub::{Hub, HubError};

use crate::support::hub::{FakeHub, HubRepo};
use crate::support::*;

const ID: &str = "kvroute-test/qwen3";
const GATED: &str = "kvroute-test/gated";
const NO_TOKENIZER: &str = "kvroute-test/weights-only";
const TOKEN: &str = "hf_kvroute_test_token";

fn qwen3_dir() -> PathBuf {
    fixtures().join("tokenizers/qwen3")
}

/// The stand-in with the Qwen3 tokenizer public, a gated copy, and a repository without a
/// tokenizer.
async fn hub() -> FakeHub {
    let public = HubRepo::from_dir(&qwen3_dir());
    let gated = HubRepo {
        token: Some(TOKEN.into()),
        ..public.clone()
    };
    let mut weights_only = HubRepo::default();
    weights_only
        .files
        .insert("config.json".into(), b"{}".to_vec());
    FakeHub::start(HashMap::from([
        (ID.to_owned(), public),
        (GATED.to_owned(), gated),
        (NO_TOKENIZER.to_owned(), weights_only),
    ]))
    .await
}

/// The token ids of a few prompts, as `tokens` encodes them.
fn encodings(tokens: &ModelTokens) -> Vec<Vec<u32>> {
    [
        "Hello, world!",
        "The quick brown fox jumps over the lazy dog. 1234567890",
        "<|im_start|>user\nKV caches, préfixes et 日本語<|im_end|>\n",
    ]
    .iter()
    .map(|p| tokens.tokenizer().encode(p).unwrap())
    .collect()
}

#[tokio::test]
async fn a_model_id_is_fetched_once_and_tokenizes_like_the_local_directory() {
    let hub_server = hub().await;
    let cache = tempfile::tempdir().unwrap();
    let hub = Hub::new(&hub_server.endpoint(), cache.path(), None, false);
    assert_eq!(hub.cached(ID), None);
    let dir = hub.fetch(ID).await.unwrap();
    assert!(dir.starts_with(cache.path()), "{}", dir.display());
    for file in ["tokenizer.json", "tokenizer_config.json"] {
        assert_eq!(
            std::fs::read(dir.join(file)).unwrap(),
            std::fs::read(qwen3_dir().join(file)).unwrap(),
            "{file}"
        );
    }
    let fetched = ModelTokens::from_hf_dir(&dir, 16, 0).unwrap();
    let local = ModelTokens::from_hf_dir(&qwen3_dir(), 16, 0).unwrap();
    assert_eq!(encodings(&fetched), encodings(&local));
    assert!(fetched.template().is_some(), "the chat template came along");
    // The hub has no chat_template.jinja for it: recorded, as huggingface_hub records it.
    let absent = cache
        .path()
        .join("models--kvroute-test--qwen3/.no_exist")
        .join(dir.file_name().unwrap())
        .join("chat_template.jinja");
    assert!(absent.exists(), "{}", absent.display());

    let asked = hub_server.requests();
    assert!(asked > 0);
    assert_eq!(hub.fetch(ID).await.unwrap(), dir);
    assert_eq!(
        hub_server.requests(),
        asked,
        "the second fetch asked the hub"
    );
    hub_server.stop().await;
}

#[tokio::test]
async fn a_second_start_uses_the_cache_with_the_hub_stopped() {
    let hub_server = hub().await;
    let endpoint = hub_server.endpoint();
    let home = tempfile::tempdir().unwrap();
    let cache = home.path().join("hub");
    let dir = Hub::new(&endpoint, &cache, None, false)
        .fetch(ID)
        .await
        .unwrap();
    hub_server.stop().await;
    // The hub is gone: the cache alone serves the same directory,
    let again = Hub::new(&endpoint, &cache, None, false).fetch(ID).await;
    assert_eq!(again.unwrap(), dir);
    // also when it lacks the record of the file the model does not have (a cache another
    // client filled), which the hub cannot be asked about now.
    let no_exist = cache.join("models--kvroute-test--qwen3/.no_exist");
    std::fs::remove_dir_all(&no_exist).unwrap();
    let again = Hub::new(&endpoint, &cache, None, false).fetch(ID).await;
    assert_eq!(again.unwrap(), dir);
    // And `kvroute serve` starts on it, with HF_HOME as the cache's parent.
    let (router, _file) = RouterProcess::start_env(
        "",
        &["--tokenizer", &format!("qwen={ID}")],
        Stdio::null(),
        &[
            ("HF_HOME", home.path()),
            ("HF_ENDPOINT", Path::new(&endpoint)),
            ("HF_HUB_OFFLINE", Path::new("0")),
        ],
    )
    .await;
    drop(router);
    // Offline with an empty cache: said so, with the fix.
    let empty = tempfile::tempdir().unwrap();
    let offline = Hub::new(&endpoint, empty.path(), None, true)
        .fetch(ID)
        .await;
    let message = offline.unwrap_err().to_string();
    assert!(
        message.contains("HF_HUB_OFFLINE") && message.contains(ID),
        "{message}"
    );
}

#[tokio::test]
async fn a_gated_model_is_fetched_with_hf_token_and_refused_without() {
    let hub_server = hub().await;
    let cache = tempfile::tempdir().unwrap();
    let without = Hub::new(&hub_server.endpoint(), cache.path(), None, false);
    match without.fetch(GATED).await {
        Err(HubError::Status { status, .. }) => assert_eq!(status.as_u16(), 401),
        other => panic!("{other:?}"),
    }
    let with = Hub::new(
        &hub_server.endpoint(),
        cache.path(),
        Some(TOKEN.into()),
        false,
    );
    let dir = with.fetch(GATED).await.unwrap();
    assert!(dir.join("tokenizer.json").exists());
    hub_server.stop().await;
}

/// `kvroute serve` with `args` and `env` (no `KVROUTE_*` or `HF_*` variable of the test's
/// own); its stderr once it exited, which it must within 30 s, and not with success.
fn refused(args: &[&str], env: &[(&str, String)]) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kvroute"));
    cmd.arg("serve");
    for (k, _) in
        std::env::vars().filter(|(k, _)| k.starts_with("KVROUTE_") || k.starts_with("HF_"))
    {
        cmd.env_remove(k);
    }
    let listen = format!("127.0.0.1:{}", quiet_port());
    let mut child = cmd
        .args(["--listen", &listen])
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kvroute serve starts");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("`kvroute serve {args:?}` started instead of refusing");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success(), "{args:?} exited 0: {stderr}");
    stderr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_or_gated_model_stops_the_start_with_id_endpoint_and_status() {
    let hub_server = hub().await;
    let endpoint = hub_server.endpoint();
    let home = tempfile::tempdir().unwrap();
    let env = [
        ("HF_HOME", home.path().display().to_string()),
        ("HF_ENDPOINT", endpoint.clone()),
    ];
    let cases = [
        (NO_TOKENIZER, "404", "check the id"),
        (GATED, "401", "HF_TOKEN"),
        ("kvroute-test/nobody-has-this", "401", "does not exist"),
    ];
    for (id, status, fix) in cases {
        let flag = format!("m={id}");
        let stderr = tokio::task::block_in_place(|| refused(&["--tokenizer", &flag], &env));
        for part in [id, endpoint.as_str(), status, fix, "model `m`"] {
            assert!(stderr.contains(part), "{id}: no `{part}` in:\n{stderr}");
        }
    }
    hub_server.stop().await;
    // Nothing listens there any more.
    let stderr =
        tokio::task::block_in_place(|| refused(&["--tokenizer", &format!("m={ID}")], &env));
    for part in [ID, endpoint.as_str(), "HF_HUB_OFFLINE=1"] {
        assert!(stderr.contains(part), "no `{part}` in:\n{stderr}");
    }
}

#[test]
fn a_path_that_does_not_exist_is_not_taken_for_an_id() {
    let stderr = refused(&["--tokenizer", "m=./models/llama"], &[]);
    assert!(
        stderr.contains("does not exist") && stderr.contains("./models/llama"),
        "{stderr}"
    );
}
