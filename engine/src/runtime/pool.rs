//! [`EnginePool`]: the database an engine runs on, and what each needs before its engine starts.

use std::time::Duration;

use sqlx::PgPool;
#[cfg(feature = "mysql")]
use sqlx::mysql::MySqlPool;

#[cfg(feature = "mysql")]
use super::EngineError;
#[cfg(feature = "mysql")]
use sqlx::migrate::MigrateError;

#[cfg(feature = "mysql")]
use crate::db::{Schema, SchemaError};

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
    /// others ([`EngineError::MySqlSession`]).
    #[cfg(feature = "mysql")]
    MySql(MySqlPool),
}

impl EnginePool {
    /// The PostgreSQL pool, when the engine runs on PostgreSQL (what a host keeps beside the
    /// engine's tables on PostgreSQL only, such as the console's sessions in tower-sessions'
    /// `PostgresStore`); `None` on MySQL.
    pub fn postgres(&self) -> Option<&PgPool> {
        match self {
            Self::Postgres(pool) => Some(pool),
            #[cfg(feature = "mysql")]
            Self::MySql(_) => None,
        }
    }

    /// Closes the pool: waits for every connection checked out to come back, then closes them.
    pub async fn close(&self) {
        match self {
            Self::Postgres(pool) => pool.close().await,
            #[cfg(feature = "mysql")]
            Self::MySql(pool) => pool.close().await,
        }
    }

    /// The service it is, for probes and errors.
    pub(crate) fn service(&self) -> crate::Service {
        match self {
            Self::Postgres(_) => crate::Service::PostgreSql,
            #[cfg(feature = "mysql")]
            Self::MySql(_) => crate::Service::MySql,
        }
    }

    /// `SELECT 1` on a pooled connection.
    pub(crate) async fn ping(&self) -> Result<(), sqlx::Error> {
        match self {
            Self::Postgres(pool) => sqlx::query("SELECT 1").execute(pool).await.map(drop),
            #[cfg(feature = "mysql")]
            Self::MySql(pool) => sqlx::query("SELECT 1").execute(pool).await.map(drop),
        }
    }

    /// The `application_name` its connections carry (PostgreSQL's `pg_stat_activity`), if one was
    /// set; MySQL has none.
    pub fn application_name(&self) -> Option<String> {
        match self {
            Self::Postgres(pool) => pool.connect_options().get_application_name().map(str::to_owned),
            #[cfg(feature = "mysql")]
            Self::MySql(_) => None,
        }
    }

    /// A pool beside this one, on the same database, user and schema, for work that must not
    /// outlast `statement_timeout` (a console's requests): at most `max_connections`
    /// connections opened on demand, a wait for one bounded by `statement_timeout` too, and each
    /// statement cancelled by the database after it, lock waits included: PostgreSQL's
    /// `statement_timeout`, MariaDB's `max_statement_time`, MySQL 8's `max_execution_time` (which
    /// bounds reads only). `application_name` names the connections on PostgreSQL. Its own
    /// connections keep a caller from taking those the consumers need.
    pub fn bounded(&self, statement_timeout: Duration, max_connections: u32, application_name: &str) -> EnginePool {
        match self {
            Self::Postgres(pool) => {
                let ms = statement_timeout.as_millis().to_string();
                let options = pool
                    .connect_options()
                    .as_ref()
                    .clone()
                    .application_name(application_name)
                    .options([("statement_timeout", ms.as_str())]);
                Self::Postgres(
                    pool.options()
                        .clone()
                        .max_connections(max_connections.max(1))
                        .min_connections(0)
                        .acquire_timeout(statement_timeout)
                        .connect_lazy_with(options),
                )
            }
            #[cfg(feature = "mysql")]
            Self::MySql(pool) => Self::MySql(crate::store::mysql::bounded_pool(pool, statement_timeout, max_connections)),
        }
    }

    /// The database's name as sqlx gives it (`Database::NAME`: `"PostgreSQL"`, `"MySQL"`).
    pub fn database(&self) -> &'static str {
        match self {
            Self::Postgres(_) => <sqlx::Postgres as sqlx::Database>::NAME,
            #[cfg(feature = "mysql")]
            Self::MySql(_) => <sqlx::MySql as sqlx::Database>::NAME,
        }
    }
}

impl From<PgPool> for EnginePool {
    fn from(pool: PgPool) -> Self {
        Self::Postgres(pool)
    }
}

#[cfg(feature = "mysql")]
impl From<MySqlPool> for EnginePool {
    fn from(pool: MySqlPool) -> Self {
        Self::MySql(pool)
    }
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
#[cfg(feature = "mysql")]
pub async fn ready_mysql(host: &MySqlPool, schema: &Schema, max_connections: u32) -> Result<MySqlPool, EngineError> {
    let session = mysql_session(host).await.map_err(SchemaError::Query)?;
    if session.isolation != "READ-COMMITTED" || session.utc_offset_seconds != 0 {
        let TeamSession { isolation, utc_offset_seconds, .. } = session;
        return Err(EngineError::MySqlSession { isolation, utc_offset_seconds });
    }
    if session.database.as_deref() == Some(schema.as_str()) {
        return Err(EngineError::EngineDatabaseIsTheTeams { database: schema.as_str().to_owned() });
    }
    crate::store::mysql::create_database(&mut *host.acquire().await.map_err(SchemaError::Query)?, schema.as_str())
        .await
        .map_err(SchemaError::Query)?;
    let options = host.connect_options().as_ref().clone().database(schema.as_str());
    let engine = host.options().clone().max_connections(max_connections.max(1)).min_connections(0).connect_lazy_with(options);
    crate::store::mysql::migrate(&engine, &crate::store::mysql::MIGRATOR).await.map_err(|error| match error {
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
#[cfg(feature = "mysql")]
pub async fn migrate_engine(host: &MySqlPool, schema: &Schema) -> Result<(), EngineError> {
    ready_mysql(host, schema, 1).await?.close().await;
    Ok(())
}

/// What [`ready_mysql`] checks of the team's connections.
#[cfg(feature = "mysql")]
struct TeamSession {
    /// The isolation level (`READ-COMMITTED`, …). MySQL 8 names it `transaction_isolation`;
    /// MariaDB 10.11 only `tx_isolation`.
    isolation: String,
    /// The session time zone's offset from UTC, in seconds.
    utc_offset_seconds: i64,
    /// The database the connection uses (`DATABASE()`), if any.
    database: Option<String>,
}

#[cfg(feature = "mysql")]
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
