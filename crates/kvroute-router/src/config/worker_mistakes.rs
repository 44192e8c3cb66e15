//! Worker descriptions that parse but cannot work, each a mistake a newcomer makes by copying
//! the engine's own flags (issue 34): refused with the fix, since accepting them served
//! without KV events (or under a model nobody asks for) and said nothing.
//!
//! - An events or replay endpoint on the wildcard host `*` (`tcp://*:5557`) is the engine's
//!   *bind* address: the router connects, and ZeroMQ cannot connect to `*`.
//! - The events endpoint equal to the replay endpoint: one socket cannot be both the PUB the
//!   engine publishes on and the ROUTER it answers replays on.
//! - A model name ending in `@` and a port (`m@5557`): an endpoint written without its
//!   `tcp://HOST:` prefix, which the `--worker` syntax read as part of the model name.

/// The `--worker` syntax, for help texts and errors (here, beside the mistakes it names, so
/// `workers` only imports from this file).
pub const WORKER_FLAG_SYNTAX: &str = "URL[=MODEL,…][@EVENTS_ENDPOINT[@REPLAY_ENDPOINT]]";

/// A mistake: the field at fault and what to write instead.
pub(super) type Mistake = (&'static str, String);

/// The first of the mistakes above in a worker's models and endpoints.
pub(super) fn find(
    models: &[String],
    kv_events: Option<&str>,
    kv_replay: Option<&str>,
) -> Option<Mistake> {
    for (field, ep) in [("kv_events", kv_events), ("kv_replay", kv_replay)] {
        if let Some(ep) = ep
            && let Some(m) = wildcard_host(field, ep)
        {
            return Some(m);
        }
    }
    if let (Some(events), Some(replay)) = (kv_events, kv_replay)
        && events == replay
    {
        return Some((
            "kv_replay",
            format!(
                "`{replay}` is also the events endpoint; the engine publishes events on one \
                 port (vLLM `endpoint`) and answers replays on another (`replay_endpoint`): \
                 give each its own, e.g. tcp://HOST:5557 and tcp://HOST:5558"
            ),
        ));
    }
    models.iter().find_map(|m| port_suffix(m))
}

/// `tcp://*:PORT`: the engine's bind address, not one the router can connect to.
fn wildcard_host(field: &'static str, endpoint: &str) -> Option<Mistake> {
    let port = endpoint.strip_prefix("tcp://")?.strip_prefix("*:")?;
    Some((
        field,
        format!(
            "`{endpoint}` is the engine's bind address (it listens on every interface); the \
             router connects to it, so give the engine's host: `tcp://HOST:{port}` (e.g. \
             tcp://10.0.0.5:{port})"
        ),
    ))
}

/// A model name such as `m@5557`: an endpoint's port without `tcp://HOST:`.
fn port_suffix(model: &str) -> Option<Mistake> {
    let (name, port) = model.rsplit_once('@')?;
    if port.is_empty() || !port.chars().all(|c| c.is_ascii_digit()) || port.parse::<u16>().is_err()
    {
        return None;
    }
    Some((
        "models",
        format!(
            "model `{model}` ends in `@{port}`, which looks like a KV-event port written \
             without its host: an endpoint is a whole ZeroMQ address, so write \
             `{name}@tcp://HOST:{port}` ({WORKER_FLAG_SYNTAX})"
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn models(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_engines_bind_address_is_refused_with_the_host_to_use() {
        let (field, message) = find(&[], Some("tcp://*:5557"), None).unwrap();
        assert_eq!(field, "kv_events");
        assert!(message.contains("tcp://HOST:5557"), "{message}");
        let (field, _) = find(&[], Some("tcp://h:5557"), Some("tcp://*:5558")).unwrap();
        assert_eq!(field, "kv_replay");
        assert_eq!(find(&[], Some("tcp://h:5557"), Some("tcp://h:5558")), None);
    }

    #[test]
    fn events_and_replay_on_one_endpoint_are_refused() {
        let (field, message) = find(&[], Some("tcp://h:5557"), Some("tcp://h:5557")).unwrap();
        assert_eq!(field, "kv_replay");
        assert!(message.contains("its own"), "{message}");
    }

    #[test]
    fn a_port_in_a_model_name_is_refused() {
        let (field, message) = find(&models(&["m@5557"]), None, None).unwrap();
        assert_eq!(field, "models");
        assert!(message.contains("m@tcp://HOST:5557"), "{message}");
        // Versions and other `@` in names stay valid.
        for ok in ["org@v2", "m@", "m@99999", "a@b@c", "llama-3"] {
            assert_eq!(find(&models(&[ok]), None, None), None, "{ok}");
        }
    }
}
