//! What a configuration reload may not do silently. A file rewritten by mistake, or caught
//! truncated by the change watch, is still valid TOML: without `[[tenants]]` it switches
//! authentication off, without `[[workers]]` it drains the whole static fleet, and an empty
//! file does both. So a reload is refused, before anything is applied, when the file is empty
//! or when it removes every tenant or every static worker without saying so (`tenants = []`,
//! `workers = []`); and what an applied reload opens is logged at WARN, not INFO.

use crate::config::{Config, ConfigError};

/// Why the reload from `running` to `new` (read from a file that was `empty`: nothing but
/// whitespace) must not be applied; `None` when it may.
pub(super) fn refusal(running: &Config, new: &Config, empty: bool) -> Option<ConfigError> {
    let refuse = |key: &str, message: &str| {
        Some(ConfigError::Invalid {
            key: key.to_owned(),
            message: message.to_owned(),
        })
    };
    if empty {
        return refuse(
            "(file)",
            "the file is empty (caught mid-write, or truncated?); an empty file is never \
             applied by a reload",
        );
    }
    if !running.tenants.is_empty() && new.tenants.is_empty() && !new.emptied.tenants {
        return refuse(
            "tenants",
            "the file has no [[tenants]], which would switch authentication off; write \
             `tenants = []` to mean it",
        );
    }
    if !running.workers.is_empty() && new.workers.is_empty() && !new.emptied.workers {
        return refuse(
            "workers",
            "the file has no [[workers]], which would drain and remove every static worker; \
             write `workers = []` to mean it",
        );
    }
    None
}

/// What the reload from `running` to `new` opens: one sentence each, logged at WARN.
pub(super) fn opened(running: &Config, new: &Config) -> Vec<String> {
    let mut out = Vec::new();
    if !running.tenants.is_empty() && new.tenants.is_empty() {
        out.push(
            "every tenant is removed: the OpenAI endpoints now take requests without a key".into(),
        );
    }
    let added: Vec<&str> = new
        .tenants
        .iter()
        .filter(|t| !running.tenants.iter().any(|r| r.name == t.name))
        .map(|t| t.name.as_str())
        .collect();
    if !running.tenants.is_empty() && !added.is_empty() {
        out.push(format!(
            "new tenants may call the router: {}",
            added.join(", ")
        ));
    }
    let widened: Vec<&str> = new
        .tenants
        .iter()
        .filter(|t| {
            running.tenants.iter().any(|r| {
                r.name == t.name
                    && (r.api_key_sha256 != t.api_key_sha256
                        || t.models.iter().any(|m| !r.allows(m)))
            })
        })
        .map(|t| t.name.as_str())
        .collect();
    if !widened.is_empty() {
        out.push(format!(
            "tenants with a new key or more models: {}",
            widened.join(", ")
        ));
    }
    if running.admin.key_sha256 != new.admin.key_sha256 && new.admin.key_sha256.is_some() {
        out.push("the admin key changed".into());
    }
    if new.admin.open_on_loopback && !running.admin.open_on_loopback {
        out.push("the admin API's changes are open to loopback clients without a key".into());
    }
    if !running.workers.is_empty() && new.workers.is_empty() {
        out.push("every static worker is removed: they drain and leave".into());
    }
    out
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn config(text: &str) -> Config {
        Config::from_toml(text, Path::new("test")).unwrap()
    }

    const TENANT: &str = "[[tenants]]\nname = \"a\"\napi_key_sha256 = \"\
        0000000000000000000000000000000000000000000000000000000000000001\"\n";
    const WORKER: &str = "[[workers]]\nurl = \"http://127.0.0.1:9001\"\nmodels = [\"m\"]\n";

    /// Issue 35 item 6: a file without `[[tenants]]` (or an empty one) was applied by a reload,
    /// switching authentication off with an INFO line.
    #[test]
    fn removing_every_tenant_or_worker_needs_the_file_to_say_so() {
        let running = config(&format!("{TENANT}{WORKER}"));
        let no_tenants = config(WORKER);
        let e = refusal(&running, &no_tenants, false).expect("refused");
        assert!(e.to_string().contains("tenants = []"), "{e}");
        let said = config(&format!("tenants = []\n{WORKER}"));
        assert!(refusal(&running, &said, false).is_none());
        assert!(opened(&running, &said)[0].contains("without a key"));
        let no_workers = config(TENANT);
        let e = refusal(&running, &no_workers, false).expect("refused");
        assert!(e.to_string().contains("workers = []"), "{e}");
        assert!(refusal(&running, &config(&format!("workers = []\n{TENANT}")), false).is_none());
        // An empty file is never applied, even over a router with neither.
        let bare = config("");
        assert!(refusal(&bare, &bare, true).is_some());
        assert!(refusal(&bare, &bare, false).is_none());
        assert!(opened(&running, &running).is_empty());
    }
}
