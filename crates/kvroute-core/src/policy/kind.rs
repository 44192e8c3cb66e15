//! Which policy to run, as a type: the config file, `--policy`, `kvroute demo` and
//! `kvroute simulate` all name a policy, and an enum lets the compiler check that every name
//! has an implementation (and every implementation a name) instead of a string match that can
//! drift from the list of names.

use std::fmt;
use std::str::FromStr;

use serde::Deserialize;
use thiserror::Error;

/// A routing policy, by name.
///
/// Names are snake_case everywhere: in TOML (`policy = "round_robin"`), on the command line
/// (`--policy round_robin`), in metrics labels and in `/debug/route`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize)]
#[cfg_attr(
    feature = "cli",
    derive(clap::ValueEnum),
    value(rename_all = "snake_case")
)]
#[serde(rename_all = "snake_case")]
pub enum PolicyKind {
    /// Predicted time to first token from prefix overlap and load (the product's policy).
    KvAware,
    /// Each worker in turn.
    RoundRobin,
    /// Uniformly at random.
    Random,
    /// Fewest requests in flight.
    LeastRequest,
    /// The less loaded of two random workers.
    PowerOfTwo,
    /// SGLang router's cache-aware policy (a baseline).
    CacheAware,
    /// NVIDIA Dynamo's KV router cost (a baseline).
    DynamoCost,
}

impl PolicyKind {
    /// Every policy, in the order reports and `kvroute simulate` list them.
    pub const ALL: [PolicyKind; 7] = [
        PolicyKind::KvAware,
        PolicyKind::RoundRobin,
        PolicyKind::Random,
        PolicyKind::LeastRequest,
        PolicyKind::PowerOfTwo,
        PolicyKind::CacheAware,
        PolicyKind::DynamoCost,
    ];

    /// The policy used when none is configured.
    pub const DEFAULT: PolicyKind = PolicyKind::KvAware;

    /// The policy's name as written in config, flags, metrics and `/debug/route`.
    pub const fn name(self) -> &'static str {
        match self {
            PolicyKind::KvAware => "kv_aware",
            PolicyKind::RoundRobin => "round_robin",
            PolicyKind::Random => "random",
            PolicyKind::LeastRequest => "least_request",
            PolicyKind::PowerOfTwo => "power_of_two",
            PolicyKind::CacheAware => "cache_aware",
            PolicyKind::DynamoCost => "dynamo_cost",
        }
    }

    /// Every name, comma-separated (for error messages that list what is accepted).
    pub fn known_names() -> String {
        PolicyKind::ALL.map(PolicyKind::name).join(", ")
    }
}

impl Default for PolicyKind {
    fn default() -> Self {
        PolicyKind::DEFAULT
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A policy name that is not known.
#[derive(Debug, Error, PartialEq)]
#[error("unknown policy `{0}`; known policies: {known}", known = PolicyKind::known_names())]
pub struct UnknownPolicy(pub String);

impl FromStr for PolicyKind {
    type Err = UnknownPolicy;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PolicyKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| UnknownPolicy(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_agree_between_serde_display_and_from_str() {
        for kind in PolicyKind::ALL {
            let name = kind.name();
            assert_eq!(kind.to_string(), name);
            assert_eq!(name.parse::<PolicyKind>(), Ok(kind));
            let parsed: PolicyKind = serde_json::from_value(serde_json::json!(name)).unwrap();
            assert_eq!(parsed, kind);
        }
    }

    #[cfg(feature = "cli")]
    #[test]
    fn the_command_line_names_every_policy_as_serde_does() {
        use clap::ValueEnum;
        for kind in PolicyKind::ALL {
            assert_eq!(
                <PolicyKind as ValueEnum>::from_str(kind.name(), false),
                Ok(kind)
            );
        }
        assert_eq!(PolicyKind::value_variants(), PolicyKind::ALL.as_slice());
    }

    #[test]
    fn an_unknown_name_lists_the_known_ones() {
        let e = "fastest".parse::<PolicyKind>().unwrap_err().to_string();
        assert!(e.contains("fastest") && e.contains("round_robin"), "{e}");
    }
}
