//! A worker's part in prefill/decode disaggregation.
//!
//! Disaggregated serving runs a request's prefill on one engine and its decode on another,
//! moving the KV cache between them (vLLM's KV connectors such as NIXL, SGLang's
//! `--disaggregation-mode prefill|decode`). Each worker is started for one side, or for both;
//! the router picks a prefill worker KV-aware (the prefix caches live there) and a decode
//! worker by load and KV room, among the workers whose role serves each side.

use std::fmt;
use std::str::FromStr;

use thiserror::Error;

/// SGLang's default `--disaggregation-bootstrap-port` (0.5.23 `ServerArgs`): where a prefill
/// engine's bootstrap server listens when the operator gives no other port.
pub const DEFAULT_BOOTSTRAP_PORT: u16 = 8998;

/// Which side of a disaggregated request a worker serves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Role {
    /// Prefill only: it computes prompts and hands their KV cache to a decode worker
    /// (vLLM `kv_producer`, SGLang `--disaggregation-mode prefill`). Never sent a request
    /// that should produce more than its first token.
    Prefill,
    /// Decode only: it receives a prompt's KV cache and generates (vLLM `kv_consumer`, SGLang
    /// `--disaggregation-mode decode`). Never sent a prompt to compute itself.
    Decode,
    /// An ordinary engine (the default): serves whole requests, and either side of a
    /// disaggregated one when its connector allows (vLLM `kv_both`).
    #[default]
    Both,
}

/// One side of a disaggregated request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Side {
    /// The prompt's computation.
    Prefill,
    /// The generation after it.
    Decode,
}

impl Side {
    /// Its name in metrics, logs and `/debug/route`.
    pub fn as_str(self) -> &'static str {
        match self {
            Side::Prefill => "prefill",
            Side::Decode => "decode",
        }
    }
}

impl Role {
    /// Every role, in the order they are documented.
    pub const ALL: [Role; 3] = [Role::Prefill, Role::Decode, Role::Both];

    /// Its name in config, the admin API, discovery and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Prefill => "prefill",
            Role::Decode => "decode",
            Role::Both => "both",
        }
    }

    /// Whether it may serve `side` of a disaggregated request.
    pub fn serves(self, side: Side) -> bool {
        matches!(
            (self, side),
            (Role::Both, _) | (Role::Prefill, Side::Prefill) | (Role::Decode, Side::Decode)
        )
    }

    /// Whether it may serve a whole request on its own (a prefill-only or decode-only engine
    /// cannot: the first stops after one token, the second waits for a transfer).
    pub fn serves_whole(self) -> bool {
        self == Role::Both
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A role name that is none of `prefill`, `decode`, `both`.
#[derive(Debug, Error, PartialEq)]
#[error("`{0}` is not a worker role: write \"prefill\", \"decode\" or \"both\"")]
pub struct UnknownRole(pub String);

impl FromStr for Role {
    type Err = UnknownRole;

    /// Parses a role name, without regard to case or surrounding spaces (a pod annotation is
    /// typed by hand).
    fn from_str(s: &str) -> Result<Role, UnknownRole> {
        Role::ALL
            .into_iter()
            .find(|r| r.as_str().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| UnknownRole(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_serve_their_sides() {
        assert!(Role::Prefill.serves(Side::Prefill));
        assert!(!Role::Prefill.serves(Side::Decode));
        assert!(Role::Decode.serves(Side::Decode));
        assert!(!Role::Decode.serves(Side::Prefill));
        assert!(Role::Both.serves(Side::Prefill) && Role::Both.serves(Side::Decode));
        assert!(Role::Both.serves_whole());
        assert!(!Role::Prefill.serves_whole() && !Role::Decode.serves_whole());
    }

    #[test]
    fn roles_parse_by_name() {
        for r in Role::ALL {
            assert_eq!(r.as_str().parse::<Role>(), Ok(r));
        }
        assert_eq!(" Prefill ".parse::<Role>(), Ok(Role::Prefill));
        assert_eq!(
            "mixed".parse::<Role>(),
            Err(UnknownRole("mixed".to_owned()))
        );
        assert_eq!(Role::default(), Role::Both);
    }
}
