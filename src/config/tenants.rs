//! `[[tenants]]` and `[admin]`: who may call the router, with which key, for which models.
//!
//! Keys are configured as SHA-256 digests so the config file (often in a repository or a
//! ConfigMap) never holds a usable secret.

use super::file::{FileAdmin, FileTenant};
use super::{ConfigError, invalid};

/// The model list that allows every model; also a tenant's default.
pub const ANY_MODEL: &str = "*";

/// One tenant: who holds an API key, which models it may use, and its share of capacity.
#[derive(Clone, Debug, PartialEq)]
pub struct TenantConfig {
    /// The tenant's name (logs, metrics, its cache namespace).
    pub name: String,
    /// SHA-256 of its API key (the key itself is never stored).
    pub api_key_sha256: [u8; 32],
    /// Models it may use; `*` allows all.
    pub models: Vec<String>,
    /// Its own concurrency limit, within the router's.
    pub max_concurrency: Option<usize>,
}

impl TenantConfig {
    /// Whether the tenant may use `model`.
    pub fn allows(&self, model: &str) -> bool {
        self.models.iter().any(|m| m == ANY_MODEL || m == model)
    }
}

/// The tenants of `[[tenants]]`: unique names, unique keys.
pub(super) fn tenants(file: Vec<FileTenant>) -> Result<Vec<TenantConfig>, ConfigError> {
    let mut tenants: Vec<TenantConfig> = Vec::new();
    for (i, t) in file.into_iter().enumerate() {
        let key = format!("tenants[{i}]");
        if t.name.is_empty() || t.name.chars().any(|c| c.is_control()) {
            return Err(invalid(format!("{key}.name"), "must be a non-empty name"));
        }
        if tenants.iter().any(|x| x.name == t.name) {
            return Err(invalid(
                format!("{key}.name"),
                format!("tenant `{}` is listed twice", t.name),
            ));
        }
        let digest = sha256_hex(&format!("{key}.api_key_sha256"), &t.api_key_sha256)?;
        if tenants.iter().any(|x| x.api_key_sha256 == digest) {
            return Err(invalid(
                format!("{key}.api_key_sha256"),
                "two tenants share one API key; give each its own",
            ));
        }
        if t.max_concurrency == Some(0) {
            return Err(invalid(
                format!("{key}.max_concurrency"),
                "must be at least 1",
            ));
        }
        if t.models.as_ref().is_some_and(Vec::is_empty) {
            return Err(invalid(
                format!("{key}.models"),
                "lists no model, so every request of this tenant would be refused; name its \
                 models, or omit the key to allow every model",
            ));
        }
        if t.models.iter().flatten().any(|m| m.is_empty()) {
            return Err(invalid(
                format!("{key}.models"),
                "model names must not be empty",
            ));
        }
        tenants.push(TenantConfig {
            name: t.name,
            api_key_sha256: digest,
            models: t.models.unwrap_or_else(|| vec![ANY_MODEL.into()]),
            max_concurrency: t.max_concurrency,
        });
    }
    Ok(tenants)
}

/// The admin key of `[admin]`, which must not also be a tenant's key (an admin key handed to
/// a tenant would let it reconfigure the fleet).
pub(super) fn admin_key(
    file: Option<FileAdmin>,
    tenants: &[TenantConfig],
) -> Result<Option<[u8; 32]>, ConfigError> {
    let Some(a) = file else {
        return Ok(None);
    };
    let digest = sha256_hex("admin.api_key_sha256", &a.api_key_sha256)?;
    if tenants.iter().any(|t| t.api_key_sha256 == digest) {
        return Err(invalid(
            "admin.api_key_sha256",
            "the admin key must differ from every tenant key",
        ));
    }
    Ok(Some(digest))
}

/// Decodes a 64-digit hex SHA-256.
fn sha256_hex(key: &str, v: &str) -> Result<[u8; 32], ConfigError> {
    let bad = || {
        invalid(
            key,
            "must be the 64 hex digits of the key's SHA-256 (e.g. `printf %s \"$KEY\" | sha256sum`)",
        )
    };
    let v = v.trim();
    if v.len() != 64 {
        return Err(bad());
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte =
            u8::from_str_radix(v.get(2 * i..2 * i + 2).ok_or_else(bad)?, 16).map_err(|_| bad())?;
    }
    Ok(out)
}
