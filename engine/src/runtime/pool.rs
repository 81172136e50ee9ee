//! [`EnginePool`]: the database an engine runs on. What each database does with its pool — the
//! `From` of its pool type and the typed way back (`EnginePool::postgres`, `EnginePool::mysql`),
//! connecting by URL, ping, close, a bounded pool beside it, migrating, starting an engine, the
//! console's roles and the runtime's books on it — is its store's (`store/<database>/pool.rs`),
//! behind [`DatabasePool`]; this file names no database.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::books::RuntimeBooks;
use super::{EngineBuilder, EngineError, StartOn, StartedEngine};
use crate::actions::NamedLock;
use crate::console::ConsoleStore;
use crate::db::{PoolSettings, Schema};
use crate::store::ConnectError;

/// The team's pool an engine is built on ([`crate::Engine::builder`]): the database that holds
/// the team's tables and, in a schema (PostgreSQL) or database (MySQL) of their own, the
/// engine's. Made from the team's own sqlx pool as it is (`From`: PostgreSQL's, or with the
/// feature `mysql` MySQL's, whose connections must run `READ COMMITTED` in UTC as
/// `mysql::connect` opens them), or by URL ([`EnginePool::connect`]); the typed pool
/// comes back from [`EnginePool::postgres`] (or `EnginePool::mysql`). Cheap to clone: clones
/// share the pool.
#[derive(Clone)]
pub struct EnginePool(Arc<dyn DatabasePool>);

impl fmt::Debug for EnginePool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("EnginePool").field(&self.database()).finish()
    }
}

/// One database's side of an [`EnginePool`], implemented on its pool type in its store's folder
/// (`store/<database>/pool.rs`).
#[async_trait]
pub(crate) trait DatabasePool: Any + Send + Sync {
    /// Itself, for the typed way back to its pool type ([`EnginePool::downcast`]).
    fn as_any(&self) -> &dyn Any;

    /// The service it is, for probes and errors.
    fn service(&self) -> crate::Service;

    /// The database's name as sqlx gives it (`Database::NAME`).
    fn database(&self) -> &'static str;

    /// `SELECT 1` on a pooled connection.
    async fn ping(&self) -> Result<(), sqlx::Error>;

    /// Closes the pool ([`EnginePool::close`]).
    async fn close(&self);

    /// The `application_name` its connections carry, if the database has one and it was set.
    fn application_name(&self) -> Option<String>;

    /// A pool beside this one for work bounded by `statement_timeout` ([`EnginePool::bounded`]).
    fn bounded(&self, statement_timeout: Duration, max_connections: u32, application_name: &str) -> EnginePool;

    /// The console's roles on this database.
    fn console_store(&self) -> &dyn ConsoleStore;

    /// The runtime's books on this database.
    fn runtime_books(&self) -> Arc<dyn RuntimeBooks>;

    /// Migrates the engine's `schema` on this (the team's) pool and opens the engine's pool
    /// beside it, at most `max_connections` ([`EnginePool::open_engine_pool`]).
    async fn open_engine_pool(&self, schema: &Schema, max_connections: u32) -> Result<EnginePool, EngineError>;

    /// Readies this database for `builder`'s engine (migrates its schema, checks the session)
    /// and starts the engine on it ([`EngineBuilder::start_on`]).
    async fn start_engine(&self, builder: &EngineBuilder, start: StartOn<'_>) -> Result<StartedEngine, EngineError>;

    /// Takes the lock `name` of this database on a connection of its own, waiting at most
    /// `wait`; `None` when another session held it all that time ([`EnginePool::while_locked`]).
    async fn lock_named(&self, name: &str, wait: Duration) -> Result<Option<Box<dyn NamedLock>>, sqlx::Error>;
}

impl EnginePool {
    /// The pool of one database's side ([`DatabasePool`]); each store's `From` of its pool type.
    pub(crate) fn new(pool: impl DatabasePool) -> Self {
        Self(Arc::new(pool))
    }

    /// Its database's side.
    fn database_pool(&self) -> &dyn DatabasePool {
        self.0.as_ref()
    }

    /// The pool as its database's own type `P`, when it is one (each store's typed accessor).
    pub(crate) fn downcast<P: DatabasePool>(&self) -> Option<&P> {
        self.0.as_any().downcast_ref()
    }

    /// Opens a pool on the database `url` names, chosen by its scheme (any case): `postgres://`
    /// or `postgresql://` is PostgreSQL ([`crate::connect`]), `mysql://` or `mariadb://` MySQL 8
    /// or MariaDB 10.11 (`mysql::connect`, feature `mysql`); each with `settings` as those take
    /// them.
    ///
    /// Errors: [`ConnectError::UnknownScheme`] for any other scheme (or none), a MySQL URL on a
    /// build without the feature `mysql` included; [`ConnectError::Unreachable`], naming the
    /// database, the redacted URL and the cause.
    pub async fn connect(url: &str, settings: &PoolSettings) -> Result<EnginePool, ConnectError> {
        crate::store::connect(url, settings).await
    }

    /// Migrates the engine's `schema` on this, the team's pool (as [`EngineBuilder::start`]
    /// does first: a deploy step, or the console's and operator commands' start without an
    /// engine), and opens the engine's pool beside it: at most `max_connections`, opened on
    /// demand; on PostgreSQL its `search_path` is `schema`, on MySQL it uses the database
    /// `schema`.
    ///
    /// Errors: [`EngineBuilder::start`]'s on the database: a failed migration, a dedup table
    /// without its dedup key, a MySQL session not `READ COMMITTED` in UTC, a MySQL `schema` that
    /// is the team's database.
    pub async fn open_engine_pool(&self, schema: &Schema, max_connections: u32) -> Result<EnginePool, EngineError> {
        self.database_pool().open_engine_pool(schema, max_connections).await
    }

    /// Starts `builder`'s engine on this pool's database.
    pub(crate) async fn start_engine(
        &self,
        builder: &EngineBuilder,
        start: StartOn<'_>,
    ) -> Result<StartedEngine, EngineError> {
        self.database_pool().start_engine(builder, start).await
    }

    /// Closes the pool: waits for every connection checked out to come back, then closes them.
    pub async fn close(&self) {
        self.database_pool().close().await;
    }

    /// The service it is, for probes and errors.
    pub(crate) fn service(&self) -> crate::Service {
        self.database_pool().service()
    }

    /// `SELECT 1` on a pooled connection.
    pub(crate) async fn ping(&self) -> Result<(), sqlx::Error> {
        self.database_pool().ping().await
    }

    /// The `application_name` its connections carry (PostgreSQL's `pg_stat_activity`), if one was
    /// set; MySQL has none.
    pub fn application_name(&self) -> Option<String> {
        self.database_pool().application_name()
    }

    /// A pool beside this one, on the same database, user and schema, for work that must not
    /// outlast `statement_timeout` (a console's requests): at most `max_connections`
    /// connections opened on demand, a wait for one bounded by `statement_timeout` too, and each
    /// statement cancelled by the database after it, lock waits included: PostgreSQL's
    /// `statement_timeout`, MariaDB's `max_statement_time`, MySQL 8's `max_execution_time` (which
    /// bounds reads only). `application_name` names the connections on PostgreSQL. Its own
    /// connections keep a caller from taking those the consumers need.
    pub fn bounded(&self, statement_timeout: Duration, max_connections: u32, application_name: &str) -> EnginePool {
        self.database_pool().bounded(statement_timeout, max_connections, application_name)
    }

    /// The database's name as sqlx gives it (`Database::NAME`: `"PostgreSQL"`, `"MySQL"`).
    pub fn database(&self) -> &'static str {
        self.database_pool().database()
    }

    /// Runs `work` while this process holds the lock `name` of the pool's database, so that
    /// processes doing the same work take turns (creating a table at start-up, say): a
    /// PostgreSQL advisory lock or a MySQL `GET_LOCK`, on a connection of its own that is
    /// closed afterwards (a crashed holder frees it). Waits at most `wait` for another holder.
    ///
    /// Returns `work`'s output, or `None` when another process held the lock all of `wait`.
    ///
    /// Errors: the database's, taking the lock.
    pub async fn while_locked<F: Future>(
        &self,
        name: &str,
        wait: Duration,
        work: F,
    ) -> Result<Option<F::Output>, sqlx::Error> {
        let Some(lock) = self.database_pool().lock_named(name, wait).await? else {
            return Ok(None);
        };
        let output = work.await;
        lock.release().await;
        Ok(Some(output))
    }

    /// The console's roles on this pool's database ([`crate::console::console_store`]).
    pub(crate) fn console_store(&self) -> &dyn ConsoleStore {
        self.database_pool().console_store()
    }

    /// The runtime's books on this pool's database.
    pub(crate) fn runtime_books(&self) -> Arc<dyn RuntimeBooks> {
        self.database_pool().runtime_books()
    }
}
