//! The dedup engine: idempotent consumption of broker deliveries, backed by a PostgreSQL dedup
//! table and a Redis fast path.
//!
//! This crate holds every SQL statement and every state-transition rule of the product. It has no
//! web code: the console (`dedup-app`), the REST API and the CLI (`dedup-console`) all call the
//! façade exposed here. The semantics (statuses, leases, claims, operator actions) are the ones
//! fixed in `DESIGN.md`; each module names the rule it implements.

pub mod accounts;
pub mod actions;
pub mod audit;
pub mod console;
pub mod consumer;
pub mod db;
pub mod fastpath;
pub mod handler;
pub mod health;
pub mod message;
pub mod orders;
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
