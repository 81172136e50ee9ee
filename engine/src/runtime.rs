//! The engine as a running service: a team's consumer groups, the fast path, the aggregate
//! flusher and the bulk-requeue and cleanup schedulers, started together and stopped together.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::actions::cleanup::late::RetentionWatch;
use crate::actions::republish::Publishers;
use crate::consumer::ConsumerStatus;
use crate::db::Schema;
use crate::fastpath::{FastPath, FastPathSettings};
use crate::group::{Group, HttpEndpoint};
use crate::health::GroupHealth;
use crate::instances::{Beat, Instance};
use crate::message::Broker;
use crate::record::ConsumerGroup;
use crate::source::SourceFactory;
use crate::store::PipelineStore;
use books::RuntimeBooks;

pub(crate) mod books;
mod errors;
mod pool;
mod start;
pub use errors::EngineError;
pub(crate) use pool::DatabasePool;
pub use pool::EnginePool;

/// Builds an [`Engine`]: see [`Engine::builder`].
#[must_use = "an engine builder does nothing until `start` is called"]
pub struct EngineBuilder {
    pool: EnginePool,
    /// The engine's schema (on MySQL a database), as each database's start readies it.
    pub(crate) schema: Schema,
    redis_url: String,
    fast_path: FastPathSettings,
    stats_flush: Duration,
    /// Most connections of the engine's pool, as each database's start opens it.
    pub(crate) pool_size: u32,
    consume: bool,
    groups: Vec<Group>,
}

impl EngineBuilder {
    /// The schema of the engine's tables (default `dedup`); on MySQL a database, never the one
    /// the team's pool connects to (`EngineError::EngineDatabaseIsTheTeams`).
    pub fn schema(mut self, schema: Schema) -> Self {
        self.schema = schema;
        self
    }

    /// Redis of the fast path (default `redis://127.0.0.1:6379`). Redis is a hint: when it is
    /// down every lookup falls through to the database.
    pub fn redis(mut self, url: impl Into<String>) -> Self {
        self.redis_url = url.into();
        self
    }

    /// Marker prefix, lifetime and timeouts of the fast path.
    pub fn fast_path(mut self, settings: FastPathSettings) -> Self {
        self.fast_path = settings;
        self
    }

    /// How often the in-memory aggregates are written to the database (default 1 s).
    pub fn stats_flush(mut self, every: Duration) -> Self {
        self.stats_flush = every;
        self
    }

    /// Most connections of the engine's own pool (default 8): the console's queries, operator
    /// actions, aggregates, schedulers. Transactional batches use the host pool.
    pub fn pool_size(mut self, connections: u32) -> Self {
        self.pool_size = connections;
        self
    }

    /// Whether the groups' workers consume (default true). Off, the engine still serves the
    /// console, operator actions and schedulers, and publishes requeues through the groups'
    /// brokers.
    pub fn consume(mut self, consume: bool) -> Self {
        self.consume = consume;
        self
    }

    /// Adds a consumer group.
    pub fn group(mut self, group: Group) -> Self {
        self.groups.push(group);
        self
    }

    /// Migrates the engine's schema ([`EnginePool::open_engine_pool`]; on MySQL its database),
    /// then starts every group's workers and the background tasks (aggregate flusher, heartbeat,
    /// the bulk-requeue runners, the cleanup scheduler). Does not wait for the brokers or Redis: workers connect and reconnect
    /// in the background.
    ///
    /// Errors: [`EngineError`]: an invalid or repeated group name, two groups reading one queue,
    /// a message type with two handlers, a lease shorter than a handler's longest run, a
    /// transactional handler of another database than the engine's, a MySQL pool whose
    /// connections are not `READ COMMITTED` in UTC, a failed migration.
    pub async fn start(mut self) -> Result<Engine, EngineError> {
        let engine_database = self.pool.database();
        let mut names = HashSet::new();
        let mut sources = HashMap::new();
        let mut groups = Vec::with_capacity(self.groups.len());
        for group in std::mem::take(&mut self.groups) {
            let name = ConsumerGroup::parse(group.name.clone())
                .map_err(|error| EngineError::GroupName { name: group.name.clone(), error })?;
            if !names.insert(name.clone()) {
                return Err(EngineError::DuplicateGroup(group.name));
            }
            let (reads, source_name) = group.source.reads(&group.name);
            if let Some(first) = sources.insert(reads, group.name.clone()) {
                return Err(EngineError::SharedSource { first, second: group.name, source_name });
            }
            if let Some(message_type) = group.repeated.first() {
                return Err(EngineError::DuplicateHandler { name: group.name, message_type: message_type.clone() });
            }
            group.source.check().map_err(|error| EngineError::GroupSource { name: group.name.clone(), error })?;
            let lease = Duration::from_millis(group.settings.lease_ms).max(crate::store::MIN_LEASE);
            for (message_type, handler) in group.handlers.iter() {
                if let Some(handler_database) = handler.database().filter(|db| *db != engine_database) {
                    return Err(EngineError::HandlerDatabase {
                        name: group.name.clone(),
                        message_type: message_type.to_owned(),
                        handler_database,
                        engine_database,
                    });
                }
                if let Some(longest) = handler.longest_run().filter(|longest| *longest >= lease) {
                    return Err(EngineError::LeaseTooShort {
                        name: group.name.clone(),
                        message_type: message_type.to_owned(),
                        lease_ms: u64::try_from(lease.as_millis()).unwrap_or(u64::MAX),
                        longest_ms: u64::try_from(longest.as_millis()).unwrap_or(u64::MAX),
                    });
                }
            }
            if group.handlers.is_empty() {
                tracing::warn!(group = %name, "consumer group without handlers: every message becomes a NO_HANDLER dead letter");
            }
            groups.push((name, group));
        }
        let shutdown = CancellationToken::new();
        let mut tasks = Vec::new();
        let retention = Arc::new(RetentionWatch::default());
        let start = StartOn { retention: &retention, groups, shutdown: &shutdown, tasks: &mut tasks };
        let (engine_pool, books, started) = self.pool.start_engine(&self, start).await?;
        let handle = EngineHandle {
            pool: engine_pool,
            books,
            schema: self.schema,
            fast_path: started.fast_path,
            publishers: started.publishers,
            groups: started.groups,
            beat: started.beat,
        };
        Ok(Engine { handle, shutdown, tasks })
    }

    /// Starts, on the store and engine pool its database readied (`store/<database>/pool.rs`),
    /// what every database runs alike: the groups ([`EngineBuilder::start_groups`]), the
    /// bulk-requeue runners and the cleanup scheduler; returns the engine pool, the runtime's
    /// books on it and what was started.
    pub(crate) async fn start_on<S: PipelineStore>(
        &self,
        (store, engine_pool): (S, EnginePool),
        StartOn { retention, groups, shutdown, tasks }: StartOn<'_>,
    ) -> Result<StartedEngine, EngineError> {
        let books = engine_pool.runtime_books();
        refresh_retention(retention, engine_pool.console_store()).await;
        let started = self.start_groups(store, &books, retention, groups, shutdown, tasks).await?;
        tasks.push(tokio::spawn(crate::actions::bulk::runner::supervise(
            engine_pool.clone(),
            started.publishers.clone(),
            shutdown.clone(),
        )));
        tasks.push(tokio::spawn(crate::actions::cleanup::scheduler::supervise(
            engine_pool.clone(),
            retention.clone(),
            shutdown.clone(),
        )));
        Ok((engine_pool, books, started))
    }
}

/// What [`EngineBuilder::start`] hands its database's start ([`EngineBuilder::start_on`]): the
/// retention the cleanup watches, the checked groups, the shutdown token and the engine's tasks.
pub(crate) struct StartOn<'a> {
    retention: &'a Arc<RetentionWatch>,
    groups: Vec<(ConsumerGroup, Group)>,
    shutdown: &'a CancellationToken,
    tasks: &'a mut Vec<JoinHandle<()>>,
}

/// What a database's start gives back: the engine's pool, the runtime's books on it, the groups
/// started.
pub(crate) type StartedEngine = (EnginePool, Arc<dyn RuntimeBooks>, start::StartedGroups);

/// One consumer group of a running engine, as the console shows it.
pub struct RunningGroup {
    /// Its name.
    pub name: ConsumerGroup,
    /// Its source: broker, connection state, depth (queue depth or the Kafka group's lag).
    pub source: Arc<dyn SourceFactory>,
    /// Its workers' status; `None` when the engine does not consume.
    pub status: Option<Arc<ConsumerStatus>>,
    /// The message types it has handlers for, sorted.
    pub types: Vec<String>,
    /// Its HTTP handlers (the overview's endpoint cards), sorted by message type.
    pub http: Vec<HttpEndpoint>,
}

impl RunningGroup {
    /// The broker it reads from.
    pub fn broker(&self) -> Broker {
        self.source.broker()
    }
}

/// What the console, the API and a host need of a running engine; cheap to clone.
#[derive(Clone)]
pub struct EngineHandle {
    pool: EnginePool,
    books: Arc<dyn RuntimeBooks>,
    schema: Schema,
    fast_path: Arc<FastPath>,
    publishers: Publishers,
    groups: Arc<Vec<RunningGroup>>,
    /// This engine as an instance, when it consumes.
    beat: Option<Arc<Beat>>,
}

impl EngineHandle {
    /// The engine's pool: on PostgreSQL `search_path` is the engine's schema (see [`Schema`]);
    /// on MySQL its connections use the engine's database. The console's queries, the operator
    /// actions and cleanup take it, on either database ([`crate::console::console_store`]).
    pub fn pool(&self) -> &EnginePool {
        &self.pool
    }

    /// The engine's schema.
    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// The Redis fast path (for the console's record pages; [`crate::console`]).
    #[doc(hidden)]
    pub fn fast_path(&self) -> &Arc<FastPath> {
        &self.fast_path
    }

    /// The publishers operator actions republish through (each record's group's broker; for the
    /// console, [`crate::console`]).
    #[doc(hidden)]
    pub fn publishers(&self) -> &Publishers {
        &self.publishers
    }

    /// The consumer groups, in the order they were declared (for the console's overview,
    /// [`crate::console`]).
    #[doc(hidden)]
    pub fn groups(&self) -> &[RunningGroup] {
        &self.groups
    }

    /// Every instance consuming from this database, newest start first, this engine's own
    /// consumers as they are now (for the console's overview, [`crate::console`]).
    ///
    /// Errors: database errors.
    #[doc(hidden)]
    pub async fn instances(&self) -> Result<Vec<Instance>, sqlx::Error> {
        let own = self.beat.as_deref().map(|beat| (beat, &self.groups[..]));
        crate::instances::instances(self.books.as_ref(), own).await
    }

    /// Each group's health: not ready while its broker refuses its topology (see
    /// [`ConsumerStatus::topology_refused`]) or while every batch it takes is given back
    /// unjudged ([`ConsumerStatus::failing`]); a group that does not consume is ready.
    pub fn groups_health(&self) -> Vec<GroupHealth> {
        self.groups
            .iter()
            .map(|g| {
                let group = g.name.as_str().to_owned();
                let Some(status) = &g.status else {
                    return GroupHealth {
                        group,
                        ready: true,
                        error: None,
                        failed_batches: 0,
                        failing: None,
                        last_recovery: None,
                    };
                };
                let failing = status.failing();
                let error = status.topology_refused().or_else(|| {
                    failing.map(|run| {
                        format!(
                            "{} batches given back to the broker unjudged since {} (the database did not take them; the log says why)",
                            run.batches,
                            run.since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                        )
                    })
                });
                GroupHealth {
                    group,
                    ready: error.is_none(),
                    error,
                    failed_batches: status.failed_batches(),
                    failing,
                    last_recovery: status.last_recovery(),
                }
            })
            .collect()
    }
}

/// A running engine. Stop it with [`Engine::stop`] (dropping it leaves its tasks running until
/// the runtime ends).
///
/// ```no_run
/// # async fn run(pool: sqlx::PgPool, billing: dedup_engine::Group) -> anyhow::Result<()> {
/// use dedup_engine::Engine;
///
/// let engine = Engine::builder(pool)       // the team's pool; the engine's tables go in `dedup`
///     .redis("redis://127.0.0.1:6379")
///     .group(billing)                       // any number of groups, each on its own queue
///     .start()                              // migrates its schema, starts the workers
///     .await?;
/// // ... serve, until shutdown:
/// engine.stop().await;                      // in-flight batches finish and are acked
/// # Ok(()) }
/// ```
pub struct Engine {
    handle: EngineHandle,
    shutdown: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

impl Engine {
    /// A builder on `pool`, the team's own pool (a `PgPool`, or with the feature `mysql` a
    /// `MySqlPool`: [`EnginePool`]) on the database that holds (or will hold) the engine's
    /// schema next to the team's tables; transactional handlers run on its connections. See
    /// [`Engine`].
    pub fn builder(pool: impl Into<EnginePool>) -> EngineBuilder {
        EngineBuilder {
            pool: pool.into(),
            schema: Schema::default(),
            redis_url: "redis://127.0.0.1:6379".to_owned(),
            fast_path: FastPathSettings::default(),
            stats_flush: Duration::from_secs(1),
            pool_size: 8,
            consume: true,
            groups: Vec::new(),
        }
    }

    /// What the console and a host need of the engine.
    pub fn handle(&self) -> &EngineHandle {
        &self.handle
    }

    /// Stops the workers (in-flight batches finish and are acked or committed), flushes the
    /// aggregates, closes the broker connections.
    pub async fn stop(self) {
        self.shutdown.cancel();
        for task in self.tasks {
            let _ = task.await;
        }
        for group in self.handle.groups.iter() {
            group.source.close().await;
        }
    }
}

/// Reads the cleanup schedules' retention into `watch` before the pipelines start (the
/// scheduler refreshes it from then on); a failure is logged.
async fn refresh_retention(watch: &RetentionWatch, books: &dyn crate::actions::cleanup::CleanupBooks) {
    if let Err(e) = watch.refresh(books).await {
        tracing::warn!(error = %e, "reading the cleanup schedules' retention failed; the scheduler tries again");
    }
}
