//! `[sessions]`: where clients name their sessions (affinity hints), and how long the router
//! remembers where each one went (see `index::sessions`).
//!
//! ```toml
//! [sessions]
//! header = "x-session-id"                    # "" reads no header
//! body_fields = ["prompt_cache_key", "user"] # [] reads none
//! ttl_s = 600
//! max_sessions = 65536                       # 0 turns hints off
//! ```
//!
//! The first name found wins: the header, then the body fields in the order listed.

use std::time::Duration;

use http::HeaderName;
use serde::Deserialize;

use super::values::seconds;
use super::{ConfigError, invalid};
use crate::index::{DEFAULT_MAX_SESSIONS, DEFAULT_SESSION_TTL};

/// The header read by default.
pub const DEFAULT_SESSION_HEADER: &str = "x-session-id";

/// The `[sessions]` table.
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct FileSessions {
    pub(super) header: Option<String>,
    pub(super) body_fields: Option<Vec<String>>,
    pub(super) ttl_s: Option<f64>,
    pub(super) max_sessions: Option<usize>,
}

/// A body member that names a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionField {
    /// OpenAI's `prompt_cache_key`.
    PromptCacheKey,
    /// OpenAI's `user`.
    User,
}

impl SessionField {
    /// The member's name.
    pub fn name(self) -> &'static str {
        match self {
            SessionField::PromptCacheKey => "prompt_cache_key",
            SessionField::User => "user",
        }
    }
}

/// What `[sessions]` configures.
#[derive(Clone, Debug, PartialEq)]
pub struct SessionsConfig {
    /// The request header that names a session, if any.
    pub header: Option<HeaderName>,
    /// The body members that name one, in order of precedence.
    pub body_fields: Vec<SessionField>,
    /// How long a session's home is remembered after its last request.
    pub ttl: Duration,
    /// Most sessions remembered (0: hints are ignored).
    pub max_sessions: usize,
}

impl Default for SessionsConfig {
    fn default() -> Self {
        SessionsConfig {
            header: Some(HeaderName::from_static(DEFAULT_SESSION_HEADER)),
            body_fields: vec![SessionField::PromptCacheKey, SessionField::User],
            ttl: DEFAULT_SESSION_TTL,
            max_sessions: DEFAULT_MAX_SESSIONS,
        }
    }
}

/// The settings of `[sessions]`.
pub(super) fn sessions(file: &FileSessions) -> Result<SessionsConfig, ConfigError> {
    let d = SessionsConfig::default();
    let header = match file.header.as_deref() {
        None => d.header,
        Some("") => None,
        Some(h) => Some(HeaderName::try_from(h.to_ascii_lowercase()).map_err(|_| {
            invalid(
                "sessions.header",
                format!(
                    "`{}` is not a header name; give one such as \"{DEFAULT_SESSION_HEADER}\", \
                     or \"\" to read none",
                    crate::openai::shorten(h, crate::openai::ECHO_MAX)
                ),
            )
        })?),
    };
    let body_fields = match &file.body_fields {
        None => d.body_fields,
        Some(list) => {
            let mut out = Vec::with_capacity(list.len());
            for (i, f) in list.iter().enumerate() {
                let field = match f.as_str() {
                    "prompt_cache_key" => SessionField::PromptCacheKey,
                    "user" => SessionField::User,
                    other => {
                        return Err(invalid(
                            format!("sessions.body_fields[{i}]"),
                            format!(
                                "`{}` is not a field that names a session; give \
                                 \"prompt_cache_key\" or \"user\"",
                                crate::openai::shorten(other, crate::openai::ECHO_MAX)
                            ),
                        ));
                    }
                };
                if !out.contains(&field) {
                    out.push(field);
                }
            }
            out
        }
    };
    Ok(SessionsConfig {
        header,
        body_fields,
        ttl: seconds("sessions.ttl_s", file.ttl_s, d.ttl, 1.0)?,
        max_sessions: file.max_sessions.unwrap_or(d.max_sessions),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<SessionsConfig, ConfigError> {
        let file: FileSessions = toml::from_str(text).expect("toml");
        sessions(&file)
    }

    #[test]
    fn defaults_read_the_header_then_prompt_cache_key_then_user() {
        let c = parse("").unwrap();
        assert_eq!(c, SessionsConfig::default());
        assert_eq!(c.header.unwrap().as_str(), "x-session-id");
        assert_eq!(
            c.body_fields,
            [SessionField::PromptCacheKey, SessionField::User]
        );
    }

    #[test]
    fn each_source_can_be_turned_off_or_renamed() {
        let c = parse("header = \"\"\nbody_fields = []\nttl_s = 30\nmax_sessions = 0").unwrap();
        assert_eq!(c.header, None);
        assert!(c.body_fields.is_empty());
        assert_eq!(c.ttl, Duration::from_secs(30));
        assert_eq!(c.max_sessions, 0);
        let c = parse("header = \"X-Conversation\"\nbody_fields = [\"user\"]").unwrap();
        assert_eq!(c.header.unwrap().as_str(), "x-conversation");
        assert_eq!(c.body_fields, [SessionField::User]);
    }

    #[test]
    fn mistakes_name_the_key_and_the_fix() {
        let e = parse("header = \"bad header\"").unwrap_err().to_string();
        assert!(
            e.contains("sessions.header") && e.contains("x-session-id"),
            "{e}"
        );
        let e = parse("body_fields = [\"session\"]")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("sessions.body_fields[0]") && e.contains("prompt_cache_key"),
            "{e}"
        );
        let e = parse("ttl_s = 0").unwrap_err().to_string();
        assert!(e.contains("sessions.ttl_s"), "{e}");
    }
}
