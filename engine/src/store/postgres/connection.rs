//! PostgreSQL connections: opening a pool ([`connect`], creating its database when missing) and
//! the engine's own pool beside a team's ([`engine_pool`]).
//!
//! The engine's tables live in a schema of their own (default `dedup`, see [`Schema`]) with
//! their own migration history, so they sit in the same database as a team's business tables —
//! which a transactional handler needs: its business change and the dedup record commit in one
//! transaction — without a name clash. Two pools follow from that:
//!
//! - the **host pool**, the team's own: the pipeline opens a transactional batch on it, so a
//!   handler's statements resolve names exactly as the rest of the team's code does. The dedup
//!   store's statements that share that transaction name their tables with the schema
//!   ([`PgStore`](super::PgStore)).
//! - the **engine pool** ([`engine_pool`]): connections whose `search_path` is the engine's
//!   schema alone. Everything else the engine runs (the console's queries, operator actions,
//!   aggregates, accounts, audit, cleanup) runs there and names its tables without a schema.

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, PgPool};

use crate::db::{PoolSettings, Schema};
use crate::service::{Service, Unreachable};
use crate::store::DbErrorKind;

/// Opens a connection pool and checks that the server answers. When the database named in the
/// URL does not exist yet it is created first (a fresh machine needs no manual `createdb`).
/// Connections run with `jit = off` and the settings' `statement_timeout`.
///
/// Errors: [`Unreachable`] naming PostgreSQL, the redacted URL and how to start it, when the URL
/// does not parse or no connection can be made within `acquire_timeout`.
pub async fn connect(url: &str, settings: &PoolSettings) -> Result<PgPool, Unreachable> {
    let unreachable = |e: sqlx::Error| Unreachable::new(Service::PostgreSql, url, e);
    let options: PgConnectOptions = url
        .parse::<PgConnectOptions>()
        .map_err(unreachable)?
        .log_slow_statements(tracing::log::LevelFilter::Warn, Duration::from_millis(500))
        // Every statement of the product is short and index-driven; PostgreSQL's JIT, triggered
        // by cost estimates (set-returning functions, lateral joins), only adds compile time
        // (measured: 230 ms on a 2 ms console query).
        .options([("jit", "off")]);
    let options = match settings.statement_timeout {
        Some(bound) => options.options([("statement_timeout", bound.as_millis().to_string())]),
        None => options,
    };
    let pool_options =
        || PgPoolOptions::new().max_connections(settings.max_connections).acquire_timeout(settings.acquire_timeout);
    match pool_options().connect_with(options.clone()).await {
        Err(e) if DbErrorKind::of(&e) == DbErrorKind::UnknownDatabase => {
            create_database(&options).await.map_err(unreachable)?;
            pool_options().connect_with(options).await.map_err(unreachable)
        }
        other => other.map_err(unreachable),
    }
}

/// Creates the database named in `options`, connecting to the `postgres` maintenance database
/// of the same server. A concurrent creation by another process is not an error.
async fn create_database(options: &PgConnectOptions) -> Result<(), sqlx::Error> {
    use sqlx::Connection;
    let name = options.get_database().unwrap_or("postgres").to_owned();
    let mut admin = sqlx::PgConnection::connect_with(&options.clone().database("postgres")).await?;
    let quoted = format!("\"{}\"", name.replace('"', "\"\""));
    let created = sqlx::query(&format!("CREATE DATABASE {quoted}")).execute(&mut admin).await;
    admin.close().await?;
    match created {
        // Another process created it first.
        Err(e) if DbErrorKind::of(&e) == DbErrorKind::DatabaseExists => Ok(()),
        Err(e) => Err(e),
        Ok(_) => {
            tracing::info!(database = %name, "created database");
            Ok(())
        }
    }
}

/// The engine's pool on the database of `host`: the same server, user and connection options,
/// with `search_path` set to `schema` alone, at most `max_connections` connections, opened on
/// demand. Statements on it name the engine's tables without a schema.
pub fn engine_pool(host: &PgPool, schema: &Schema, max_connections: u32) -> PgPool {
    let options = host.connect_options().as_ref().clone().options([("search_path", schema.as_str())]);
    host.options().clone().max_connections(max_connections.max(1)).min_connections(0).connect_lazy_with(options)
}
