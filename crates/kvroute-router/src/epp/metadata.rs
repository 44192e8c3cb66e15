//! What a gateway tells the picker beside the HTTP message: the request's headers (pseudo
//! headers included), the subset of endpoints it allows (`envoy.lb.subset_hint`) and, in the
//! response phase, the endpoint that served (`envoy.lb` → `x-gateway-destination-endpoint-served`).
//! Pure: parsing only.

use envoy_types::pb::envoy::config::core::v3::{HeaderMap as EnvoyHeaders, Metadata};
use envoy_types::pb::google::protobuf::{Struct, value::Kind};
use http::{HeaderMap, HeaderName, HeaderValue};

use super::protocol::{DESTINATION_SERVED, LB_NAMESPACE, SUBSET_KEY, SUBSET_NAMESPACE};

/// A request's or response's headers as the gateway sent them: the pseudo headers apart
/// (`:method`, `:path`, `:status`), the rest as an HTTP header map. A header whose name or
/// value is not valid HTTP is left out (a gateway never sends one; nothing routes on it).
#[derive(Debug, Default)]
pub struct Headers {
    /// `:method`.
    pub method: Option<String>,
    /// `:path` (with its query).
    pub path: Option<String>,
    /// `:status` (the response phase).
    pub status: Option<u16>,
    /// Every other header.
    pub map: HeaderMap,
}

impl Headers {
    /// Reads Envoy's header list (a value is in `raw_value`, or in `value` from older gateways).
    pub fn of(headers: Option<&EnvoyHeaders>) -> Headers {
        let mut out = Headers::default();
        for h in headers.map(|h| h.headers.as_slice()).unwrap_or_default() {
            let value: &[u8] = if h.raw_value.is_empty() {
                h.value.as_bytes()
            } else {
                &h.raw_value
            };
            match h.key.as_str() {
                ":method" => out.method = std::str::from_utf8(value).ok().map(str::to_owned),
                ":path" => out.path = std::str::from_utf8(value).ok().map(str::to_owned),
                ":status" => {
                    out.status = std::str::from_utf8(value).ok().and_then(|s| s.parse().ok())
                }
                k if k.starts_with(':') => {}
                k => {
                    if let (Ok(name), Ok(v)) = (
                        HeaderName::from_bytes(k.as_bytes()),
                        HeaderValue::from_bytes(value),
                    ) {
                        out.map.append(name, v);
                    }
                }
            }
        }
        out
    }
}

/// The endpoints the gateway allows for this request: `None` without a hint (any endpoint of
/// the pool), else the listed `ip:port`s or bare `ip`s (any port of that address) — possibly
/// none, which no endpoint satisfies. A list entry may itself be comma-separated.
pub fn subset(metadata: Option<&Metadata>) -> Option<Vec<String>> {
    let hint = metadata?.filter_metadata.get(SUBSET_NAMESPACE)?;
    let value = hint.fields.get(SUBSET_KEY)?;
    let mut out = Vec::new();
    match &value.kind {
        Some(Kind::StringValue(s)) => split_into(s, &mut out),
        Some(Kind::ListValue(list)) => {
            for v in &list.values {
                if let Some(Kind::StringValue(s)) = &v.kind {
                    split_into(s, &mut out);
                }
            }
        }
        _ => {}
    }
    Some(out)
}

fn split_into(s: &str, out: &mut Vec<String>) {
    out.extend(
        s.split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(str::to_owned),
    );
}

/// Whether `endpoint` (`host:port`) is in `allowed` (entries `host:port`, or a bare host for
/// any of its ports).
pub fn allows(allowed: &[String], endpoint: &str) -> bool {
    let host = endpoint.rsplit_once(':').map_or(endpoint, |(h, _)| h);
    allowed.iter().any(|a| a == endpoint || a == host)
}

/// The endpoint that served, as the gateway reports it in the response phase.
pub fn served(metadata: Option<&Metadata>) -> Option<String> {
    let lb: &Struct = metadata?.filter_metadata.get(LB_NAMESPACE)?;
    match &lb.fields.get(DESTINATION_SERVED)?.kind {
        Some(Kind::StringValue(s)) => Some(s.trim().to_owned()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::google::protobuf::{ListValue, Value};

    fn string(s: &str) -> Value {
        Value {
            kind: Some(Kind::StringValue(s.into())),
        }
    }

    fn metadata(namespace: &str, key: &str, value: Value) -> Metadata {
        let inner = Struct {
            fields: [(key.to_owned(), value)].into(),
        };
        Metadata {
            filter_metadata: [(namespace.to_owned(), inner)].into(),
            ..Metadata::default()
        }
    }

    #[test]
    fn the_subset_hint_is_a_list_or_a_comma_separated_string_and_may_name_a_bare_host() {
        assert_eq!(subset(None), None);
        let list = Value {
            kind: Some(Kind::ListValue(ListValue {
                values: vec![string("10.0.0.1:8000"), string("10.0.0.2:8000, 10.0.0.3")],
            })),
        };
        let allowed = subset(Some(&metadata(SUBSET_NAMESPACE, SUBSET_KEY, list))).unwrap();
        assert_eq!(allowed, ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3"]);
        assert!(allows(&allowed, "10.0.0.1:8000"));
        assert!(!allows(&allowed, "10.0.0.1:8001"));
        assert!(allows(&allowed, "10.0.0.3:9999"));
        let empty = subset(Some(&metadata(SUBSET_NAMESPACE, SUBSET_KEY, string(""))));
        assert_eq!(empty, Some(vec![]), "an empty hint allows nothing");
    }

    #[test]
    fn the_served_endpoint_is_read_from_envoy_lb() {
        let m = metadata(LB_NAMESPACE, DESTINATION_SERVED, string("10.0.0.9:8000"));
        assert_eq!(served(Some(&m)).as_deref(), Some("10.0.0.9:8000"));
        let other = metadata(SUBSET_NAMESPACE, DESTINATION_SERVED, string("x"));
        assert_eq!(served(Some(&other)), None);
    }
}
