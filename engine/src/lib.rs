//! Idempotent consumption of RabbitMQ and Kafka deliveries: every `(consumer group, message id)`
//! gets one dedup record in PostgreSQL, written in the same transaction as the business change
//! (or under a lease, for external effects), acked only after the commit, with a Redis marker as
//! a fast path in front. Retries are bounded, exhausted messages become dead letters, old
//! records are cleaned up. The semantics (statuses, leases, claims, operator actions) are fixed
//! in the repository's `docs/DESIGN.md`.
//!
//! # Embedding it
//!
//! Build an [`Engine`] on your service's own pool, declare its consumer groups ([`Group`]: a
//! RabbitMQ queue or Kafka topics each, where a message's id and type are found, attempts,
//! lease), register handlers by message type, start it, and stop it on shutdown:
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use dedup_engine::prelude::*;
//! use dedup_engine::sqlx::{self, PgConnection};
//!
//! /// `INVOICE.PAID`: runs in the claim's transaction; the record and the change commit together.
//! struct PayInvoice;
//!
//! #[async_trait]
//! impl TransactionalHandler for PayInvoice {
//!     async fn handle(&self, input: &HandlerInput<'_>, tx: &mut PgConnection) -> Result<(), HandlerError> {
//!         sqlx::query("UPDATE invoices SET status = 'PAID' WHERE invoice_no = $1 AND status = 'OPEN'")
//!             .bind(input.str_field("invoiceNo")?)
//!             .execute(&mut *tx)
//!             .await?; // a database error is retried
//!         Ok(())
//!     }
//! }
//!
//! /// `INVOICE.RECEIPT`: an external effect, run under a lease.
//! struct SendReceipt;
//!
//! #[async_trait]
//! impl LeasedHandler for SendReceipt {
//!     async fn handle(&self, input: &HandlerInput<'_>, lease: &LeaseGuard) -> Result<(), HandlerError> {
//!         let to = input.str_field("email")?;
//!         lease.check()?; // lost (taken over, or this worker was frozen): do nothing
//!         // send the mail to `to`, with `input.message_id` as its idempotency key …
//!         # let _ = to;
//!         Ok(())
//!     }
//! }
//!
//! # async fn run(pool: sqlx::PgPool) -> anyhow::Result<()> {
//! let billing = Group::rabbitmq(
//!     "billing",
//!     "amqp://guest:guest@127.0.0.1:5672/%2f",
//!     RabbitSettings::for_queue("billing.events", "billing.invoices", ["invoice.#"]),
//! )
//! .lease(Duration::from_secs(30))
//! .transactional("INVOICE.PAID", PayInvoice)
//! .leased("INVOICE.RECEIPT", SendReceipt, LeaseExpiryPolicy::Hold);
//!
//! let engine = Engine::builder(pool) // your pool: your tables and the engine's, one database
//!     .redis("redis://127.0.0.1:6379")
//!     .group(billing)
//!     .start() // migrates the engine's schema, starts the workers
//!     .await?;
//! // … serve your application; on shutdown:
//! engine.stop().await; // in-flight batches finish and are acked
//! # Ok(()) }
//! ```
//!
//! # The API
//!
//! - **Running it**: [`Engine`] ([`Engine::builder`] → [`EngineBuilder`] → [`EngineBuilder::start`]),
//!   [`EngineHandle`] (the engine's pool, each group's health), [`EngineError`].
//! - **Consumer groups**: [`Group`] with [`GroupSettings`] (workers: [`ConsumerSettings`], retries:
//!   [`Backoff`]); its source is a RabbitMQ queue ([`rabbitmq::RabbitSettings`][rabbit-settings], feature `rabbitmq`)
//!   or Kafka topics ([`kafka::KafkaSettings`][kafka-settings], feature `kafka`).
//! - **Handlers** (DESIGN.md, "Two handler modes"): [`TransactionalHandler`] runs in the claim's
//!   transaction; [`LeasedHandler`] runs an external effect under a [`LeaseGuard`], and
//!   [`LeaseExpiryPolicy`] says what a redelivery of its stuck record may do. Both get a
//!   [`HandlerInput`] and fail with a [`HandlerError`] (retryable or permanent). A
//!   transactional handler that updates shared rows (a card's balance, a SKU's stock) names
//!   them in [`TransactionalHandler::lock_key`], or concurrent batches deadlock.
//! - **Message ids and types**: [`IdPolicy`] (where the id is found), [`TypePolicy`] and
//!   [`TypeSource`] (where the type is found, and how raw values map to your handler types),
//!   [`MessageId`].
//! - **The database**: [`connect`] (with [`PoolSettings`]) if you have no pool yet; the engine's
//!   tables live in a [`Schema`] of their own (default `dedup`) with their own migration history;
//!   [`migrate_schema`] applies *your* migrations the same way in a schema of yours.
//! - **Health**: [`HealthProbes`] (PostgreSQL, Redis, the broker) → [`HealthReport`];
//!   [`EngineHandle::groups_health`] → [`GroupHealth`] (a group whose broker refuses its
//!   topology, or whose batches are given back unjudged, is not ready; [`FailedBatches`] says
//!   since when, and when it resumed).
//! - **Publishing** to a group's broker (producers, tools): [`Group::source_factory`] →
//!   [`SourceFactory::open_publisher`] → [`Publish`] with an [`Outbound`] message (example
//!   below); [`rabbitmq::Publisher`][rabbit-publisher] for AMQP properties of your own.
//! - [`prelude`]: `use dedup_engine::prelude::*;` brings the names of the example above.
//!
//! # Publishing a message
//!
//! A producer of your own (a test, a tool, a service beside the consumer) publishes where a
//! group reads, with the message id the group's [`IdPolicy`] looks for (by default the AMQP
//! `message_id` property, Kafka's `x-message-id` header). [`Publish::publish`] returns once the
//! broker confirmed the message; publishing the same id twice is a producer's retry, and the
//! consumer runs its handler once:
//!
//! ```no_run
//! use dedup_engine::{Group, Outbound, rabbitmq::RabbitSettings};
//!
//! # async fn publish() -> anyhow::Result<()> {
//! let billing = Group::rabbitmq(
//!     "billing",
//!     "amqp://guest:guest@127.0.0.1:5672/%2f",
//!     RabbitSettings::for_queue("billing.events", "billing.invoices", ["invoice.#"]),
//! );
//! let factory = billing.source_factory(); // connects when a publisher or worker asks
//! let publisher = factory.open_publisher().await?;
//! let headers = serde_json::Map::new(); // broker headers, as JSON values
//! publisher
//!     .publish(Outbound {
//!         destination: &factory.destination(), // the group's exchange (Kafka: its first topic)
//!         routing_key: "invoice.paid",         // RabbitMQ; Kafka ignores it
//!         key: None,                           // Kafka's record key; RabbitMQ ignores it
//!         message_id: Some("INVOICE.PAID.INV-1001:1"), // the default TypePolicy: type INVOICE.PAID
//!         payload: br#"{"invoiceNo":"INV-1001"}"#,
//!         headers: &headers,
//!         content_type: Some("application/json"),
//!         type_property: None,                 // the AMQP `type`, for a TypePolicy that reads it
//!     })
//!     .await?; // confirmed by the broker; unroutable (no queue bound yet) is an error: the
//!               // engine declares the group's exchange and queues when it starts, so start it once first
//! publisher.close().await;
//! factory.close().await;
//! # Ok(()) }
//! ```
//!
//! # Crates in the API
//!
//! The API takes and returns types of a few crates; a host must use the same major versions, or
//! the re-exports: [`sqlx`] 0.8 (`PgPool`, `PgConnection`, `Migrator`; PostgreSQL, tokio
//! runtime), [`async_trait`](macro@async_trait) 0.1 (the handler traits), `serde_json` 1 ([`HandlerInput::json`],
//! headers), `chrono` 0.4 ([`HealthReport::checked_at`]). The engine runs on the host's tokio 1
//! runtime and installs nothing global: it logs through the host's `tracing` subscriber and
//! counts `dedup_*` metrics in whatever `metrics` recorder the host installs.
//!
//! # Features
//!
//! `rabbitmq` and `kafka` (both default) pick the brokers compiled in; a RabbitMQ-only service
//! builds without librdkafka (`default-features = false, features = ["rabbitmq"]`). `http`:
//! HTTP handlers (the `http` module), which call a team's service for each message. `testing`:
//! fresh databases, queues and topics per test (the `testing` module); it also opens the engine's
//! internal modules to the engine's own tests (hidden; not an API).
//!
//! # Not part of the API
//!
//! [`console`] holds what the dedup console crates (`dedup-app`, the `dedup-console` binary)
//! need of the engine: its queries, operator actions, accounts and audit log. It follows those
//! crates, not semantic versioning; hosts mount the console through `dedup-app` instead.
//! `engine/public-api.txt` lists every public path; `engine/tests/public_api.rs` fails when it
//! changes by accident.
// Links to a broker feature's items: to "Features" in a build without it.
#![doc = ""]
#![cfg_attr(feature = "kafka", doc = "[kafka-settings]: kafka::KafkaSettings")]
#![cfg_attr(not(feature = "kafka"), doc = "[kafka-settings]: crate#features")]
#![cfg_attr(feature = "rabbitmq", doc = "[rabbit-settings]: rabbitmq::RabbitSettings")]
#![cfg_attr(not(feature = "rabbitmq"), doc = "[rabbit-settings]: crate#features")]
#![cfg_attr(feature = "rabbitmq", doc = "[rabbit-publisher]: rabbitmq::Publisher")]
#![cfg_attr(not(feature = "rabbitmq"), doc = "[rabbit-publisher]: crate#features")]

/// Declares the engine's internal modules: private, so their `pub` items are visible in the
/// crate only (and unused ones are dead code), except that the `testing` feature opens them,
/// hidden, to the engine's own integration tests and benchmarks.
macro_rules! internal {
    ($($module:ident),* $(,)?) => {$(
        #[cfg(feature = "testing")]
        #[doc(hidden)]
        pub mod $module;
        #[cfg(not(feature = "testing"))]
        mod $module;
    )*};
}

internal!(
    accounts, actions, audit, consumer, db, fastpath, group, handler, health, instances, message, pause, pipeline,
    record, retry, runtime, source, stats, store,
);
#[cfg(feature = "http")]
pub mod http;
mod service;
mod worker;

pub mod console;
pub mod prelude;
#[cfg(feature = "testing")]
pub mod testing;

pub use async_trait::async_trait;
pub use sqlx;

pub use consumer::{ConsumerSettings, FailedBatches};
pub use db::{PoolSettings, Schema, SchemaError, SchemaNameError};
pub use fastpath::FastPathSettings;
pub use group::{Group, GroupSettings, GroupSource};
pub use handler::{
    AnyTransactionalHandler, EffectAnswer, Handler, HandlerError, HandlerInput, HandlerRegistry, LeaseGuard,
    LeasedHandler, MAX_ERROR_CLASS_CHARS, TransactionalHandler,
};
pub use health::{DependencyHealth, GroupHealth, HealthProbes, HealthReport};
pub use message::{
    Broker, IdPolicy, IdSource, IdSourceKind, Identified, InboundMessage, MAX_HEADER_DEPTH, MAX_SHOWN_ID_CHARS,
    POISON_TYPE, Poison, PoisonReason, SourceRef, TypePolicy, TypeSource, UNKNOWN_TYPE, UnknownIdSource,
    UnknownTypeSource,
};
pub use record::{ConsumerGroup, IdError, LateDuplicatePolicy, LeaseExpiryPolicy, MAX_MESSAGE_ID_BYTES, MessageId};
pub use retry::Backoff;
pub use runtime::{Engine, EngineBuilder, EngineError, EngineHandle, EnginePool};
pub use service::{Service, Unreachable};
pub use source::{DEAD_LETTER_REASON_HEADER, Outbound, Publish, PublishFailed, SourceError, SourceFactory};
pub use store::ConnectError;
pub use store::postgres::{connect, migrate, migrate_schema};

/// RabbitMQ (feature `rabbitmq`): a group's queue and topology, the connector, and a
/// confirm-mode publisher.
#[cfg(feature = "rabbitmq")]
pub mod rabbitmq {
    pub use crate::source::rabbitmq::{
        ExchangeType, PublishError, Publisher, RabbitConnector, RabbitSettings, Topology, properties_for,
    };
}

/// MySQL 8 / MariaDB 10.11 (feature `mysql`): the pool an engine runs on
/// (`Engine::builder(mysql_pool)`; docs/DESIGN.md, "An engine on MySQL").
#[cfg(feature = "mysql")]
pub mod mysql {
    pub use crate::store::mysql::{connect_url as connect, migrate, migrate_engine};
}

/// Kafka (feature `kafka`): a group's topics and consumer group, and the connector.
#[cfg(feature = "kafka")]
pub mod kafka {
    pub use crate::source::kafka::{KafkaConnector, KafkaSettings};
}
