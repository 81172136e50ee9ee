//! The dedup engine: idempotent consumption of broker deliveries, backed by a PostgreSQL dedup
//! table and a Redis fast path.
//!
//! A team embeds it in its own service: an [`runtime::Engine`] built on the team's pool runs
//! any number of consumer groups ([`group::Group`]), each on its own queue or topics with the
//! team's handlers by message type — transactional ones in the claim's transaction, leased ones
//! for external effects. The engine's tables live in a schema of their own ([`db`]).
//!
//! This crate holds every SQL statement and every state-transition rule of the product. It has no
//! web code and knows no business domain: the console (`dedup-app`), the REST API and the CLI
//! (`dedup-console`) all call the façade exposed here. The semantics (statuses, leases, claims,
//! operator actions) are the ones fixed in `DESIGN.md`; each module names the rule it
//! implements.
//!
//! Features: `rabbitmq` and `kafka` (both default) pick the brokers compiled in; a
//! RabbitMQ-only service builds without librdkafka. `testing`: fresh databases, queues and
//! topics per test. `http`: HTTP handlers ([`http`]), which call a team's service for each
//! message.

pub mod accounts;
pub mod actions;
pub mod audit;
pub mod console;
pub mod consumer;
pub mod db;
pub mod fastpath;
pub mod group;
pub mod handler;
pub mod health;
#[cfg(feature = "http")]
pub mod http;
pub mod message;
pub mod pipeline;
pub mod record;
pub mod retry;
pub mod runtime;
pub mod service;
pub mod source;
pub mod stats;
pub mod store;
#[cfg(feature = "testing")]
pub mod testing;
pub mod worker;
