//! The `kvroute` command line: one subcommand per job, and every flag also read from an
//! environment variable.
//!
//! The variable of a flag is named by one rule, applied here to the whole command tree rather
//! than written on each flag, so that a flag added later cannot miss its variable and two
//! subcommands sharing a flag group (`simulate`, `engine` and `demo` share the engine flags)
//! never share a variable: `KVROUTE_` + the subcommand path (without `serve`, the router's own
//! command) + the flag's long name, upper-cased, `-` and spaces as `_`. So `serve --listen` is
//! `KVROUTE_LISTEN`, `engine --listen` is `KVROUTE_ENGINE_LISTEN` and `bench compare --plot` is
//! `KVROUTE_BENCH_COMPARE_PLOT`. A flag given on the command line wins over its variable. The
//! docs/cli.md lists every variable; a unit test holds the list and the tree to each other.

use clap::{Arg, Command, CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::config::ServeArgs;

/// The whole command line.
#[derive(Parser, Debug)]
#[command(
    name = "kvroute",
    version = crate::metrics::LONG_VERSION,
    about = "A KV-cache-aware router for LLM serving"
)]
pub struct Cli {
    /// The job to run.
    #[command(subcommand)]
    pub command: Job,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Job {
    /// Route OpenAI requests to a fleet of vLLM / SGLang workers.
    Serve(ServeArgs),
    #[cfg(feature = "epp")]
    /// Pick endpoints for a Gateway API Inference Extension gateway (Envoy ext_proc).
    Epp(crate::epp::EppArgs),
    #[cfg(feature = "lab")]
    /// Run one simulated vLLM-like engine (OpenAI API, KV events, vLLM metrics).
    Engine(crate::engine::EngineArgs),
    #[cfg(feature = "lab")]
    /// Run simulated engines and a router in front of them, all on loopback.
    Demo(crate::demo::DemoArgs),
    #[cfg(feature = "lab")]
    /// Replay a workload against an OpenAI endpoint (`bench compare` for tables).
    Bench(crate::bench::BenchCli),
    #[cfg(feature = "lab")]
    /// Simulate a trace in virtual time against N engine models, for every policy.
    Simulate(Box<crate::sim::SimulateArgs>),
    /// Print the completion script of a shell (bash, zsh, fish, elvish, powershell).
    Completions(crate::manual::CompletionsArgs),
    /// Print the man page kvroute(1), or write every command's page with --out-dir.
    Man(crate::manual::ManArgs),
}

/// The prefix of every variable.
const PREFIX: &str = "KVROUTE";
/// The subcommand whose flags take the short names (`KVROUTE_LISTEN`, not `KVROUTE_SERVE_…`):
/// the router, the command a container runs.
const SHORT: &str = "serve";

/// The command tree, each argument with its environment variable.
pub fn command() -> Command {
    with_env(Cli::command(), &[])
}

/// Parses the process's arguments and environment; prints help or the error and exits on
/// a bad command line, as clap does.
pub fn parse() -> Cli {
    let mut matches = command().get_matches();
    Cli::from_arg_matches_mut(&mut matches).unwrap_or_else(|e| e.exit())
}

/// The variable of the argument `arg` of the subcommand at `path` (names below the root).
pub fn env_name(path: &[&str], arg: &Arg) -> String {
    let flag = arg
        .get_long()
        .map(str::to_owned)
        .unwrap_or_else(|| arg.get_id().to_string());
    std::iter::once(PREFIX)
        .chain(path.iter().copied().filter(|p| *p != SHORT))
        .chain(std::iter::once(flag.as_str()))
        .map(|part| part.to_ascii_uppercase().replace(['-', ' '], "_"))
        .collect::<Vec<_>>()
        .join("_")
}

fn with_env(cmd: Command, path: &[&str]) -> Command {
    let mut cmd = cmd.mut_args(|arg| {
        let name = env_name(path, &arg);
        arg.env(name)
    });
    let subs: Vec<String> = cmd
        .get_subcommands()
        .map(|s| s.get_name().to_owned())
        .collect();
    for sub in subs {
        let mut below: Vec<&str> = path.to_vec();
        below.push(&sub);
        cmd = cmd.mut_subcommand(&sub, |s| with_env(s, &below));
    }
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every argument of every subcommand, with its subcommand path and variable.
    fn every_argument() -> Vec<(String, String, Option<String>)> {
        fn walk(
            cmd: &Command,
            path: &mut Vec<String>,
            out: &mut Vec<(String, String, Option<String>)>,
        ) {
            for arg in cmd.get_arguments() {
                // clap's own --help and --version read no variable.
                if matches!(
                    arg.get_action(),
                    clap::ArgAction::Help | clap::ArgAction::Version
                ) {
                    continue;
                }
                out.push((
                    path.join(" "),
                    arg.get_id().to_string(),
                    arg.get_env().map(|e| e.to_string_lossy().into_owned()),
                ));
            }
            for sub in cmd.get_subcommands() {
                path.push(sub.get_name().to_owned());
                walk(sub, path, out);
                path.pop();
            }
        }
        let mut cmd = command();
        cmd.build();
        let mut out = Vec::new();
        walk(&cmd, &mut Vec::new(), &mut out);
        out
    }

    #[test]
    fn every_argument_has_its_variable_by_the_rule() {
        let args = every_argument();
        assert!(args.len() > 20, "the tree was walked: {args:?}");
        let cmd = command();
        for (path, id, env) in &args {
            let env = env
                .as_deref()
                .unwrap_or_else(|| panic!("`{path} {id}` has no environment variable"));
            let parts: Vec<&str> = path.split(' ').filter(|p| !p.is_empty()).collect();
            let mut sub = &cmd;
            for p in &parts {
                sub = sub.find_subcommand(p).expect("subcommand");
            }
            let arg = sub
                .get_arguments()
                .find(|a| a.get_id() == id.as_str())
                .expect("argument");
            assert_eq!(env, env_name(&parts, arg), "`{path} {id}`");
        }
        // One variable never feeds two arguments of one command line.
        let mut seen = std::collections::HashMap::new();
        for (path, id, env) in &args {
            if let Some((p, other)) = seen.insert(env.clone(), (path.clone(), id.clone())) {
                panic!("{env:?} names both `{p} {other}` and `{path} {id}`");
            }
        }
    }

    /// Issue 34: `--version` showed no commit, so a binary could not be traced to its source.
    #[test]
    fn the_version_names_the_commit() {
        let shown = command().render_version();
        assert!(
            shown.contains(&format!("(commit {})", crate::metrics::COMMIT)),
            "{shown}"
        );
        // Built from a checkout: the commit is known (git's, or the one the build was given).
        let in_git = std::process::Command::new("git")
            .args(["rev-parse", "HEAD"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .is_ok_and(|o| o.status.success());
        if in_git {
            assert_ne!(crate::metrics::COMMIT, "unknown", "{shown}");
        }
    }

    /// The variable table moved from README.md to the docs site's command-line page.
    #[test]
    fn the_readme_lists_every_variable() {
        let page = include_str!("../docs/cli.md");
        for (path, id, env) in every_argument() {
            let env = env.expect("checked above");
            assert!(
                page.contains(&format!("`{env}`")),
                "docs/cli.md does not document `{env}` (`kvroute {path} {id}`)"
            );
        }
    }
}
