//! A tenant's `cache_salt`, written into the body's bytes as sent ([`crate::proxy::members`]):
//! every top-level `cache_salt` gets the tenant's value in place (duplicates too), or one is
//! added after the opening brace, or — where the engine takes no salt — each is removed; a
//! `cache_salt` nested deeper is content and stays. Nothing else is re-encoded.

use bytes::Bytes;

pub use crate::proxy::members::NotAnObject;
use crate::proxy::members::{self, Edit};

/// The body with its top-level `cache_salt` set to `salt` (or removed, for `None`); the same
/// bytes, not copied, when nothing changes.
pub fn with_cache_salt(body: &Bytes, salt: Option<&str>) -> Result<Bytes, NotAnObject> {
    let encoded = salt.map(|s| serde_json::Value::String(s.to_owned()).to_string());
    let edit = match &encoded {
        Some(s) => Edit::Set(s.as_bytes()),
        None => Edit::Remove,
    };
    members::edit(body, &[("cache_salt", edit)])
}

#[cfg(test)]
#[path = "cache_salt_tests.rs"]
mod tests;
