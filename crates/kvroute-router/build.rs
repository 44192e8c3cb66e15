//! Sets `KVROUTE_COMMIT`, the commit `--version` and `kvroute_build_info` show: the variable
//! when the build is given one (the Dockerfile's build argument, since the image's build
//! context has no `.git`), else `git rev-parse` of the checkout, else `unknown`. No
//! dependency: git is asked as a process, and its absence is not an error.

use std::path::{Path, PathBuf};
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
    // A new commit moves HEAD or the branch it names: run again then, not at every build. Cargo
    // reruns a script at every build while a path it watches is missing, which recompiled the
    // router each time in a clone without `packed-refs`: watch only paths that exist. A branch
    // with no file of its own (packed, or not yet committed to) is watched through the folder
    // its file will be written to (`refs/heads`), and through `packed-refs` when there is one.
    let watched = [
        git(&["rev-parse", "--git-path", "HEAD"]).map(PathBuf::from),
        git(&["rev-parse", "--git-path", "packed-refs"]).map(PathBuf::from),
        git(&["symbolic-ref", "-q", "HEAD"])
            .and_then(|branch| git(&["rev-parse", "--git-path", &branch]))
            .map(PathBuf::from)
            .map(|file| match file.exists() {
                true => file,
                false => file.parent().map(Path::to_path_buf).unwrap_or(file),
            }),
    ];
    for path in watched.into_iter().flatten().filter(|p| p.exists()) {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}

/// Git's answer, trimmed, when git runs and succeeds.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_owned())
}
