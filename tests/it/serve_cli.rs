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
