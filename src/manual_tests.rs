//! Tests of the completions and man pages, over the real command line.
use super::*;

/// Every command path below the root (`serve`, `bench`, `bench compare`, ...).
fn every_subcommand() -> Vec<Vec<String>> {
    fn walk(cmd: &clap::Command, path: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
        for sub in cmd.get_subcommands() {
            if sub.get_name() == "help" {
                continue;
            }
            path.push(sub.get_name().to_owned());
            out.push(path.clone());
            walk(sub, path, out);
            path.pop();
        }
    }
    let mut cmd = crate::cli::command();
    cmd.build();
    let mut out = Vec::new();
    walk(&cmd, &mut Vec::new(), &mut out);
    out
}

fn script(shell: Shell) -> String {
    String::from_utf8(completions(shell, crate::cli::command())).expect("utf-8")
}

#[test]
fn completions_name_every_subcommand_and_flag() {
    let subs = every_subcommand();
    assert!(subs.iter().any(|p| p == &["serve"]), "{subs:?}");
    assert!(subs.iter().any(|p| p == &["completions"]), "{subs:?}");
    assert!(subs.iter().any(|p| p == &["man"]), "{subs:?}");
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        let text = script(shell);
        for path in &subs {
            let leaf = path.last().expect("non-empty");
            assert!(
                text.contains(leaf.as_str()),
                "{shell}: no `{}`",
                path.join(" ")
            );
        }
    }
    // bash names each command path as `kvroute__subcmd__a__subcmd__b` and offers each of
    // its flags.
    let bash = script(Shell::Bash);
    for path in &subs {
        let id = format!(
            "kvroute__subcmd__{})",
            path.join("__subcmd__").replace('-', "__")
        );
        assert!(
            bash.contains(&id),
            "bash: no case for `{}` ({id})",
            path.join(" ")
        );
    }
    let cmd = crate::cli::command();
    let serve = cmd.find_subcommand("serve").expect("serve");
    for arg in serve.get_arguments() {
        if let Some(long) = arg.get_long() {
            assert!(
                bash.contains(&format!("--{long}")),
                "bash: no `serve --{long}`"
            );
        }
    }
}

#[test]
fn man_pages_cover_every_command_with_its_variables() {
    let dir = std::env::temp_dir().join(format!("kvroute-man-{}", std::process::id()));
    let written = man_pages(&dir, crate::cli::command()).expect("written");
    let subs = every_subcommand();
    assert_eq!(written.len(), subs.len() + 1, "{written:?}");
    for path in &subs {
        let file = dir.join(format!("kvroute-{}.1", path.join("-")));
        let page = std::fs::read_to_string(&file).expect("a page per command");
        assert!(
            page.starts_with(".ie") || page.contains(".TH"),
            "{}",
            file.display()
        );
    }
    let serve = std::fs::read_to_string(dir.join("kvroute-serve.1")).expect("serve page");
    for var in ["KVROUTE_LISTEN", "KVROUTE_TOKENIZER", "KVROUTE_BLOCK_SIZE"] {
        assert!(serve.contains(var), "kvroute-serve.1 does not name {var}");
    }
    std::fs::remove_dir_all(&dir).expect("removed");

    let mut top = Vec::new();
    man_page(&mut top, crate::cli::command()).expect("rendered");
    let top = String::from_utf8(top).expect("utf-8");
    assert!(top.contains(".TH kvroute 1"), "{top}");
    for path in subs.iter().filter(|p| p.len() == 1) {
        assert!(
            top.contains(&format!("kvroute\\-{}(1)", path[0])),
            "kvroute(1) does not list `{}`",
            path[0]
        );
    }
}
