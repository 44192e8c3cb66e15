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
