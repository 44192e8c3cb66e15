//! Who is calling: API keys, tenants, the admin key, and each tenant's cache namespace.
//!
//! Keys are configured as SHA-256 digests; a presented key is hashed and looked up, so the
//! router never holds or logs a key in clear. With no keys configured the OpenAI endpoints and
//! the admin's reads (`GET /admin/workers`, `/debug/route`) are open (a development setup),
//! but the admin API's changes are not: a worker added by anyone who reaches the listener
//! would receive other clients' prompts, so they need the admin key, or, without one, a
//! loopback client and `[admin] open_on_loopback`. With tenants, every OpenAI request needs a
//! tenant key; the admin API and `/debug/route` take only the admin key, and are off when
//! there is none.
//!
//! A tenant's prompts are hashed under its own cache salt, derived from its key digest and
//! name (and the client's `cache_salt`, namespaced underneath): tenants never share index
//! entries, and, with the salt forwarded to vLLM, never share KV cache either — so neither
//! routing nor timing can reveal another tenant's prompts.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use arc_swap::ArcSwap;
use http::{HeaderMap, StatusCode};
use sha2::{Digest, Sha256};

use crate::config::{AdminAccess, TenantConfig};
use crate::openai::ApiError;
use crate::routing::tenant_salt;

/// Header with which the admin asks `/debug/route` to decide as a given tenant would.
pub const TENANT_HEADER: &str = "x-kvroute-tenant";

/// A caller of the OpenAI endpoints.
#[derive(Clone, Debug)]
pub enum Caller {
    /// No authentication is configured.
    Anonymous,
    /// An authenticated tenant.
    Tenant(Arc<TenantConfig>),
}

impl Caller {
    /// The tenant's name, if any.
    pub fn tenant(&self) -> Option<&str> {
        match self {
            Caller::Anonymous => None,
            Caller::Tenant(t) => Some(&t.name),
        }
    }

    /// The cache salt this caller's request is hashed and cached under: the client's salt
    /// as is when there are no tenants, else the client's salt namespaced under the tenant.
    pub fn cache_salt(&self, client_salt: Option<&str>) -> Option<String> {
        match self {
            Caller::Anonymous => client_salt.map(str::to_owned),
            Caller::Tenant(t) => Some(tenant_salt(&t.api_key_sha256, &t.name, client_salt)),
        }
    }

    /// The id a Responses request that chose its own `request_id` (which vLLM makes the
    /// response's id, in one store for everyone) is sent with: the client's id as is without
    /// tenants; for a tenant, `resp_` and a digest of the tenant's key, name and the client's
    /// id, so that no tenant can name, read, continue or overwrite another's response by
    /// choosing its id. The same tenant choosing the same id gets the same one.
    pub fn response_id(&self, client_id: &str) -> String {
        match self {
            Caller::Anonymous => client_id.to_owned(),
            Caller::Tenant(t) => {
                let mut h = Sha256::new();
                h.update(b"kvroute-response-id\0");
                h.update(t.api_key_sha256);
                h.update(t.name.as_bytes());
                h.update([0]);
                h.update(client_id.as_bytes());
                let d = h.finalize();
                let hex: String = d[..16].iter().map(|b| format!("{b:02x}")).collect();
                format!("resp_{hex}")
            }
        }
    }
}

/// The configured keys. A config reload replaces them whole ([`Keys::replace`]): each check
/// reads one set, never a mix of the old tenants and the new admin key.
#[derive(Debug, Default)]
pub struct Keys {
    set: ArcSwap<KeySet>,
}

/// One generation of the keys.
#[derive(Debug, Default)]
struct KeySet {
    tenants: HashMap<[u8; 32], Arc<TenantConfig>>,
    by_name: HashMap<String, Arc<TenantConfig>>,
    admin: Option<[u8; 32]>,
    /// Without an admin key, the admin API's changes are accepted from loopback clients.
    admin_on_loopback: bool,
}

fn unauthorized(message: &str) -> ApiError {
    ApiError::new(
        StatusCode::UNAUTHORIZED,
        "authentication_error",
        Some("invalid_api_key"),
        message,
    )
}

fn forbidden(message: String) -> ApiError {
    ApiError::new(
        StatusCode::FORBIDDEN,
        "permission_error",
        Some("forbidden"),
        message,
    )
}

/// The SHA-256 of the bearer token, if the request has one.
fn presented(headers: &HeaderMap) -> Option<[u8; 32]> {
    let v = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let token = token.trim();
    if token.is_empty() {
        return None;
    }
    Some(Sha256::digest(token.as_bytes()).into())
}

impl KeySet {
    fn new(tenants: &[TenantConfig], admin: AdminAccess) -> KeySet {
        let all: Vec<Arc<TenantConfig>> = tenants.iter().cloned().map(Arc::new).collect();
        KeySet {
            tenants: all
                .iter()
                .map(|t| (t.api_key_sha256, Arc::clone(t)))
                .collect(),
            by_name: all
                .iter()
                .map(|t| (t.name.clone(), Arc::clone(t)))
                .collect(),
            admin: admin.key_sha256,
            admin_on_loopback: admin.open_on_loopback,
        }
    }

    fn enabled(&self) -> bool {
        !self.tenants.is_empty() || self.admin.is_some()
    }
}

impl Keys {
    /// Keys from the configuration.
    pub fn new(tenants: &[TenantConfig], admin: AdminAccess) -> Keys {
        Keys {
            set: ArcSwap::from_pointee(KeySet::new(tenants, admin)),
        }
    }

    /// Replaces every key at once (a config reload): requests checked from now on see the
    /// new set; a request already admitted keeps its tenant.
    pub fn replace(&self, tenants: &[TenantConfig], admin: AdminAccess) {
        self.set.store(Arc::new(KeySet::new(tenants, admin)));
    }

    /// Whether any key is configured.
    pub fn enabled(&self) -> bool {
        self.set.load().enabled()
    }

    /// The caller of an OpenAI endpoint for `model`: 401 without a valid tenant key, 403 for
    /// a model the tenant may not use.
    pub fn caller(&self, headers: &HeaderMap) -> Result<Caller, ApiError> {
        self.set.load().caller(headers)
    }

    /// Who is asking for the model list (`GET /v1/models`), which says what the fleet serves:
    /// with tenants configured it needs a key, like inference. `None` sees every model (no
    /// tenants configured, or the admin key: operators check the fleet with it); a tenant sees
    /// the models it may use. 401 without a valid key.
    pub fn model_reader(&self, headers: &HeaderMap) -> Result<Option<Arc<TenantConfig>>, ApiError> {
        let set = self.set.load();
        if set.tenants.is_empty() {
            return Ok(None);
        }
        if set.admin.is_some() && presented(headers) == set.admin {
            return Ok(None);
        }
        match set.caller(headers)? {
            Caller::Tenant(t) => Ok(Some(t)),
            Caller::Anonymous => Ok(None),
        }
    }

    /// Checks that `caller` may use `model`.
    pub fn authorize_model(caller: &Caller, model: &str) -> Result<(), ApiError> {
        match caller {
            Caller::Tenant(t) if !t.allows(model) => Err(forbidden(format!(
                "your key may not use the model `{}`",
                crate::openai::shorten(model, crate::openai::ECHO_MAX)
            ))),
            _ => Ok(()),
        }
    }

    /// Admits an admin read (`GET /admin/workers`, `/debug/route`): open when no key at all
    /// is configured, else the admin key only (a tenant key is refused, and without an admin
    /// key the admin API is off).
    pub fn admin(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        self.set.load().admin(headers)
    }

    /// Admits an admin change (adding, draining, undraining, removing a worker) from a client
    /// at `peer` (`None`: unknown): the admin key only; without one, refused (403) unless the
    /// admin API is opened to loopback clients and `peer` is one.
    pub fn admin_change(&self, headers: &HeaderMap, peer: Option<IpAddr>) -> Result<(), ApiError> {
        let set = self.set.load();
        if set.admin.is_some() || set.enabled() {
            return set.admin(headers);
        }
        let loopback = peer.is_some_and(|ip| ip.to_canonical().is_loopback());
        if set.admin_on_loopback && loopback {
            return Ok(());
        }
        Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "permission_error",
            Some("admin_closed"),
            if set.admin_on_loopback {
                "the admin API is open to loopback clients only; configure [admin] \
                 api_key_sha256 to administer the router from elsewhere"
            } else {
                "the admin API is closed: no admin key is configured. Configure [admin] \
                 api_key_sha256 (and send it as `Authorization: Bearer <admin key>`), or open \
                 it to loopback clients with [admin] open_on_loopback = true \
                 (--admin-open-on-loopback)"
            },
        ))
    }

    /// Whether the admin API's changes are accepted without a key (from loopback clients).
    pub fn admin_open_without_key(&self) -> bool {
        let set = self.set.load();
        !set.enabled() && set.admin_on_loopback
    }

    /// How the admin API stands, for the line logged at start.
    pub fn admin_state(&self) -> &'static str {
        let set = self.set.load();
        match (set.admin.is_some(), set.admin_on_loopback) {
            (true, _) => "the admin API takes the admin key",
            (false, _) if !set.tenants.is_empty() => "the admin API is off: no admin key",
            (false, true) => {
                "the admin API's changes are open to loopback clients without a key \
                 ([admin] open_on_loopback)"
            }
            (false, false) => {
                "the admin API's changes are refused: no admin key is configured \
                 ([admin] api_key_sha256, or open_on_loopback for a single machine)"
            }
        }
    }

    /// The tenant named `name`, for the admin's `/debug/route` on a tenant's behalf.
    pub fn tenant_named(&self, name: &str) -> Option<Caller> {
        self.set
            .load()
            .by_name
            .get(name)
            .map(|t| Caller::Tenant(Arc::clone(t)))
    }
}

impl KeySet {
    fn caller(&self, headers: &HeaderMap) -> Result<Caller, ApiError> {
        if self.tenants.is_empty() {
            return Ok(Caller::Anonymous);
        }
        let Some(digest) = presented(headers) else {
            return Err(unauthorized(
                "an API key is required: send `Authorization: Bearer <key>`",
            ));
        };
        match self.tenants.get(&digest) {
            Some(t) => Ok(Caller::Tenant(Arc::clone(t))),
            None if Some(digest) == self.admin => Err(forbidden(
                "the admin key cannot be used for inference; use a tenant key".into(),
            )),
            None => Err(unauthorized("the API key is not valid")),
        }
    }

    fn admin(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        if !self.enabled() {
            return Ok(());
        }
        let digest = presented(headers);
        match self.admin {
            None => Err(forbidden(
                "the admin API is disabled: configure [admin] api_key_sha256".into(),
            )),
            Some(a) if digest == Some(a) => Ok(()),
            Some(_) if digest.is_some_and(|d| self.tenants.contains_key(&d)) => {
                Err(forbidden("a tenant key cannot use the admin API".into()))
            }
            Some(_) if digest.is_none() => Err(unauthorized(
                "the admin key is required: send `Authorization: Bearer <admin key>`",
            )),
            Some(_) => Err(unauthorized("the admin key is not valid")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(key: &str) -> [u8; 32] {
        Sha256::digest(key.as_bytes()).into()
    }

    fn key(digest: [u8; 32]) -> AdminAccess {
        AdminAccess {
            key_sha256: Some(digest),
            open_on_loopback: false,
        }
    }

    fn keys() -> Keys {
        let t = |name: &str, key: &str, models: &[&str]| TenantConfig {
            name: name.into(),
            api_key_sha256: digest(key),
            models: models.iter().map(|m| m.to_string()).collect(),
            max_concurrency: None,
            shaping: Default::default(),
        };
        Keys::new(
            &[t("acme", "k-acme", &["*"]), t("bob", "k-bob", &["small"])],
            key(digest("k-admin")),
        )
    }

    fn bearer(key: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("authorization", format!("Bearer {key}").parse().unwrap());
        h
    }

    #[test]
    fn tenants_need_their_key_and_allowed_models() {
        let k = keys();
        assert_eq!(k.caller(&HeaderMap::new()).unwrap_err().status, 401);
        assert_eq!(k.caller(&bearer("nope")).unwrap_err().status, 401);
        assert_eq!(k.caller(&bearer("k-admin")).unwrap_err().status, 403);
        let bob = k.caller(&bearer("k-bob")).unwrap();
        assert_eq!(bob.tenant(), Some("bob"));
        assert!(Keys::authorize_model(&bob, "small").is_ok());
        assert_eq!(Keys::authorize_model(&bob, "big").unwrap_err().status, 403);
        let acme = k.caller(&bearer("k-acme")).unwrap();
        assert!(Keys::authorize_model(&acme, "big").is_ok());
    }

    #[test]
    fn the_model_list_needs_a_key_and_is_scoped_to_the_tenant() {
        let k = keys();
        assert_eq!(k.model_reader(&HeaderMap::new()).unwrap_err().status, 401);
        assert_eq!(k.model_reader(&bearer("nope")).unwrap_err().status, 401);
        assert!(k.model_reader(&bearer("k-admin")).unwrap().is_none(), "all");
        let bob = k.model_reader(&bearer("k-bob")).unwrap().unwrap();
        assert!(bob.allows("small") && !bob.allows("big"));
        assert!(
            Keys::default()
                .model_reader(&HeaderMap::new())
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn admin_api_takes_only_the_admin_key() {
        let k = keys();
        assert!(k.admin(&bearer("k-admin")).is_ok());
        assert_eq!(k.admin(&bearer("k-acme")).unwrap_err().status, 403);
        assert_eq!(k.admin(&HeaderMap::new()).unwrap_err().status, 401);
        assert!(
            Keys::default().admin(&HeaderMap::new()).is_ok(),
            "open without keys"
        );
        let acme = keys().set.load().by_name["acme"].as_ref().clone();
        let no_admin = Keys::new(&[acme], AdminAccess::default());
        assert_eq!(no_admin.admin(&bearer("k-acme")).unwrap_err().status, 403);
    }

    /// Issue 35 item 0: with no key at all, reads stay open but changes were open too (any
    /// client could add a worker); now they are refused unless opened to loopback clients.
    #[test]
    fn admin_changes_need_a_key_or_a_loopback_client_that_was_let_in() {
        let local: Option<IpAddr> = Some("127.0.0.1".parse().unwrap());
        let mapped: Option<IpAddr> = Some("::ffff:127.0.0.1".parse().unwrap());
        let remote: Option<IpAddr> = Some("10.1.2.3".parse().unwrap());
        let none = HeaderMap::new();
        let closed = Keys::default();
        assert!(closed.admin(&none).is_ok(), "reads stay open");
        for peer in [local, remote, None] {
            let e = closed.admin_change(&none, peer).unwrap_err();
            assert_eq!(
                (e.status, e.code),
                (StatusCode::FORBIDDEN, Some("admin_closed"))
            );
        }
        let loopback = Keys::new(
            &[],
            AdminAccess {
                key_sha256: None,
                open_on_loopback: true,
            },
        );
        assert!(loopback.admin_change(&none, local).is_ok());
        assert!(loopback.admin_change(&none, mapped).is_ok());
        assert_eq!(
            loopback.admin_change(&none, remote).unwrap_err().status,
            403
        );
        assert_eq!(loopback.admin_change(&none, None).unwrap_err().status, 403);
        // With a key, the key is required from loopback clients too.
        let k = keys();
        assert_eq!(k.admin_change(&none, local).unwrap_err().status, 401);
        assert!(k.admin_change(&bearer("k-admin"), remote).is_ok());
        assert_eq!(
            k.admin_change(&bearer("k-acme"), local).unwrap_err().status,
            403
        );
    }

    #[test]
    fn a_replaced_set_applies_whole_to_the_next_check() {
        let k = keys();
        let bob = k.caller(&bearer("k-bob")).unwrap();
        let carol = TenantConfig {
            name: "carol".into(),
            api_key_sha256: digest("k-carol"),
            models: vec!["*".into()],
            max_concurrency: None,
            shaping: Default::default(),
        };
        k.replace(std::slice::from_ref(&carol), key(digest("k-admin2")));
        assert_eq!(k.caller(&bearer("k-bob")).unwrap_err().status, 401);
        assert_eq!(
            k.caller(&bearer("k-carol")).unwrap().tenant(),
            Some("carol")
        );
        assert!(k.admin(&bearer("k-admin")).is_err());
        assert!(k.admin(&bearer("k-admin2")).is_ok());
        assert!(k.tenant_named("bob").is_none());
        // A caller checked before the reload keeps its tenant.
        assert_eq!(bob.tenant(), Some("bob"));
        k.replace(&[], AdminAccess::default());
        assert!(!k.enabled(), "no key left: open again");
    }

    /// Issue 35 item 4: a client-chosen `request_id` became the response id in the engine's
    /// one store, so another tenant choosing the same id reached the same response.
    #[test]
    fn chosen_response_ids_are_namespaced_per_tenant() {
        let k = keys();
        let acme = k.caller(&bearer("k-acme")).unwrap();
        let bob = k.caller(&bearer("k-bob")).unwrap();
        let a = acme.response_id("resp_chosen");
        assert_ne!(a, "resp_chosen");
        assert_ne!(a, bob.response_id("resp_chosen"));
        assert_eq!(a, acme.response_id("resp_chosen"), "stable for its tenant");
        // Choosing the namespaced id itself leads elsewhere again.
        assert_ne!(bob.response_id(&a), a);
        assert!(a.starts_with("resp_"));
        assert_eq!(Caller::Anonymous.response_id("x"), "x");
    }

    #[test]
    fn salts_are_namespaced_per_tenant() {
        let k = keys();
        let acme = k.caller(&bearer("k-acme")).unwrap();
        let bob = k.caller(&bearer("k-bob")).unwrap();
        assert_ne!(acme.cache_salt(None), bob.cache_salt(None));
        assert_ne!(acme.cache_salt(Some("x")), bob.cache_salt(Some("x")));
        assert_ne!(acme.cache_salt(Some("x")), acme.cache_salt(None));
        assert_eq!(acme.cache_salt(Some("x")), acme.cache_salt(Some("x")));
        // A client cannot reach another tenant's namespace by sending its salt.
        let bob_salt = bob.cache_salt(None).unwrap();
        assert_ne!(acme.cache_salt(Some(&bob_salt)).unwrap(), bob_salt);
        assert_eq!(
            Caller::Anonymous.cache_salt(Some("raw")).as_deref(),
            Some("raw")
        );
    }
}
