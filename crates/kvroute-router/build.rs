//! Sets `KVROUTE_COMMIT`, the commit `--version` and `kvroute_build_info` show: the variable
//! when the build is given one (the Dockerfile's build argument, since the image's build
//! context has no `.git`), else `git rev-parse` of the checkout, else `unknown`. No
//! dependency: git is asked as a process, and its absence is not an error.

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=KVROUTE_COMMIT");
    let given = std::env::var("KVROUTE_COMMIT")
        .ok()
        .filter(|c| !c.is_empty() && c != "unknown");
    let commit = given
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=KVROUTE_COMMIT={commit}");
    // A new commit moves HEAD or the branch it names: run again then, not at every build.
    for path in ["HEAD", "packed-refs"] {
        if let Some(p) = git(&["rev-parse", "--git-path", path]) {
            println!("cargo:rerun-if-changed={p}");
        }
    }
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"])
        && let Some(p) = git(&["rev-parse", "--git-path", &branch])
    {
        println!("cargo:rerun-if-changed={p}");
    }
}

/// Git's answer, trimmed, when git runs and succeeds.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_owned())
}
