//! Whose blocks a request's are: the seed its prompt's block hashes chain from.
//!
//! One function for every caller that hashes a request (the server's analysis and trail, the
//! simulator), so a request for a LoRA adapter or from a tenant finds exactly the blocks that
//! requests like it stored, however it was routed. `tests/it/routing_parity.rs` holds the
//! server and the simulator to it.

use sha2::{Digest, Sha256};

use crate::tokens::HashSeed;
use crate::tokens::model::{adapter_name, hash_seed};

/// The seed of a request for `model` with the cache salt the engine gets (`cache_salt`, the
/// tenant's namespaced one, see [`tenant_salt`]); `base` is the base model when `model` is a
/// LoRA adapter running on it. An adapter's prompts are the base model's tokens hashed with the
/// adapter's name, as the engine's KV events name the adapter's blocks (base model plus
/// `lora_name`), so a request finds its adapter's blocks and never the base model's.
pub fn request_seed(model: &str, base: Option<&str>, cache_salt: Option<&str>) -> HashSeed {
    match base {
        Some(base) => hash_seed(base, Some(adapter_name(model, base)), cache_salt),
        None => hash_seed(model, None, cache_salt),
    }
}

/// The cache salt of a tenant's request: the client's own salt (if any) namespaced under the
/// tenant, whose key digest is `key_sha256`. Derived from the key digest and the name, so
/// tenants never share index entries (nor, with the salt forwarded, KV cache), and a client
/// cannot choose another tenant's salt by sending it.
pub fn tenant_salt(key_sha256: &[u8; 32], tenant: &str, client_salt: Option<&str>) -> String {
    let mut h = Sha256::new();
    h.update(b"kvroute-cache-salt\0");
    h.update(key_sha256);
    h.update(tenant.as_bytes());
    h.update([0]);
    if let Some(s) = client_salt {
        h.update([1]);
        h.update(s.as_bytes());
    }
    let d = h.finalize();
    d[..16].iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adapters_and_salts_seed_apart() {
        let base = request_seed("m", None, None);
        assert_eq!(base, HashSeed::new("m", None, None));
        // SGLang's `BASE:ADAPTER` form and vLLM's adapter name are the same adapter.
        assert_eq!(
            request_seed("m:sql", Some("m"), None),
            request_seed("sql", Some("m"), None)
        );
        assert_ne!(request_seed("sql", Some("m"), None), base);
        assert_ne!(request_seed("m", None, Some("s")), base);
        // An empty salt is the unsalted cache, as the engine treats it.
        assert_eq!(request_seed("m", None, Some("")), base);
        let key = [7u8; 32];
        let a = tenant_salt(&key, "a", None);
        assert_eq!(a.len(), 32);
        assert_ne!(a, tenant_salt(&key, "b", None));
        assert_ne!(a, tenant_salt(&key, "a", Some("x")));
        assert_ne!(a, tenant_salt(&[8u8; 32], "a", None));
    }
}
