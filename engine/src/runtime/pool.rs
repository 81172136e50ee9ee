//! [`EnginePool`]: the database an engine runs on. The enum is the one place the engine names
//! each database (a pool of each is what a host hands over); what each database does with its
//! pool — the `From` of its pool type, ping, close, a bounded pool beside it, the console's
//! roles and the runtime's books on it — is its store's (`store/<database>/pool.rs`), behind
//! [`DatabasePool`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::PgPool;
#[cfg(feature = "mysql")]
use sqlx::mysql::MySqlPool;

use super::books::RuntimeBooks;
use crate::actions::NamedLock;
use crate::console::ConsoleStore;

/// The team's pool an engine is built on ([`crate::Engine::builder`]): the database that holds
/// the team's tables and, in a schema (PostgreSQL) or database (MySQL) of their own, the
/// engine's. `Engine::builder(pool)` takes either pool as it is (`From`).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum EnginePool {
    /// PostgreSQL.
    Postgres(PgPool),
    /// MySQL 8 or MariaDB 10.11 (feature `mysql`). Its connections must run `READ COMMITTED` in
    /// UTC, as [`crate::mysql::connect`] opens them; the engine refuses to start on
    /// others ([`EngineError::MySqlSession`](super::EngineError::MySqlSession)).
    #[cfg(feature = "mysql")]
    MySql(MySqlPool),
}

/// One database's side of an [`EnginePool`], implemented on its pool type in its store's folder
/// (`store/<database>/pool.rs`).
#[async_trait]
pub(crate) trait DatabasePool: Send + Sync {
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

    /// Takes the lock `name` of this database on a connection of its own, waiting at most
    /// `wait`; `None` when another session held it all that time ([`EnginePool::while_locked`]).
    async fn lock_named(&self, name: &str, wait: Duration) -> Result<Option<Box<dyn NamedLock>>, sqlx::Error>;
}

impl EnginePool {
    /// Its database's side.
    fn database_pool(&self) -> &dyn DatabasePool {
        match self {
            Self::Postgres(pool) => pool,
            #[cfg(feature = "mysql")]
            Self::MySql(pool) => pool,
        }
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
