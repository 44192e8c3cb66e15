//! The hop header: how a router recognises a request it has already forwarded.
//!
//! A worker URL that leads back to the router (its own address under another name, a second
//! router whose worker is the first, a gateway in front of both) makes every request recurse
//! until some limit is hit: each pass holds a connection and an admission slot. So each router
//! process picks a random id at start and appends it to the `x-kvroute-via` header of every
//! request it forwards; a request that arrives carrying its own id has gone round a loop and
//! is refused (508 Loop Detected) instead of being forwarded again. Ids of other routers are
//! kept and passed on, so a chain of distinct routers works and any loop among them stops at
//! the first router it revisits.

use http::{HeaderMap, HeaderName, HeaderValue};

/// The header that lists the routers a request went through.
pub const VIA_HEADER: HeaderName = HeaderName::from_static("x-kvroute-via");

/// This router's id in the hop header.
#[derive(Clone, Debug)]
pub struct HopId(HeaderValue);

impl HopId {
    /// A fresh random id (64 bits, hex).
    pub fn random() -> HopId {
        let id = format!("{:016x}", rand::random::<u64>());
        HopId(HeaderValue::from_str(&id).unwrap_or(HeaderValue::from_static("kvroute")))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        self.0.to_str().unwrap_or("")
    }

    /// Whether `headers` say the request already went through this router.
    pub fn seen_in(&self, headers: &HeaderMap) -> bool {
        let me = self.0.as_bytes();
        headers.get_all(VIA_HEADER).iter().any(|v| {
            v.as_bytes()
                .split(|b| *b == b',')
                .any(|id| id.trim_ascii() == me)
        })
    }

    /// Adds this router to the hop header of a request about to be forwarded.
    pub fn stamp(&self, headers: &mut HeaderMap) {
        headers.append(VIA_HEADER, self.0.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_router_sees_its_own_id_among_others() {
        let (me, other) = (HopId::random(), HopId::random());
        assert_ne!(me.as_str(), other.as_str());
        let mut h = HeaderMap::new();
        assert!(!me.seen_in(&h));
        other.stamp(&mut h);
        assert!(!me.seen_in(&h));
        me.stamp(&mut h);
        assert!(me.seen_in(&h) && other.seen_in(&h));
        // Intermediaries may fold repeated headers into one comma-separated line.
        let mut folded = HeaderMap::new();
        folded.insert(
            VIA_HEADER,
            format!("{}, {}", other.as_str(), me.as_str())
                .parse()
                .unwrap(),
        );
        assert!(me.seen_in(&folded));
        folded.insert(VIA_HEADER, format!("x{}", me.as_str()).parse().unwrap());
        assert!(!me.seen_in(&folded), "a prefix is not the id");
    }
}
