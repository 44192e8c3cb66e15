//! `kvroute serve` as a container starts it: no config file, the address from the
//! environment (the Dockerfile sets `KVROUTE_LISTEN` and runs `serve` alone), and the
//! process and build metrics an operator scrapes first.

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::*;

struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn serve_starts_with_the_image_alone() {
    let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let _child = Child(
        Command::new(env!("CARGO_BIN_EXE_kvroute"))
            .arg("serve")
            .env("KVROUTE_LISTEN", addr.to_string())
            .env_remove("KVROUTE_CONFIG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("kvroute serve starts"),
    );
    let http = client();
    let mut healthy = false;
    for _ in 0..400 {
        if let Ok(r) = http.get(format!("http://{addr}/health")).send().await
            && r.status().is_success()
        {
            healthy = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(
        healthy,
        "`kvroute serve` with no config never answered on {addr}"
    );
    // No worker yet: not ready, and requests get a clear error rather than a hang.
    let ready = http
        .get(format!("http://{addr}/ready"))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 503);
    let text = metrics_text(addr).await;
    assert!(text.contains("kvroute_build_info{"), "{text}");
    assert!(text.contains("process_open_fds "), "{text}");
    assert!(text.contains("process_resident_memory_bytes "), "{text}");
}

/// `kvroute serve` configured by its `KVROUTE_*` variables alone: no argument but `serve`.
/// The policy, the two workers (one variable, separated by a space) and the log format must
/// all come from the environment.
#[tokio::test]
async fn serve_is_configured_from_the_environment_alone() {
    let a = Backend::start("a", &["m"]).await;
    let b = Backend::start("b", &["m"]).await;
    let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let mut child = Child(
        Command::new(env!("CARGO_BIN_EXE_kvroute"))
            .arg("serve")
            .env_remove("KVROUTE_CONFIG")
            .env("KVROUTE_LISTEN", addr.to_string())
            .env("KVROUTE_POLICY", "round_robin")
            .env("KVROUTE_WORKER", format!("{}=m {}=m", a.url(), b.url()))
            .env("KVROUTE_LOG_FORMAT", "json")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kvroute serve starts"),
    );
    let http = client();
    assert!(
        wait_for(Duration::from_secs(10), || std::net::TcpStream::connect(
            addr
        )
        .is_ok())
        .await,
        "`kvroute serve` never listened on {addr} (KVROUTE_LISTEN)"
    );
    for _ in 0..4 {
        let r = complete(
            &http,
            addr,
            &serde_json::json!({"model": "m", "prompt": "hi"}),
        )
        .await;
        assert_eq!(r.status(), 200);
    }
    // Round robin (KVROUTE_POLICY) over both workers (KVROUTE_WORKER): two each.
    assert_eq!((a.count(), b.count()), (2, 2));
    // The log format (KVROUTE_LOG_FORMAT): the first line on stderr is a JSON object.
    let stderr = child.0.stderr.take().unwrap();
    let first = tokio::task::spawn_blocking(move || {
        use std::io::BufRead;
        let mut line = String::new();
        std::io::BufReader::new(stderr)
            .read_line(&mut line)
            .map(|_| line)
    })
    .await
    .unwrap()
    .unwrap();
    let log: serde_json::Value = serde_json::from_str(&first)
        .unwrap_or_else(|e| panic!("not a JSON log line ({e}): {first}"));
    assert!(log.get("level").is_some(), "{log}");
}
