//! The session a request names, read where `[sessions]` says clients name it: a header (by
//! default `x-session-id`), then OpenAI's `prompt_cache_key`, then `user`. The name is scoped
//! to the caller's tenant and the request's model, so one tenant's session names never steer
//! another's requests. The hint is evidence for the decision (`index::sessions`), not a pin.

use http::HeaderMap;

use crate::config::{SessionField, SessionsConfig};
use crate::index::SessionKey;
use crate::openai::RequestView;

/// Where a request's session name was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum HintSource {
    /// The configured header.
    Header,
    /// A body member.
    Body(SessionField),
}

impl HintSource {
    /// As `/debug/route` shows it.
    pub(super) fn name(self) -> &'static str {
        match self {
            HintSource::Header => "header",
            HintSource::Body(f) => f.name(),
        }
    }
}

/// The session `headers` and `view` name under `config`, for `tenant` on `model`; `None` when
/// hints are off or the request names none (an empty name names none).
pub(super) fn session_of(
    config: &SessionsConfig,
    headers: &HeaderMap,
    view: Option<&RequestView>,
    tenant: Option<&str>,
    model: &str,
) -> Option<(SessionKey, HintSource)> {
    if config.max_sessions == 0 {
        return None;
    }
    let header = config
        .header
        .as_ref()
        .and_then(|h| headers.get(h))
        .map(|v| v.as_bytes())
        .filter(|v| !v.is_empty())
        .map(|v| (v, HintSource::Header));
    let body = || {
        let view = view?;
        config.body_fields.iter().find_map(|&f| {
            let value = match f {
                SessionField::PromptCacheKey => view.prompt_cache_key.as_deref(),
                SessionField::User => view.user.as_deref(),
            };
            value
                .filter(|v| !v.is_empty())
                .map(|v| (v.as_bytes(), HintSource::Body(f)))
        })
    };
    let (name, source) = header.or_else(body)?;
    Some((SessionKey::new(tenant, model, name), source))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openai::Endpoint;
    use http::HeaderValue;
    use serde_json::json;

    fn view(body: serde_json::Value) -> RequestView {
        RequestView::parse(Endpoint::Completions, &body).unwrap()
    }

    #[test]
    fn the_header_wins_then_the_body_fields_in_order() {
        let config = SessionsConfig::default();
        let v = view(json!({"model": "m", "prompt": "p", "prompt_cache_key": "k", "user": "u"}));
        let mut headers = HeaderMap::new();
        headers.insert("x-session-id", HeaderValue::from_static("h"));
        let (key, source) = session_of(&config, &headers, Some(&v), None, "m").unwrap();
        assert_eq!(source, HintSource::Header);
        assert_eq!(key, SessionKey::new(None, "m", b"h"));
        let (key, source) = session_of(&config, &HeaderMap::new(), Some(&v), None, "m").unwrap();
        assert_eq!(source.name(), "prompt_cache_key");
        assert_eq!(key, SessionKey::new(None, "m", b"k"));
        let u = view(json!({"model": "m", "prompt": "p", "user": "u"}));
        let (_, source) = session_of(&config, &HeaderMap::new(), Some(&u), None, "m").unwrap();
        assert_eq!(source.name(), "user");
    }

    #[test]
    fn no_name_empty_names_and_hints_off_name_no_session() {
        let config = SessionsConfig::default();
        let v = view(json!({"model": "m", "prompt": "p", "user": ""}));
        let mut headers = HeaderMap::new();
        headers.insert("x-session-id", HeaderValue::from_static(""));
        assert!(session_of(&config, &headers, Some(&v), None, "m").is_none());
        assert!(session_of(&config, &HeaderMap::new(), None, None, "m").is_none());
        let off = SessionsConfig {
            max_sessions: 0,
            ..SessionsConfig::default()
        };
        let k = view(json!({"model": "m", "prompt": "p", "prompt_cache_key": "k"}));
        assert!(session_of(&off, &HeaderMap::new(), Some(&k), None, "m").is_none());
        let header_only = SessionsConfig {
            body_fields: Vec::new(),
            ..SessionsConfig::default()
        };
        assert!(session_of(&header_only, &HeaderMap::new(), Some(&k), None, "m").is_none());
    }

    #[test]
    fn tenants_naming_a_session_alike_get_different_sessions() {
        let config = SessionsConfig::default();
        let v = view(json!({"model": "m", "prompt": "p", "prompt_cache_key": "k"}));
        let a = session_of(&config, &HeaderMap::new(), Some(&v), Some("a"), "m").unwrap();
        let b = session_of(&config, &HeaderMap::new(), Some(&v), Some("b"), "m").unwrap();
        assert_ne!(a.0, b.0);
    }
}
