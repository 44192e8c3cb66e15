//! Issue 34: `kvroute serve` as a newcomer starts it, from the README and `--help` alone. Each
//! mistake that used to be accepted silently stops the start with its fix, or is logged.

use std::io::BufRead;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;

/// `kvroute serve` with `args` and `env` (no other `KVROUTE_*` variable).
fn serve(args: &[&str], env: &[(&str, String)]) -> std::process::Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kvroute"));
    cmd.arg("serve");
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("KVROUTE_")) {
        cmd.env_remove(k);
    }
    cmd.args(args)
        .envs(env.iter().map(|(k, v)| (*k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kvroute serve starts")
}

/// The stderr of a start that must fail, once the process exited (within 20 s).
fn refused(args: &[&str]) -> String {
    let mut child = serve(args, &[]);
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("`kvroute serve {args:?}` started instead of refusing");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success(), "{args:?} exited 0: {stderr}");
    stderr
}

#[test]
fn the_engines_bind_address_stops_the_start_with_the_host_to_use() {
    let stderr = refused(&["--worker", "http://127.0.0.1:9=m@tcp://*:5557"]);
    assert!(stderr.contains("tcp://HOST:5557"), "{stderr}");
}

#[test]
fn a_port_after_the_model_name_stops_the_start() {
    let stderr = refused(&["--worker", "http://127.0.0.1:9=m@5557"]);
    assert!(stderr.contains("m@tcp://HOST:5557"), "{stderr}");
}

#[test]
fn one_endpoint_for_events_and_replay_stops_the_start() {
    let stderr = refused(&[
        "--worker",
        "http://127.0.0.1:9=m@tcp://127.0.0.1:5557@tcp://127.0.0.1:5557",
    ]);
    assert!(stderr.contains("also the events endpoint"), "{stderr}");
}

/// The variable that beat the file's `listen` is named at INFO, and a model whose worker
/// publishes KV events under the builtin tokenizer gets a WARN with the fix.
#[test]
fn the_log_names_the_variable_over_the_file_and_the_builtin_tokenizer() {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        file.path(),
        format!("[server]\nlisten = \"127.0.0.1:{}\"\n", quiet_port()),
    )
    .unwrap();
    let config = file.path().display().to_string();
    let worker = format!(
        "http://127.0.0.1:{}=m@tcp://127.0.0.1:{}",
        quiet_port(),
        quiet_port()
    );
    let env = [
        ("KVROUTE_LISTEN", format!("127.0.0.1:{}", quiet_port())),
        ("KVROUTE_CONFIG", config),
        ("KVROUTE_WORKER", worker),
    ];
    let mut child = serve(&[], &env);
    let stderr = child.stderr.take().unwrap();
    let lines = std::thread::spawn(move || {
        let mut seen = Vec::new();
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            seen.push(line);
            let all = seen.join("\n");
            if all.contains("KVROUTE_LISTEN") && all.contains("builtin tokenizer") {
                break;
            }
        }
        seen
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    while !lines.is_finished() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    let log = lines.join().unwrap().join("\n");
    let overrode = log
        .lines()
        .find(|l| l.contains("KVROUTE_LISTEN"))
        .unwrap_or_else(|| panic!("no line names KVROUTE_LISTEN:\n{log}"));
    assert!(
        overrode.contains("INFO") && overrode.contains("server.listen"),
        "{overrode}"
    );
    let builtin = log
        .lines()
        .find(|l| l.contains("builtin tokenizer"))
        .unwrap_or_else(|| panic!("no builtin-tokenizer warning:\n{log}"));
    assert!(
        builtin.contains("WARN")
            && builtin.contains("model `m`")
            && builtin.contains("--tokenizer"),
        "{builtin}"
    );
}

/// The workers as `GET /admin/workers` lists them (no admin key: reads are open).
async fn admin_workers(addr: std::net::SocketAddr) -> Vec<serde_json::Value> {
    let v: serde_json::Value = client()
        .get(format!("http://{addr}/admin/workers"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["workers"].as_array().unwrap().clone()
}

fn router_over(workers: &str) -> kvroute::config::Config {
    let text = format!(
        "policy = \"round_robin\"\nshutdown_grace_s = 1.0\n[health]\ninterval_s = 0.05\n\
         timeout_s = 0.5\n{workers}"
    );
    kvroute::config::Config::from_toml(&text, std::path::Path::new("test")).unwrap()
}

/// A failed health check says why, in the admin API and in `/ready`'s 503: the status a
/// worker answered, or the connection error of one where nothing listens.
#[tokio::test]
async fn a_failed_health_check_says_why() {
    let b = Backend::start("a", &["m"]).await;
    b.set(|x| x.health_status = 503);
    let nobody = quiet_port();
    let r = start_router(&router_over(&format!(
        "[[workers]]\nid = \"answers\"\nurl = \"{}\"\nmodels = [\"m\"]\n\
         [[workers]]\nid = \"nobody\"\nurl = \"http://127.0.0.1:{nobody}\"\nmodels = [\"m\"]\n",
        b.url()
    )))
    .await;
    let fleet = std::sync::Arc::clone(&r.state.fleet);
    assert!(
        eventually(|| fleet.workers().iter().all(|w| w.health_error().is_some())).await,
        "both checks failed with a reason"
    );
    let workers = admin_workers(r.addr).await;
    let error = |id: &str| {
        let w = workers.iter().find(|w| w["id"] == id).unwrap();
        w["health_error"].as_str().unwrap_or_default().to_owned()
    };
    assert!(error("answers").contains("503"), "{workers:?}");
    assert!(
        error("nobody").to_ascii_lowercase().contains("refused"),
        "{workers:?}"
    );
    let ready = client()
        .get(format!("http://{}/ready", r.addr))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 503);
    let body = ready.text().await.unwrap();
    assert!(body.contains("`answers`") && body.contains("503"), "{body}");
    r.shutdown().await;
}

/// `kv_events_connected` is true only once something arrived from the engine: a SUB socket
/// "connects" to a port where nothing listens without an error.
#[tokio::test]
async fn kv_events_connected_means_the_engine_was_heard_from() {
    let engine = SimEngine::start("m", 1, 100.0).await;
    let silent = quiet_port();
    let r = start_router(&router_over(&format!(
        "[[workers]]\nid = \"silent\"\nurl = \"http://127.0.0.1:{}\"\nmodels = [\"m\"]\n\
         kv_events = \"tcp://127.0.0.1:{silent}\"\n\
         [[workers]]\nid = \"engine\"\nurl = \"{}\"\nmodels = [\"m\"]\n\
         kv_events = \"{}\"\nkv_replay = \"{}\"\n",
        quiet_port(),
        engine.url(),
        engine.events,
        engine.replay
    )))
    .await;
    let mut connected = false;
    for _ in 0..200 {
        let workers = admin_workers(r.addr).await;
        let engine = workers.iter().find(|w| w["id"] == "engine").unwrap();
        if engine["kv_events_connected"] == true {
            connected = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(connected, "the engine's replay answer was never seen");
    let workers = admin_workers(r.addr).await;
    let silent = workers.iter().find(|w| w["id"] == "silent").unwrap();
    assert_eq!(silent["kv_events_subscribed"], true, "{silent}");
    assert_eq!(silent["kv_events_connected"], false, "{silent}");
    r.shutdown().await;
}
