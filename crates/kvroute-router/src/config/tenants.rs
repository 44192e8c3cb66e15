//! `[[tenants]]` and `[admin]`: who may call the router, with which key, for which models.
//!
//! Keys are configured as SHA-256 digests so the config file (often in a repository or a
//! ConfigMap) never holds a usable secret.

use super::file::{FileAdmin, FileTenant};
use super::{ConfigError, invalid};
use crate::shaping::{Priorities, TenantPriority};

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
    /// Its place in the admission queue: priority and fair share.
    pub shaping: TenantShaping,
}

/// A tenant's place in the admission queue, its rate limits and latency targets.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TenantShaping {
    /// Its requests' band, the highest band they may ask for, and whether they are sheddable.
    pub priority: TenantPriority,
    /// Its share of its band's slots while other tenants wait there too (default 1).
    pub weight: u32,
    /// Prompt plus output tokens it may spend per minute (per router replica).
    pub tokens_per_minute: Option<u64>,
    /// Requests it may send per minute (per router replica).
    pub requests_per_minute: Option<u64>,
    /// Its requests' time-to-first-token target, seconds, unless a request names its own.
    pub ttft_target_s: Option<f64>,
    /// Its requests' inter-token latency target, seconds, unless a request names its own.
    pub itl_target_s: Option<f64>,
}

impl Default for TenantShaping {
    fn default() -> Self {
        TenantShaping {
            priority: TenantPriority::default(),
            weight: 1,
            tokens_per_minute: None,
            requests_per_minute: None,
            ttft_target_s: None,
            itl_target_s: None,
        }
    }
}

impl TenantConfig {
    /// Whether the tenant may use `model`.
    pub fn allows(&self, model: &str) -> bool {
        self.models.iter().any(|m| m == ANY_MODEL || m == model)
    }
}

/// The tenants of `[[tenants]]`: unique names, unique keys.
pub(super) fn tenants(
    file: Vec<FileTenant>,
    priorities: &Priorities,
) -> Result<Vec<TenantConfig>, ConfigError> {
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
        let shaping = shaping(&key, &t, priorities)?;
        tenants.push(TenantConfig {
            name: t.name,
            api_key_sha256: digest,
            models: t.models.unwrap_or_else(|| vec![ANY_MODEL.into()]),
            max_concurrency: t.max_concurrency,
            shaping,
        });
    }
    Ok(tenants)
}

/// A tenant's priority and weight, its bands named in `[priority] bands`.
fn shaping(
    key: &str,
    t: &FileTenant,
    priorities: &Priorities,
) -> Result<TenantShaping, ConfigError> {
    let band = |field: &str, name: &Option<String>| {
        name.as_deref()
            .map(|n| {
                priorities.band(n).ok_or_else(|| {
                    invalid(
                        format!("{key}.{field}"),
                        format!(
                            "`{n}` is not one of priority.bands ({})",
                            priorities.bands.join(", ")
                        ),
                    )
                })
            })
            .transpose()
    };
    let own = band("priority", &t.priority)?;
    let max_band = band("max_priority", &t.max_priority)?;
    if let Some(max) = max_band
        && max > own.unwrap_or(priorities.default_band)
    {
        return Err(invalid(
            format!("{key}.max_priority"),
            "is below the tenant's own priority; it names the highest band its requests may ask for",
        ));
    }
    for (field, v) in [
        ("weight", t.weight.map(u64::from)),
        ("tokens_per_minute", t.tokens_per_minute),
        ("requests_per_minute", t.requests_per_minute),
    ] {
        if v == Some(0) {
            return Err(invalid(format!("{key}.{field}"), "must be at least 1"));
        }
    }
    Ok(TenantShaping {
        priority: TenantPriority {
            band: own,
            max_band,
            sheddable: t.sheddable,
        },
        weight: t.weight.unwrap_or(1),
        tokens_per_minute: t.tokens_per_minute,
        requests_per_minute: t.requests_per_minute,
        ttft_target_s: target_s(key, "ttft_target_ms", t.ttft_target_ms)?,
        itl_target_s: target_s(key, "itl_target_ms", t.itl_target_ms)?,
    })
}

/// A latency target in milliseconds, as seconds: positive and finite.
pub(super) fn target_s(
    key: &str,
    field: &str,
    ms: Option<f64>,
) -> Result<Option<f64>, ConfigError> {
    match ms {
        Some(v) if !(v.is_finite() && v > 0.0) => Err(invalid(
            format!("{key}.{field}"),
            "must be a positive number of milliseconds",
        )),
        v => Ok(v.map(|ms| ms / 1000.0)),
    }
}

/// Who may use the admin API (`[admin]`, `--admin-open-on-loopback`).
///
/// Closed by default: without a key, the admin API's changes (adding, draining, removing
/// workers) are refused, because anyone who reaches the listener could otherwise add a worker
/// of their own and receive other clients' prompts. `open_on_loopback` opens them, still
/// without a key, to clients connecting from a loopback address only (a development setup on
/// one machine); it cannot be combined with a key, which is then required from everyone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AdminAccess {
    /// SHA-256 of the admin API key, if one is configured.
    pub key_sha256: Option<[u8; 32]>,
    /// Without a key, the admin API's changes are accepted from loopback clients.
    pub open_on_loopback: bool,
}

/// The admin access of `[admin]` and the flag: a key must not also be a tenant's key (an admin
/// key handed to a tenant would let it reconfigure the fleet).
pub(super) fn admin_access(
    file: Option<FileAdmin>,
    flag_open_on_loopback: bool,
    tenants: &[TenantConfig],
) -> Result<AdminAccess, ConfigError> {
    let file = file.unwrap_or(FileAdmin {
        api_key_sha256: None,
        open_on_loopback: None,
    });
    let open_on_loopback = flag_open_on_loopback || file.open_on_loopback == Some(true);
    let Some(key) = file.api_key_sha256 else {
        return Ok(AdminAccess {
            key_sha256: None,
            open_on_loopback,
        });
    };
    let digest = sha256_hex("admin.api_key_sha256", &key)?;
    if tenants.iter().any(|t| t.api_key_sha256 == digest) {
        return Err(invalid(
            "admin.api_key_sha256",
            "the admin key must differ from every tenant key",
        ));
    }
    if open_on_loopback {
        return Err(invalid(
            "admin.open_on_loopback",
            "opens the admin API without a key, but `admin.api_key_sha256` is set: with a key \
             the key is required from every client; remove one of the two (or the \
             --admin-open-on-loopback flag)",
        ));
    }
    Ok(AdminAccess {
        key_sha256: Some(digest),
        open_on_loopback: false,
    })
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
