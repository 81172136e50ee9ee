//! MySQL's side of an [`EnginePool`]: a `MySqlPool` is one, and what an engine does with it —
//! ping, close, a bounded pool beside it, the console's roles and the runtime's books on it
//! ([`DatabasePool`]) — and what the engine's start needs of it: the team's session checked, the
//! engine's database created and migrated ([`ready_mysql`], [`ready`]).

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::Executor;
use sqlx::migrate::MigrateError;
use sqlx::mysql::{MySqlPool, MySqlPoolOptions};

use super::MySqlStore;
use super::runtime::MySqlRuntimeBooks;
use crate::actions::NamedLock;
use crate::console::ConsoleStore;
use crate::db::{Schema, SchemaError};
use crate::runtime::books::RuntimeBooks;
use crate::runtime::{DatabasePool, EngineBuilder, EngineError, EnginePool, StartOn, StartedEngine};

impl From<MySqlPool> for EnginePool {
    fn from(pool: MySqlPool) -> Self {
        Self::new(pool)
    }
}

impl EnginePool {
    /// The MySQL pool, when the engine runs on MySQL or MariaDB (what a host keeps beside the
    /// engine's tables on MySQL only); `None` on another database.
    pub fn mysql(&self) -> Option<&MySqlPool> {
        self.downcast()
    }
}

#[async_trait]
impl DatabasePool for MySqlPool {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn service(&self) -> crate::Service {
        crate::Service::MySql
    }

    fn database(&self) -> &'static str {
        <sqlx::MySql as sqlx::Database>::NAME
    }

    async fn ping(&self) -> Result<(), sqlx::Error> {
        sqlx::query("SELECT 1").execute(self).await.map(drop)
    }

    async fn close(&self) {
        sqlx::Pool::close(self).await;
    }

    /// MySQL has no `application_name`.
    fn application_name(&self) -> Option<String> {
        None
    }

    /// A pool beside this one ([`EnginePool::bounded`]): its connect options (database, UTC),
    /// `READ COMMITTED`, at most `max_connections` opened on demand, a wait for one bounded by
    /// `statement_timeout`, and each statement cancelled after it: MariaDB's `max_statement_time`
    /// (every statement), else MySQL 8's `max_execution_time` (reads only; MySQL has no bound on
    /// writes).
    fn bounded(&self, statement_timeout: Duration, max_connections: u32, _application_name: &str) -> EnginePool {
        let seconds = statement_timeout.as_secs_f64();
        let ms = u64::try_from(statement_timeout.as_millis()).unwrap_or(u64::MAX);
        MySqlPoolOptions::new()
            .max_connections(max_connections.max(1))
            .min_connections(0)
            .acquire_timeout(statement_timeout)
            .after_connect(move |conn, _| {
                Box::pin(async move {
                    conn.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED").await?;
                    let mariadb = sqlx::query("SET SESSION max_statement_time = ?").bind(seconds).execute(&mut *conn).await;
                    if mariadb.is_err() {
                        sqlx::query("SET SESSION max_execution_time = ?").bind(ms).execute(&mut *conn).await?;
                    }
                    Ok(())
                })
            })
            .connect_lazy_with(self.connect_options().as_ref().clone())
        .into()
    }

    fn console_store(&self) -> &dyn ConsoleStore {
        self
    }

    fn runtime_books(&self) -> Arc<dyn RuntimeBooks> {
        Arc::new(MySqlRuntimeBooks::new(self.clone()))
    }

    async fn lock_named(&self, name: &str, wait: Duration) -> Result<Option<Box<dyn NamedLock>>, sqlx::Error> {
        super::named_lock::lock_named(self, name, wait).await
    }

    async fn open_engine_pool(&self, schema: &Schema, max_connections: u32) -> Result<EnginePool, EngineError> {
        Ok(ready_mysql(self, schema, max_connections).await?.into())
    }

    async fn start_engine(&self, builder: &EngineBuilder, start: StartOn<'_>) -> Result<StartedEngine, EngineError> {
        builder.start_on(ready(self, &builder.schema, builder.pool_size).await?, start).await
    }
}

/// Readies MySQL for an engine on the team's pool `host` ([`ready_mysql`]), and returns the store
/// on `host` (transactional batches begin there) and the engine's pool.
///
/// Errors: [`ready_mysql`]'s.
async fn ready(
    host: &MySqlPool,
    schema: &Schema,
    max_connections: u32,
) -> Result<(MySqlStore, EnginePool), EngineError> {
    let engine = ready_mysql(host, schema, max_connections).await?;
    Ok((MySqlStore::new(host.clone(), schema), engine.into()))
}

/// Readies MySQL for an engine on the team's pool `host`: checks that its connections run
/// `READ COMMITTED` in UTC (the store's statements rely on both), creates the engine's database
/// `schema` when missing, migrates it ([`crate::mysql::migrate`]: engines starting together take
/// turns), and returns the engine's pool:
/// `host`'s options on that database, at most `max_connections`, opened lazily.
///
/// Errors: [`EngineError::MySqlSession`], [`EngineError::EngineDatabaseIsTheTeams`],
/// [`EngineError::SharedMigrationHistory`], or the database's (unreachable, no right to create
/// the database, a failed migration).
async fn ready_mysql(host: &MySqlPool, schema: &Schema, max_connections: u32) -> Result<MySqlPool, EngineError> {
    let session = mysql_session(host).await.map_err(SchemaError::Query)?;
    if session.isolation != "READ-COMMITTED" || session.utc_offset_seconds != 0 {
        let TeamSession { isolation, utc_offset_seconds, .. } = session;
        return Err(EngineError::MySqlSession { isolation, utc_offset_seconds });
    }
    if session.database.as_deref() == Some(schema.as_str()) {
        return Err(EngineError::EngineDatabaseIsTheTeams { database: schema.as_str().to_owned() });
    }
    super::create_database(&mut *host.acquire().await.map_err(SchemaError::Query)?, schema.as_str())
        .await
        .map_err(SchemaError::Query)?;
    let options = host.connect_options().as_ref().clone().database(schema.as_str());
    let engine = host.options().clone().max_connections(max_connections.max(1)).min_connections(0).connect_lazy_with(options);
    super::migrate(&engine, &super::MIGRATOR).await.map_err(|error| match error {
        MigrateError::VersionMissing(_) | MigrateError::VersionMismatch(_) => {
            EngineError::SharedMigrationHistory { database: schema.as_str().to_owned(), error }
        }
        other => SchemaError::Migrate(other).into(),
    })?;
    Ok(engine)
}

/// Applies the engine's migrations on MySQL without starting an engine (a deploy step; what
/// `Engine::start` does first): checks `host`'s session, creates the engine's database `schema`
/// when missing and migrates it, one process at a time.
///
/// Errors: as [`crate::EngineBuilder::start`]'s: [`EngineError::MySqlSession`],
/// [`EngineError::EngineDatabaseIsTheTeams`], the database's, a migration's.
pub async fn migrate_engine(host: &MySqlPool, schema: &Schema) -> Result<(), EngineError> {
    ready_mysql(host, schema, 1).await?.close().await;
    Ok(())
}

/// What [`ready_mysql`] checks of the team's connections.
struct TeamSession {
    /// The isolation level (`READ-COMMITTED`, …). MySQL 8 names it `transaction_isolation`;
    /// MariaDB 10.11 only `tx_isolation`.
    isolation: String,
    /// The session time zone's offset from UTC, in seconds.
    utc_offset_seconds: i64,
    /// The database the connection uses (`DATABASE()`), if any.
    database: Option<String>,
}

async fn mysql_session(pool: &MySqlPool) -> Result<TeamSession, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    let isolation: Vec<u8> = match sqlx::query_scalar("SELECT CAST(@@session.transaction_isolation AS BINARY)")
        .fetch_one(&mut *conn)
        .await
    {
        Ok(level) => level,
        Err(_) => sqlx::query_scalar("SELECT CAST(@@session.tx_isolation AS BINARY)").fetch_one(&mut *conn).await?,
    };
    let (utc_offset_seconds, database): (i64, Option<Vec<u8>>) =
        sqlx::query_as("SELECT TIMESTAMPDIFF(SECOND, UTC_TIMESTAMP(), NOW()), CAST(DATABASE() AS BINARY)")
            .fetch_one(&mut *conn)
            .await?;
    Ok(TeamSession {
        isolation: String::from_utf8_lossy(&isolation).into_owned(),
        utc_offset_seconds,
        database: database.map(|name| String::from_utf8_lossy(&name).into_owned()),
    })
}
