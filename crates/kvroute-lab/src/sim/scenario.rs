//! Named scenarios: a committed suite of workloads that each exercise one property of a
//! router, run by name (`kvroute simulate --scenario NAME`).
//!
//! A scenario is a TOML file with a `description` and a `[flags]` table whose keys are
//! `kvroute simulate` flags (`requests = 2000` is `--requests 2000`, `join-at = [30.0]` is
//! `--join-at 30`, `x = true` is `--x`). Keeping scenarios as plain flags means each one is
//! exactly a command line anyone can rerun or vary, and the suite cannot drift from the CLI.
//! The suite lives beside this file in `src/sim/scenarios/` (it is the simulator's input, not a
//! benchmark harness) and is compiled into the binary, so a name works from any directory; a
//! path ending in `.toml` runs any other file.

use std::path::Path;

use anyhow::{Context, bail};
use clap::Parser;
use serde::Deserialize;

use super::args::SimulateArgs;

/// The committed suite, in report order.
pub const SUITE: &[(&str, &str)] = &[
    (
        "shared-prefix",
        include_str!("scenarios/shared-prefix.toml"),
    ),
    ("unique", include_str!("scenarios/unique.toml")),
    ("multi-turn", include_str!("scenarios/multi-turn.toml")),
    ("hot-prefix", include_str!("scenarios/hot-prefix.toml")),
    (
        "eviction-pressure",
        include_str!("scenarios/eviction-pressure.toml"),
    ),
    ("cold-join", include_str!("scenarios/cold-join.toml")),
    ("restart", include_str!("scenarios/restart.toml")),
    ("siblings", include_str!("scenarios/siblings.toml")),
];

#[derive(Deserialize)]
struct ScenarioFile {
    description: String,
    flags: toml::Table,
}

/// A parsed scenario.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// Its name.
    pub name: String,
    /// What it exercises.
    pub description: String,
    /// The equivalent command-line flags.
    pub flags: Vec<String>,
    /// The flags, parsed.
    pub args: SimulateArgs,
}

#[derive(Parser)]
#[command(name = "kvroute simulate")]
struct Flags {
    #[command(flatten)]
    args: SimulateArgs,
}

fn flag_value(key: &str, v: &toml::Value, out: &mut Vec<String>) -> anyhow::Result<()> {
    let flag = format!("--{}", key.replace('_', "-"));
    match v {
        toml::Value::Boolean(true) => out.push(flag),
        toml::Value::Boolean(false) => {}
        toml::Value::String(s) => out.extend([flag, s.clone()]),
        toml::Value::Integer(i) => out.extend([flag, i.to_string()]),
        toml::Value::Float(f) => out.extend([flag, f.to_string()]),
        toml::Value::Array(items) => {
            for item in items {
                flag_value(key, item, out)?;
            }
        }
        other => bail!("flag `{key}`: unsupported value {other}"),
    }
    Ok(())
}

impl Scenario {
    /// Parses scenario `name` from TOML `text`.
    pub fn parse(name: &str, text: &str) -> anyhow::Result<Scenario> {
        let file: ScenarioFile =
            toml::from_str(text).with_context(|| format!("scenario `{name}` is not valid"))?;
        let mut flags = Vec::new();
        for (k, v) in &file.flags {
            if k == "scenario" || k == "out" {
                bail!("scenario `{name}`: flag `{k}` is not allowed in a scenario");
            }
            flag_value(k, v, &mut flags)?;
        }
        let argv = std::iter::once("kvroute-simulate".to_string()).chain(flags.iter().cloned());
        let args = Flags::try_parse_from(argv)
            .with_context(|| format!("scenario `{name}` has invalid flags"))?
            .args;
        Ok(Scenario {
            name: name.to_string(),
            description: file.description.trim().to_string(),
            flags,
            args,
        })
    }

    /// The scenario called `name` from the suite, or the file `name` if it ends in `.toml`.
    pub fn load(name: &str) -> anyhow::Result<Scenario> {
        if name.ends_with(".toml") {
            let path = Path::new(name);
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read scenario {}", path.display()))?;
            let stem = path.file_stem().unwrap_or_default().to_string_lossy();
            return Scenario::parse(&stem, &text);
        }
        match SUITE.iter().find(|(n, _)| *n == name) {
            Some((n, text)) => Scenario::parse(n, text),
            None => bail!(
                "unknown scenario `{name}`; the suite has: {}, or `all`",
                SUITE.iter().map(|s| s.0).collect::<Vec<_>>().join(", ")
            ),
        }
    }

    /// Every scenario of the suite.
    pub fn suite() -> anyhow::Result<Vec<Scenario>> {
        SUITE.iter().map(|(n, t)| Scenario::parse(n, t)).collect()
    }

    /// The command that runs this scenario without the suite.
    pub fn command(&self) -> String {
        let mut s = String::from("kvroute simulate");
        for f in &self.flags {
            s.push(' ');
            s.push_str(f);
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_suite_scenario_parses_into_a_valid_config() {
        for s in Scenario::suite().unwrap() {
            s.args.sim_config().unwrap();
            assert!(!s.description.is_empty(), "{}", s.name);
        }
    }

    #[test]
    fn flags_map_to_the_command_line() {
        let s = Scenario::parse(
            "x",
            "description = \"d\"\n[flags]\nsynthetic = \"unique\"\nrequests = 5\njoin-at = [1.5, 2.0]\nrestart-at = [\"0@3\"]\n",
        )
        .unwrap();
        assert_eq!(s.args.workload.requests, 5);
        assert_eq!(s.args.join_at, vec![1.5, 2.0]);
        assert_eq!(s.args.restart_at, vec![(0, 3.0)]);
        assert!(s.command().starts_with("kvroute simulate"));
        assert!(Scenario::parse("y", "description = \"d\"\n[flags]\nnope = 1\n").is_err());
        assert!(
            Scenario::load("no-such")
                .unwrap_err()
                .to_string()
                .contains("shared-prefix")
        );
    }
}
