//! `kvroute completions` and `kvroute man` as an operator or a packager runs them: the binary,
//! its standard output and exit status.

use std::process::Command;

fn kvroute(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kvroute"))
        .args(args)
        .env_clear()
        .output()
        .expect("kvroute runs")
}

#[test]
fn completions_print_a_script_per_shell() {
    for (shell, marker) in [
        ("bash", "complete -F _kvroute"),
        ("zsh", "#compdef kvroute"),
        ("fish", "complete -c kvroute"),
    ] {
        let out = kvroute(&["completions", shell]);
        assert!(out.status.success(), "{shell}: {out:?}");
        let text = String::from_utf8(out.stdout).expect("utf-8");
        assert!(text.contains(marker), "{shell}: no `{marker}`");
        assert!(
            text.contains("serve") && text.contains("tokenizer"),
            "{shell}"
        );
    }
}

#[test]
fn an_unknown_shell_is_refused_with_the_choices() {
    let out = kvroute(&["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("tcsh") && err.contains("bash") && err.contains("zsh"),
        "{err}"
    );
    assert!(out.stdout.is_empty());
}

#[test]
fn man_prints_kvroute_1_and_writes_every_page() {
    let out = kvroute(&["man"]);
    assert!(out.status.success(), "{out:?}");
    let page = String::from_utf8(out.stdout).expect("utf-8");
    assert!(page.contains(".TH kvroute 1"), "{page}");

    let dir = std::env::temp_dir().join(format!("kvroute-it-man-{}", std::process::id()));
    let out = kvroute(&["man", "--out-dir", dir.to_str().expect("utf-8 path")]);
    assert!(out.status.success(), "{out:?}");
    for page in [
        "kvroute.1",
        "kvroute-serve.1",
        "kvroute-completions.1",
        "kvroute-man.1",
    ] {
        assert!(dir.join(page).is_file(), "{page} missing");
    }
    std::fs::remove_dir_all(&dir).expect("removed");
}

#[test]
fn a_closed_pipe_is_an_error_not_a_panic() {
    // The reader is gone before kvroute starts (as after `| head -0`): every write fails.
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let out = Command::new(env!("CARGO_BIN_EXE_kvroute"))
        .args(["completions", "bash"])
        .env_clear()
        .stdout(writer)
        .output()
        .expect("kvroute runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert!(!out.status.success(), "the failed write is reported: {err}");
    assert!(err.contains("kvroute:"), "{err}");
}
