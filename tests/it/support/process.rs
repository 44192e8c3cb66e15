//! `kvroute engine` and `kvroute serve` child processes (for the chaos tests that kill and
//! restart them), and memory readings from `/proc`.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::quiet_port;

/// Peak and current resident memory of a process, in MiB (`VmHWM`, `VmRSS`).
pub fn rss_mib(pid: Option<u32>) -> (f64, f64) {
    let path = match pid {
        Some(p) => format!("/proc/{p}/status"),
        None => "/proc/self/status".into(),
    };
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<f64>().ok())
            .map_or(0.0, |kb| kb / 1024.0)
    };
    (field("VmHWM:"), field("VmRSS:"))
}

/// Where a `kvroute engine` child listens.
#[derive(Clone, Debug)]
pub struct EngineAddrs {
    pub http: SocketAddr,
    pub events: String,
    pub replay: String,
}

impl EngineAddrs {
    /// Fresh loopback ports for HTTP, events and replay.
    pub fn fresh() -> EngineAddrs {
        EngineAddrs {
            http: SocketAddr::from(([127, 0, 0, 1], quiet_port())),
            events: format!("tcp://127.0.0.1:{}", quiet_port()),
            replay: format!("tcp://127.0.0.1:{}", quiet_port()),
        }
    }
}

/// A `kvroute engine` process, killed (SIGKILL) when dropped.
pub struct EngineProcess {
    pub child: Child,
}

impl EngineProcess {
    /// Starts `kvroute engine` serving `model` and waits until `/health` answers.
    pub async fn start(addrs: &EngineAddrs, model: &str, speedup: f64) -> EngineProcess {
        EngineProcess::start_with(addrs, model, speedup, &[]).await
    }

    /// As [`EngineProcess::start`], with more engine flags (`--num-blocks 32`, …).
    pub async fn start_with(
        addrs: &EngineAddrs,
        model: &str,
        speedup: f64,
        flags: &[&str],
    ) -> EngineProcess {
        let child = Command::new(env!("CARGO_BIN_EXE_kvroute"))
            .args(["engine", "--listen", &addrs.http.to_string()])
            .args(["--model", model])
            .args(["--kv-events-endpoint", &addrs.events])
            .args(["--kv-replay-endpoint", &addrs.replay])
            .args(["--engine-speedup", &speedup.to_string()])
            .args(flags)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("kvroute engine starts");
        let p = EngineProcess { child };
        let http = reqwest::Client::new();
        let url = format!("http://{}/health", addrs.http);
        for _ in 0..200 {
            if let Ok(r) = http.get(&url).send().await
                && r.status().is_success()
            {
                return p;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("kvroute engine on {} did not become healthy", addrs.http);
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL, then reap.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for EngineProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A `kvroute serve` process, killed when dropped.
pub struct RouterProcess {
    pub addr: SocketAddr,
    pub child: Child,
}

impl RouterProcess {
    /// Starts `kvroute serve --config <file>` and waits until `/health` answers.
    pub async fn start(config_toml: &str) -> (RouterProcess, tempfile::NamedTempFile) {
        RouterProcess::start_with(config_toml, &[], Stdio::null()).await
    }

    /// As [`RouterProcess::start`], with more flags and the child's stderr (its logs) going
    /// to `stderr` (`Stdio::piped()` to read them from `child.stderr`).
    pub async fn start_with(
        config_toml: &str,
        flags: &[&str],
        stderr: Stdio,
    ) -> (RouterProcess, tempfile::NamedTempFile) {
        RouterProcess::start_env(config_toml, flags, stderr, &[]).await
    }

    /// As [`RouterProcess::start_with`], with environment variables set for the child (e.g.
    /// `KUBECONFIG`).
    pub async fn start_env(
        config_toml: &str,
        flags: &[&str],
        stderr: Stdio,
        env: &[(&str, &std::path::Path)],
    ) -> (RouterProcess, tempfile::NamedTempFile) {
        let addr = SocketAddr::from(([127, 0, 0, 1], quiet_port()));
        let text = format!("listen = \"{addr}\"\n{config_toml}");
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), text).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_kvroute"))
            .args(["serve", "--config"])
            .arg(file.path())
            .args(flags)
            .envs(env.iter().map(|(k, v)| (*k, *v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("kvroute serve starts");
        let p = RouterProcess { addr, child };
        let http = reqwest::Client::new();
        let url = format!("http://{addr}/health");
        for _ in 0..200 {
            if let Ok(r) = http.get(&url).send().await
                && r.status().is_success()
            {
                return (p, file);
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("kvroute serve on {addr} did not become healthy");
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for RouterProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A one-line scenario report.
pub fn report(
    scenario: &str,
    sent: usize,
    completed: usize,
    failed: &std::collections::BTreeMap<String, usize>,
    peak_rss_mib: f64,
    what: &str,
) {
    let total: usize = failed.values().sum();
    println!(
        "{scenario}: sent {sent}, completed {completed}, failed {total} {failed:?}, peak RSS {peak_rss_mib:.1} MiB ({what})"
    );
}
