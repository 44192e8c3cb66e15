//! The README's quickstart as the tests read it: each block a reader runs is the fenced block
//! after a `<!-- quickstart: NAME -->` line, so a test that runs the blocks runs what the README
//! says, and fails when it drifts. The addresses are the one thing a test changes: every port
//! the blocks name is moved to a fresh loopback port ([`PortMap`]), so the test never collides
//! with anything else on the machine and the README can name the usual ports.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::quiet_port;
use super::real_engine::stop_group;

/// The blocks of the README's quickstart, by marker name.
pub struct Quickstart {
    blocks: BTreeMap<String, String>,
}

impl Quickstart {
    /// The quickstart of the repository's own README.md.
    pub fn from_readme() -> Quickstart {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md");
        let text = std::fs::read_to_string(&path).expect("README.md");
        Quickstart::parse(&text).unwrap_or_else(|e| panic!("README.md: {e}"))
    }

    /// Every `<!-- quickstart: NAME -->` marker and the fenced block on the line after it.
    pub fn parse(text: &str) -> Result<Quickstart, String> {
        let mut blocks = BTreeMap::new();
        let mut lines = text.lines().enumerate();
        while let Some((n, line)) = lines.next() {
            let Some(name) = line
                .trim()
                .strip_prefix("<!-- quickstart:")
                .and_then(|r| r.strip_suffix("-->"))
            else {
                continue;
            };
            let name = name.trim().to_string();
            match lines.next() {
                Some((_, fence)) if fence.starts_with("```") => {}
                _ => {
                    return Err(format!(
                        "line {}: `{name}` is not followed by a block",
                        n + 1
                    ));
                }
            }
            let mut body = String::new();
            loop {
                match lines.next() {
                    Some((_, l)) if l.starts_with("```") => break,
                    Some((_, l)) => {
                        body.push_str(l);
                        body.push('\n');
                    }
                    None => return Err(format!("the block of `{name}` is not closed")),
                }
            }
            if blocks.insert(name.clone(), body).is_some() {
                return Err(format!("`{name}` is marked twice"));
            }
        }
        Ok(Quickstart { blocks })
    }

    /// The block marked `name`; panics naming the marker when the README has none.
    pub fn block(&self, name: &str) -> &str {
        self.blocks.get(name).map_or_else(
            || panic!("README.md has no block marked `<!-- quickstart: {name} -->`"),
            String::as_str,
        )
    }

    /// Every port the blocks name, in order.
    pub fn ports(&self) -> BTreeSet<u16> {
        self.blocks.values().flat_map(|b| ports_in(b)).collect()
    }
}

/// The ports `text` names: digits after an address's `:` (`127.0.0.1:8000`, `tcp://*:5557`)
/// or after `--port `.
pub fn ports_in(text: &str) -> BTreeSet<u16> {
    let mut found = BTreeSet::new();
    for (i, _) in text.match_indices(':').chain(text.match_indices("--port ")) {
        let start = if text[i..].starts_with(':') {
            i + 1
        } else {
            i + "--port ".len()
        };
        let digits: String = text[start..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        if (2..=5).contains(&digits.len())
            && let Ok(port) = digits.parse()
        {
            found.insert(port);
        }
    }
    found
}

/// Each README port and the fresh loopback port a test uses instead.
pub struct PortMap {
    pairs: Vec<(u16, u16)>,
}

impl PortMap {
    /// A fresh port for each of `ports`.
    pub fn fresh(ports: impl IntoIterator<Item = u16>) -> PortMap {
        PortMap {
            pairs: ports.into_iter().map(|p| (p, quiet_port())).collect(),
        }
    }

    /// `text` with every README port moved (in one pass: a new port is never moved again).
    pub fn apply(&self, text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        'scan: while !rest.is_empty() {
            for (prefix, skip) in [(":", 1), ("--port ", 7)] {
                if let Some(after) = rest.strip_prefix(prefix) {
                    let digits = after.chars().take_while(char::is_ascii_digit).count();
                    let moved = after[..digits]
                        .parse::<u16>()
                        .ok()
                        .and_then(|p| self.pairs.iter().find(|(from, _)| *from == p));
                    if let Some((_, to)) = moved {
                        out.push_str(&rest[..skip]);
                        out.push_str(&to.to_string());
                        rest = &after[digits..];
                        continue 'scan;
                    }
                }
            }
            let c = rest.chars().next().expect("not empty");
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
        out
    }
}

/// A bash running README lines in `dir`, in a process group of its own (so everything it
/// starts, engines in the background included, is stopped by its id), its output in a log.
pub struct Shell {
    child: Option<Child>,
    log: PathBuf,
}

impl Shell {
    /// Starts `bash -c script` in `dir` with `bin` first on `PATH`.
    pub fn spawn(script: &str, dir: &Path, bin: &Path, name: &str) -> Shell {
        use std::os::unix::process::CommandExt;
        let log = dir.join(format!("{name}.log"));
        let out = std::fs::File::create(&log).expect("shell log");
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let child = Command::new("bash")
            .args(["-c", script])
            .current_dir(dir)
            .env("PATH", path)
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("shell log"))
            .stderr(out)
            .spawn()
            .expect("bash starts");
        Shell {
            child: Some(child),
            log,
        }
    }

    /// Its exit status, once it exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut()?.try_wait().ok().flatten()
    }

    /// The last 60 lines of its output.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(60)..].join("\n")
    }
}

impl Drop for Shell {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            stop_group(&mut child);
        }
        if std::thread::panicking() {
            eprintln!("--- {}:\n{}", self.log.display(), self.log_tail());
        }
    }
}

/// Runs `script` with bash in `dir` (`bin` first on `PATH`), at most `limit_s` seconds; its
/// standard output and standard error. Panics with both when it fails.
pub fn run(script: &str, dir: &Path, bin: &Path, limit_s: u32) -> (String, String) {
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("timeout")
        .args([&limit_s.to_string(), "bash", "-c", script])
        .current_dir(dir)
        .env("PATH", path)
        .stdin(Stdio::null())
        .output()
        .expect("bash runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "`{script}` failed ({}):\n{stdout}\n{stderr}",
        out.status,
    );
    (stdout, stderr)
}
