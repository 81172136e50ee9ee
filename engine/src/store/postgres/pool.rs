//! PostgreSQL's side of an [`EnginePool`]: a `PgPool` is one, and what an engine does with it
//! — ping, close, a bounded pool beside it, the console's roles and the runtime's books on it
//! ([`DatabasePool`]) — and what the engine's start needs of it ([`ready`]): the engine's schema
//! migrated, the store and the engine's pool.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::PgPool;

use super::PgStore;
use super::runtime::PgRuntimeBooks;
use crate::actions::NamedLock;
use crate::console::ConsoleStore;
use crate::db::Schema;
use crate::runtime::books::RuntimeBooks;
use crate::runtime::{DatabasePool, EngineBuilder, EngineError, EnginePool, StartOn, StartedEngine};

impl From<PgPool> for EnginePool {
    fn from(pool: PgPool) -> Self {
        Self::new(pool)
    }
}

impl EnginePool {
    /// The PostgreSQL pool, when the engine runs on PostgreSQL (what a host keeps beside the
    /// engine's tables on PostgreSQL only); `None` on another database.
    pub fn postgres(&self) -> Option<&PgPool> {
        self.downcast()
    }
}

#[async_trait]
impl DatabasePool for PgPool {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn service(&self) -> crate::Service {
        crate::Service::PostgreSql
    }

    fn database(&self) -> &'static str {
        <sqlx::Postgres as sqlx::Database>::NAME
    }

    async fn ping(&self) -> Result<(), sqlx::Error> {
        sqlx::query("SELECT 1").execute(self).await.map(drop)
    }

    async fn close(&self) {
        sqlx::Pool::close(self).await;
    }

    fn application_name(&self) -> Option<String> {
        self.connect_options().get_application_name().map(str::to_owned)
    }

    fn bounded(&self, statement_timeout: Duration, max_connections: u32, application_name: &str) -> EnginePool {
        let ms = statement_timeout.as_millis().to_string();
        let options = self
            .connect_options()
            .as_ref()
            .clone()
            .application_name(application_name)
            .options([("statement_timeout", ms.as_str())]);
        self.options()
            .clone()
            .max_connections(max_connections.max(1))
            .min_connections(0)
            .acquire_timeout(statement_timeout)
            .connect_lazy_with(options)
            .into()
    }

    fn console_store(&self) -> &dyn ConsoleStore {
        self
    }

    fn runtime_books(&self) -> Arc<dyn RuntimeBooks> {
        Arc::new(PgRuntimeBooks::new(self.clone()))
    }

    async fn lock_named(&self, name: &str, wait: Duration) -> Result<Option<Box<dyn NamedLock>>, sqlx::Error> {
        super::named_lock::lock_named(self, name, wait).await
    }

    async fn open_engine_pool(&self, schema: &Schema, max_connections: u32) -> Result<EnginePool, EngineError> {
        Ok(ready(self, schema, max_connections).await?.1)
    }

    async fn start_engine(&self, builder: &EngineBuilder, start: StartOn<'_>) -> Result<StartedEngine, EngineError> {
        builder.start_on(ready(self, &builder.schema, builder.pool_size).await?, start).await
    }
}

/// Readies PostgreSQL for an engine on the team's pool `host`: migrates the engine's `schema`
/// ([`super::migrate`]), and returns the store on `host` (transactional batches begin there)
/// and the engine's pool ([`super::engine_pool`], at most `max_connections`).
///
/// Errors: a failed migration, or a dedup table without its dedup key.
async fn ready(
    host: &PgPool,
    schema: &Schema,
    max_connections: u32,
) -> Result<(PgStore, EnginePool), EngineError> {
    super::migrate(host, schema).await?;
    Ok((PgStore::new(host.clone(), schema), super::engine_pool(host, schema, max_connections).into()))
}
