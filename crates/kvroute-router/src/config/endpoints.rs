//! `[endpoints]`: the paths forwarded beyond the ones kvroute serves by name
//! (`forward_paths`), the Responses API's memory of which worker stores which response
//! (`responses_capacity`, `responses_ttl_s`), and whether the router answers `/tokenize` and
//! `/detokenize` itself (`local_tokenize`). Defaults are [`EndpointsConfig::default`].

use std::time::Duration;

use serde::Deserialize;

use super::values::seconds;
use super::{ConfigError, invalid};

/// The `[endpoints]` table.
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct FileEndpoints {
    pub(super) forward_paths: Option<Vec<String>>,
    pub(super) responses_capacity: Option<usize>,
    pub(super) responses_ttl_s: Option<f64>,
    pub(super) local_tokenize: Option<bool>,
}

/// Paths forwarded by default: the engines' inference endpoints kvroute does not serve by name
/// (vLLM 0.32's Anthropic Messages API, audio translations, classification, pooling, Cohere
/// embed). Engine administration (`/v1/load_lora_adapter`, …) is not among them.
pub const DEFAULT_FORWARD_PATHS: [&str; 8] = [
    "/v1/audio/translations",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/classify",
    "/v1/pooling",
    "/classify",
    "/pooling",
    "/v2/embed",
];

/// Engine paths a wildcard never forwards: they change what an engine serves (LoRA adapters
/// loaded and unloaded at run time), so a pattern like `/v1/*` does not hand them to tenants.
/// Listed exactly, they are forwarded.
pub const NEVER_BY_WILDCARD: [&str; 2] = ["/v1/load_lora_adapter", "/v1/unload_lora_adapter"];

/// The router's own paths (and prefixes): no pattern may reach them.
const OWN_PATHS: [&str; 5] = ["/admin", "/debug", "/health", "/metrics", "/ready"];

/// Responses remembered by default (each costs about 200 bytes).
pub const DEFAULT_RESPONSES_CAPACITY: usize = 100_000;
/// How long a response's worker is remembered by default.
pub const DEFAULT_RESPONSES_TTL: Duration = Duration::from_secs(24 * 3600);

/// One allowed path: exact, or a prefix when it ends with `*`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PathPattern {
    prefix: String,
    wildcard: bool,
}

impl PathPattern {
    /// The pattern `s` (`/v1/x` or `/v1/x/*`); `None` when it is not one.
    pub fn parse(s: &str) -> Option<PathPattern> {
        let (prefix, wildcard) = match s.strip_suffix('*') {
            Some(p) => (p, true),
            None => (s, false),
        };
        let ok = prefix.starts_with('/')
            && !prefix.contains(['*', '?', '#', ' '])
            && !prefix.contains("//")
            && !prefix.split('/').any(|seg| seg == "..")
            && (wildcard || prefix.len() > 1);
        ok.then(|| PathPattern {
            prefix: prefix.to_owned(),
            wildcard,
        })
    }

    /// Whether `path` is allowed by this pattern.
    pub fn matches(&self, path: &str) -> bool {
        if self.wildcard {
            path.starts_with(&self.prefix) && !NEVER_BY_WILDCARD.contains(&path)
        } else {
            path == self.prefix
        }
    }

    /// Whether the pattern could reach a path starting with `prefix`.
    fn reaches(&self, prefix: &str) -> bool {
        if self.wildcard {
            prefix.starts_with(&self.prefix) || self.prefix.starts_with(prefix)
        } else {
            self.prefix == prefix || self.prefix.starts_with(&format!("{prefix}/"))
        }
    }
}

impl std::fmt::Display for PathPattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{}", self.prefix, if self.wildcard { "*" } else { "" })
    }
}

/// What `[endpoints]` configures.
#[derive(Clone, Debug, PartialEq)]
pub struct EndpointsConfig {
    /// Other paths forwarded to the workers.
    pub forward_paths: Vec<PathPattern>,
    /// Most responses whose worker is remembered (oldest forgotten first).
    pub responses_capacity: usize,
    /// How long a response's worker is remembered.
    pub responses_ttl: Duration,
    /// Answer `/tokenize` and `/detokenize` from the model's tokenizer when it is configured.
    pub local_tokenize: bool,
}

impl Default for EndpointsConfig {
    fn default() -> Self {
        EndpointsConfig {
            forward_paths: DEFAULT_FORWARD_PATHS
                .iter()
                .filter_map(|p| PathPattern::parse(p))
                .collect(),
            responses_capacity: DEFAULT_RESPONSES_CAPACITY,
            responses_ttl: DEFAULT_RESPONSES_TTL,
            local_tokenize: true,
        }
    }
}

impl EndpointsConfig {
    /// Whether `path` is on the allow-list.
    pub fn forwards(&self, path: &str) -> bool {
        self.forward_paths.iter().any(|p| p.matches(path))
    }
}

/// The settings of `[endpoints]`.
pub(super) fn endpoints(file: &FileEndpoints) -> Result<EndpointsConfig, ConfigError> {
    let d = EndpointsConfig::default();
    let forward_paths = match &file.forward_paths {
        None => d.forward_paths,
        Some(list) => {
            let mut out = Vec::with_capacity(list.len());
            for (i, s) in list.iter().enumerate() {
                let key = format!("endpoints.forward_paths[{i}]");
                let p = PathPattern::parse(s).ok_or_else(|| {
                    invalid(
                        &key,
                        format!(
                            "`{}` is not a path pattern; give an absolute path such as \
                             \"/v1/classify\", or a prefix ending in `*` such as \"/v1/*\"",
                            crate::openai::shorten(s, crate::openai::ECHO_MAX)
                        ),
                    )
                })?;
                if let Some(own) = OWN_PATHS.iter().find(|own| p.reaches(own)) {
                    return Err(invalid(
                        &key,
                        format!("`{p}` reaches the router's own `{own}`; it is never forwarded"),
                    ));
                }
                out.push(p);
            }
            out
        }
    };
    let responses_capacity = file.responses_capacity.unwrap_or(d.responses_capacity);
    if responses_capacity == 0 {
        return Err(invalid(
            "endpoints.responses_capacity",
            format!(
                "must be at least 1: without it no stored response can be continued; the default is {}",
                d.responses_capacity
            ),
        ));
    }
    Ok(EndpointsConfig {
        forward_paths,
        responses_capacity,
        responses_ttl: seconds(
            "endpoints.responses_ttl_s",
            file.responses_ttl_s,
            d.responses_ttl,
            1.0,
        )?,
        local_tokenize: file.local_tokenize.unwrap_or(d.local_tokenize),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_forward_inference_paths_only() {
        let d = endpoints(&FileEndpoints::default()).unwrap();
        assert_eq!(d, EndpointsConfig::default());
        assert!(d.forwards("/v1/messages") && d.forwards("/pooling"));
        assert!(!d.forwards("/v1/load_lora_adapter") && !d.forwards("/v1/messages/x"));
    }

    #[test]
    fn patterns_and_wildcards() {
        let file = FileEndpoints {
            forward_paths: Some(vec!["/v1/*".into(), "/v1/load_lora_adapter".into()]),
            ..Default::default()
        };
        let c = endpoints(&file).unwrap();
        assert!(c.forwards("/v1/anything/new"));
        assert!(c.forwards("/v1/load_lora_adapter"), "listed exactly");
        assert!(!c.forwards("/v1/unload_lora_adapter"), "never by wildcard");
        assert!(!c.forwards("/v2/x"));
    }

    /// The example config spells out the defaults.
    #[test]
    fn the_example_config_states_the_defaults() {
        let text = include_str!("../../../../config/kvroute.example.toml");
        let c = super::super::Config::from_toml(text, std::path::Path::new("example")).unwrap();
        assert_eq!(c.endpoints, EndpointsConfig::default());
        assert_eq!(c.model("my-model").max_model_len, None);
    }

    #[test]
    fn bad_patterns_and_own_paths_are_refused() {
        for bad in [
            "v1/x",
            "/",
            "/v1/*/x",
            "/v1/../admin",
            "/*",
            "/admin/x",
            "/me*",
            "/health",
        ] {
            let file = FileEndpoints {
                forward_paths: Some(vec![bad.into()]),
                ..Default::default()
            };
            let e = endpoints(&file).unwrap_err().to_string();
            assert!(e.contains("endpoints.forward_paths[0]"), "{bad}: {e}");
        }
        let zero = FileEndpoints {
            responses_capacity: Some(0),
            ..Default::default()
        };
        assert!(endpoints(&zero).is_err());
        let ttl = FileEndpoints {
            responses_ttl_s: Some(0.1),
            ..Default::default()
        };
        assert!(endpoints(&ttl).is_err());
    }
}
