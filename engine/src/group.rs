//! A consumer group as a team declares it: a name, where its deliveries come from, its
//! settings, and its handlers by message type. [`crate::runtime::EngineBuilder::group`] takes
//! any number of them; each runs its own workers on its own queue or topics.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::consumer::ConsumerSettings;
use crate::handler::{Handler, HandlerRegistry, LeasedHandler, TransactionalHandler};
use crate::message::{IdPolicy, TypePolicy};
use crate::record::{LateDuplicatePolicy, LeaseExpiryPolicy};
use crate::retry::Backoff;
use crate::source::SourceFactory;

/// A consumer group's settings; every one has a default. Serde names are the configuration
/// keys of a group (`[consumer]` and `[[groups]]` of the `dedup-console` binary).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GroupSettings {
    /// Attempts before a record goes dead. Default 5 (raised to 1).
    pub max_attempts: i32,
    /// Lease of each claim, in ms (raised to 1000). Default 30000.
    pub lease_ms: u64,
    /// Largest part of a poison payload kept on its record, in bytes. Default 65536.
    pub keep_poison_payload_bytes: usize,
    /// Workers, batching, reconnect back-off.
    pub workers: ConsumerSettings,
    /// Retry back-off between attempts.
    pub backoff: Backoff,
    /// Where message ids are found; the payload size limit.
    pub ids: IdPolicy,
    /// Where the message type is found, and how raw values map to handler types.
    pub types: TypePolicy,
    /// What a late duplicate (a copy that returns after cleanup deleted its record) may do:
    /// `process` (default) or `hold`.
    pub late_duplicates: LateDuplicatePolicy,
}

impl Default for GroupSettings {
    fn default() -> Self {
        Self {
            max_attempts: 5,
            lease_ms: 30_000,
            keep_poison_payload_bytes: 64 * 1024,
            workers: ConsumerSettings::default(),
            backoff: Backoff::default(),
            ids: IdPolicy::default(),
            types: TypePolicy::default(),
            late_duplicates: LateDuplicatePolicy::default(),
        }
    }
}

/// Where a group's deliveries come from.
#[derive(Clone)]
pub enum GroupSource {
    /// A RabbitMQ queue (declared at start with its exchange, retry and dead-letter queues).
    #[cfg(feature = "rabbitmq")]
    RabbitMq {
        /// The broker's URL (`amqp://user:password@host:port/vhost`).
        url: String,
        /// Exchange, queue, binding keys, prefetch, dead letters.
        settings: crate::source::rabbitmq::RabbitSettings,
    },
    /// Kafka topics, consumed as a Kafka consumer group (`group_id`, default the group's name).
    #[cfg(feature = "kafka")]
    Kafka(crate::source::kafka::KafkaSettings),
}

impl GroupSource {
    /// What the source reads, for refusing two groups that read the same: a RabbitMQ queue on
    /// one broker (its URL without credentials; the same broker spelt two ways is not caught),
    /// or a Kafka consumer group on one cluster (its `group_id`; the default, the group's own
    /// name, is unique anyway). The first part identifies, the second names it in an error.
    pub(crate) fn reads(&self, group: &str) -> (String, String) {
        #[cfg(not(feature = "kafka"))]
        let _ = group;
        match *self {
            #[cfg(feature = "rabbitmq")]
            GroupSource::RabbitMq { ref url, ref settings } => {
                let broker = url::Url::parse(url).map_or_else(
                    |_| url.clone(),
                    |u| format!("{}:{}{}", u.host_str().unwrap_or_default(), u.port().unwrap_or(5672), u.path()),
                );
                (format!("amqp {broker} {}", settings.queue), format!("RabbitMQ queue {:?}", settings.queue))
            }
            #[cfg(feature = "kafka")]
            GroupSource::Kafka(ref settings) => {
                let id = settings.group_id.as_deref().unwrap_or(group);
                (format!("kafka {} {id}", settings.brokers), format!("Kafka consumer group {id:?}"))
            }
        }
    }

    /// Whether it names a queue or topics to read: the reason when not.
    pub(crate) fn check(&self) -> Result<(), String> {
        // By place, not by reference: without a broker feature the enum is empty, and so is
        // the match.
        match *self {
            #[cfg(feature = "rabbitmq")]
            GroupSource::RabbitMq { ref settings, .. } => settings.check(),
            #[cfg(feature = "kafka")]
            GroupSource::Kafka(ref settings) => settings.check(),
        }
    }
}

/// A consumer group to run: a name, its source (a RabbitMQ queue or Kafka topics), its settings,
/// and its handlers by message type. [`EngineBuilder::group`](crate::EngineBuilder::group) takes
/// any number of them; each runs its own workers.
///
/// ```no_run
/// # use std::time::Duration;
/// # use dedup_engine::prelude::*;
/// # struct PayInvoice; struct SendReceipt;
/// # #[async_trait] impl TransactionalHandler for PayInvoice {
/// #   async fn handle(&self, _: &HandlerInput<'_>, _: &mut sqlx::PgConnection) -> Result<(), HandlerError> { Ok(()) } }
/// # #[async_trait] impl LeasedHandler for SendReceipt {
/// #   async fn handle(&self, _: &HandlerInput<'_>, _: &LeaseGuard) -> Result<(), HandlerError> { Ok(()) } }
/// let billing = Group::rabbitmq(
///     "billing",
///     "amqp://guest:guest@127.0.0.1:5672/%2f",
///     RabbitSettings::for_queue("billing.events", "billing.invoices", ["invoice.#"]),
/// )
/// .types(TypePolicy::from_sources([TypeSource::Header("__TypeId__".into())])
///     .map("com.example.billing.InvoicePaidEvent", "INVOICE.PAID"))
/// .max_attempts(5)
/// .lease(Duration::from_secs(30))
/// .transactional("INVOICE.PAID", PayInvoice)
/// .leased("INVOICE.RECEIPT", SendReceipt, LeaseExpiryPolicy::Hold);
/// ```
#[derive(Clone)]
pub struct Group {
    pub(crate) name: String,
    pub(crate) source: GroupSource,
    pub(crate) settings: GroupSettings,
    pub(crate) handlers: HandlerRegistry,
    /// Message types registered more than once (refused when the engine starts).
    pub(crate) repeated: Vec<String>,
}

/// An HTTP handler of a consumer group as the console shows it (one endpoint card on the
/// overview): what it calls, never its headers or secrets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpEndpoint {
    /// The message type it handles (with the group, the endpoint's identity).
    pub message_type: String,
    /// `POST`, `PUT` or `PATCH`.
    pub method: String,
    /// The URL it calls. Credentials in a URL are refused when the handler is built; a query
    /// string, which may still hold something private, is shown as `?…`.
    pub url: String,
}

impl Group {
    /// A group named `name` reading from `source`, with default settings and no handler yet.
    /// The name is checked when the engine starts (non-empty, at most 128 bytes, no control
    /// characters): it scopes the group's dedup records, so keep it stable.
    pub fn new(name: impl Into<String>, source: GroupSource) -> Self {
        Self {
            name: name.into(),
            source,
            settings: GroupSettings::default(),
            handlers: HandlerRegistry::new(),
            repeated: Vec::new(),
        }
    }

    /// A group on a RabbitMQ queue at `url`.
    #[cfg(feature = "rabbitmq")]
    pub fn rabbitmq(
        name: impl Into<String>,
        url: impl Into<String>,
        settings: crate::source::rabbitmq::RabbitSettings,
    ) -> Self {
        Self::new(name, GroupSource::RabbitMq { url: url.into(), settings })
    }

    /// A group on Kafka topics.
    #[cfg(feature = "kafka")]
    pub fn kafka(name: impl Into<String>, settings: crate::source::kafka::KafkaSettings) -> Self {
        Self::new(name, GroupSource::Kafka(settings))
    }

    /// All settings at once (replaces what the setters below set).
    pub fn settings(mut self, settings: GroupSettings) -> Self {
        self.settings = settings;
        self
    }

    /// Where the message type is found (default: the id's `<entity>.<event>` prefix).
    pub fn types(mut self, types: TypePolicy) -> Self {
        self.settings.types = types;
        self
    }

    /// Where the message id is found.
    pub fn ids(mut self, ids: IdPolicy) -> Self {
        self.settings.ids = ids;
        self
    }

    /// Attempts before a record goes dead (default 5).
    pub fn max_attempts(mut self, attempts: i32) -> Self {
        self.settings.max_attempts = attempts;
        self
    }

    /// Lease of each claim (default 30 s; at least 1 s). Leased handlers must finish within it
    /// or keep their heartbeat going (the engine extends it every third of its length).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.settings.lease_ms = u64::try_from(lease.as_millis()).unwrap_or(u64::MAX);
        self
    }

    /// Workers, batch size, linger, reconnect back-off.
    pub fn workers(mut self, workers: ConsumerSettings) -> Self {
        self.settings.workers = workers;
        self
    }

    /// Retry back-off between attempts.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.settings.backoff = backoff;
        self
    }

    /// Registers a transactional handler for `message_type` (DESIGN.md, "Two handler modes"):
    /// it runs in the claim's transaction, on the host pool's connection. A type registered
    /// twice is refused when the engine starts ([`crate::EngineError::DuplicateHandler`]).
    pub fn transactional(self, message_type: impl Into<String>, handler: impl TransactionalHandler) -> Self {
        self.handler(message_type, Handler::Transactional(Arc::new(handler)))
    }

    /// Registers a transactional handler of database `DB` for `message_type`, as
    /// [`Group::transactional`] does a PostgreSQL one: `group.transactional_on::<sqlx::MySql,
    /// _>("ORDER.PAY", PayOrder)` for `impl TransactionalHandler<sqlx::MySql> for PayOrder`. The
    /// engine refuses to start when `DB` is not the database it runs on
    /// ([`crate::EngineError::HandlerDatabase`]): the pool given to [`crate::Engine::builder`].
    pub fn transactional_on<DB: sqlx::Database, H: TransactionalHandler<DB>>(
        self,
        message_type: impl Into<String>,
        handler: H,
    ) -> Self {
        self.handler(message_type, Handler::transactional_on(handler))
    }

    /// Registers a leased handler for `message_type`: an external effect run under a lease,
    /// completed fenced by the lease token; `on_lease_expiry` says whether an expired lease may
    /// be taken over automatically (`Reclaim`) or waits for an operator (`Hold`, the safe
    /// default for effects that must not run twice).
    pub fn leased(
        self,
        message_type: impl Into<String>,
        handler: impl LeasedHandler,
        on_lease_expiry: LeaseExpiryPolicy,
    ) -> Self {
        self.handler(message_type, Handler::Leased { handler: Arc::new(handler), on_lease_expiry })
    }

    /// Registers an HTTP handler for `message_type` (feature `http`): a leased handler that calls
    /// a team's service, with the handler's own `on_lease_expiry`. The group's lease must be
    /// longer than its timeout (checked when the engine starts).
    #[cfg(feature = "http")]
    pub fn http(mut self, message_type: impl Into<String>, handler: crate::http::HttpHandler) -> Self {
        let message_type = message_type.into();
        self.note_registration(&message_type);
        self.handlers.http(message_type, handler);
        self
    }

    /// Registers any [`Handler`] for `message_type`. A type registered twice (by any of the
    /// registering methods) is refused when the engine starts: one of the two handlers would
    /// silently never run.
    pub(crate) fn handler(mut self, message_type: impl Into<String>, handler: Handler) -> Self {
        let message_type = message_type.into();
        self.note_registration(&message_type);
        self.handlers.register(message_type, handler);
        self
    }

    /// Notes `message_type` as registered twice if it already has a handler (see
    /// [`Group::handler`]).
    fn note_registration(&mut self, message_type: &str) {
        if self.handlers.get(message_type).is_some() {
            self.repeated.push(message_type.to_owned());
        }
    }

    /// Registers every handler of `registry` (a domain crate's set of handlers, say). A type
    /// the group already has a handler for is refused when the engine starts.
    pub fn handlers(mut self, registry: &HandlerRegistry) -> Self {
        for (message_type, _) in registry.iter() {
            self.note_registration(message_type);
        }
        self.handlers.extend(registry);
        self
    }

    /// Opens the group's source factory (no connection is made until a worker or a publisher
    /// asks for one). A RabbitMQ source signs its copies' source headers with a key of its own;
    /// the engine gives its groups the key all its processes share.
    pub fn source_factory(&self) -> Arc<dyn SourceFactory> {
        self.source_factory_keyed(None)
    }

    /// [`Group::source_factory`], RabbitMQ copies signed with `key` when given.
    pub(crate) fn source_factory_keyed(&self, key: Option<&[u8; 32]>) -> Arc<dyn SourceFactory> {
        #[cfg(not(feature = "rabbitmq"))]
        let _ = key;
        match self.source {
            #[cfg(feature = "rabbitmq")]
            GroupSource::RabbitMq { ref url, ref settings } => {
                let connector =
                    crate::source::rabbitmq::RabbitConnector::new(url, settings.clone(), self.settings.backoff.clone());
                match key {
                    Some(key) => Arc::new(connector.with_source_key(crate::source::rabbitmq::SourceKey::new(*key))),
                    None => Arc::new(connector),
                }
            }
            #[cfg(feature = "kafka")]
            GroupSource::Kafka(ref settings) => {
                let id_header = self.settings.ids.header().unwrap_or("x-message-id");
                Arc::new(crate::source::kafka::KafkaConnector::new(
                    settings.clone(),
                    &self.name,
                    self.settings.backoff.clone(),
                    id_header,
                ))
            }
        }
    }
}
