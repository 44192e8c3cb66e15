//! kvroute's transport-free core: what a routing decision is made of, with no socket, server,
//! client or exporter in it.
//!
//! - [`openai`]: a request body read into what routing needs, and the OpenAI error shape.
//! - [`tokens`]: tokenizers, chat templates and kvroute's chained block hashes.
//! - [`kv_events`]: the engines' KV-cache event wire types, decoding and encoding.
//! - [`index`]: who holds which block (exact and approximate), and the overlap lookup.
//! - [`fleet`]: the workers' domain — identity, ranks, roles, loads, breakers.
//! - [`policy`]: how a target is chosen from the candidates' overlaps and loads.
//! - [`routing`]: one request's decisions on the shared core (eligibility, plans, sessions).
//!
//! The router (`kvroute`) re-exports these modules and adds the I/O around them; see
//! `ARCHITECTURE.md`, "The crates".

pub mod fleet;
pub mod index;
pub mod kv_events;
pub mod openai;
pub mod policy;
pub mod routing;
pub mod tokens;
