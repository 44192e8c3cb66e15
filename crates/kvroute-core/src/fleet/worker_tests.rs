//! Tests of [`super`]: health thresholds, worker URLs, models configured or discovered.

use super::*;
use crate::fleet::WorkerUrlError;

/// Worker `w` at `http://h:1` with `models` configured.
fn spec(models: &[&str]) -> WorkerSpec {
    WorkerSpec {
        id: "w".into(),
        url: BaseUrl::parse("http://h:1").unwrap(),
        models: models.iter().map(|m| (*m).into()).collect(),
        kv_events: None,
        kv_replay: None,
        kv_blocks: None,
        data_parallel_size: 1,
        role: crate::fleet::Role::Both,
        bootstrap_port: None,
    }
}

#[test]
fn health_flips_after_thresholds_and_down_runs_the_hook() {
    let downs = Arc::new(AtomicU32::new(0));
    let d = Arc::clone(&downs);
    let hook: DownHook = Arc::new(move |_| {
        d.fetch_add(1, Ordering::Relaxed);
    });
    let spec = spec(&["m"]);
    let w = Worker::with(
        spec,
        &[WorkerId(0)],
        BreakerConfig::default(),
        Some(hook),
        Weak::new(),
    );
    assert!(w.observe_check(false, 2, 3));
    assert!(w.observe_check(false, 2, 3));
    assert!(w.observe_check(true, 2, 3), "a success resets the streak");
    assert!(w.observe_check(false, 2, 3));
    assert!(w.observe_check(false, 2, 3));
    assert!(!w.observe_check(false, 2, 3));
    assert_eq!(downs.load(Ordering::Relaxed), 1);
    assert!(!w.observe_check(true, 2, 3));
    assert!(w.observe_check(true, 2, 3));
    w.set_draining(true);
    assert!(!w.is_routable(Instant::now()));
    assert_eq!(downs.load(Ordering::Relaxed), 1);
}

#[test]
fn base_url_parsing() {
    let b = BaseUrl::parse("http://127.0.0.1:8101").unwrap();
    assert_eq!(b.host_port(), "127.0.0.1:8101");
    assert_eq!(
        b.join("/v1/models").to_string(),
        "http://127.0.0.1:8101/v1/models"
    );
    let p = BaseUrl::parse("http://h:1/prefix/").unwrap();
    assert_eq!(
        p.join("/v1/x?a=1").to_string(),
        "http://h:1/prefix/v1/x?a=1"
    );
    assert_eq!(BaseUrl::parse("http://h").unwrap().host_port(), "h:80");
    // An OpenAI `base_url` pasted as a worker URL means the server, not `/v1/v1/…`.
    for pasted in ["http://h:1/v1", "http://h:1/v1/"] {
        let b = BaseUrl::parse(pasted).unwrap();
        assert_eq!(b.to_string(), "http://h:1");
        assert_eq!(
            b.join("/v1/completions").to_string(),
            "http://h:1/v1/completions"
        );
    }
    assert_eq!(
        BaseUrl::parse("http://h:1/engine-a/v1")
            .unwrap()
            .to_string(),
        "http://h:1/engine-a"
    );
    assert_eq!(
        BaseUrl::parse("http://h:1/v10").unwrap().to_string(),
        "http://h:1/v10"
    );
    assert!(matches!(
        BaseUrl::parse("ftp://h:1"),
        Err(WorkerUrlError::Scheme(_))
    ));
    let https = BaseUrl::parse("https://h/v1").unwrap();
    assert!(https.is_tls());
    assert_eq!(https.host_port(), "h:443");
    assert_eq!(https.join("/v1/models").to_string(), "https://h/v1/models");
    assert_eq!(https.to_string(), "https://h");
    assert!(matches!(
        BaseUrl::parse("not a url"),
        Err(WorkerUrlError::Invalid(_))
    ));
    assert!(BaseUrl::parse("127.0.0.1:80").is_err());
}

#[test]
fn configured_models_win_over_discovered() {
    let spec = spec(&["a"]);
    let w = Worker::new(spec.clone(), WorkerId(0));
    w.set_discovered_models(vec!["b".into()]);
    assert!(w.serves("a") && !w.serves("b"));
    let w = Worker::new(
        WorkerSpec {
            models: vec![],
            ..spec
        },
        WorkerId(1),
    );
    assert!(!w.serves("b"));
    w.set_discovered_models(vec!["b".into()]);
    assert!(w.serves("b"));
    assert_eq!(w.models(), vec!["b".to_string()]);
    assert_eq!(w.adapter_base("b"), None);
    w.set_discovered_models(vec![
        "b".into(),
        ServedModel {
            id: "b-lora".into(),
            parent: Some("b".into()),
            max_model_len: Some(4096),
        },
    ]);
    assert!(w.serves("b-lora"));
    assert_eq!(w.adapter_base("b-lora").as_deref(), Some("b"));
    assert_eq!(w.adapter_base("b"), None);
    assert_eq!(w.max_model_len("b-lora"), Some(4096));
    assert_eq!(w.max_model_len("b"), None);
}

/// Workers compare their contexts by digest before any lookup: equal only for the same
/// `max_model_len` per model, whatever order the models were listed in.
#[test]
fn contexts_digests_are_equal_only_for_equal_contexts() {
    let model = |id: &str, len: Option<u64>| ServedModel {
        id: id.into(),
        parent: None,
        max_model_len: len,
    };
    let digest = |models: Vec<ServedModel>| {
        let w = Worker::new(spec(&[]), WorkerId(1));
        assert_eq!(w.contexts_digest(), 0);
        w.set_discovered_models(models);
        w.contexts_digest()
    };
    let a = digest(vec![model("a", Some(4096)), model("b", Some(32_768))]);
    assert_ne!(a, 0);
    assert_eq!(
        a,
        digest(vec![model("b", Some(32_768)), model("a", Some(4096))])
    );
    assert_ne!(
        a,
        digest(vec![model("a", Some(4096)), model("b", Some(16_384))])
    );
    assert_ne!(a, digest(vec![model("a", Some(4096))]));
    assert_eq!(digest(vec![model("a", None)]), 0);
}
