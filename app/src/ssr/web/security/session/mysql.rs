//! The console's sessions on MySQL and MariaDB (feature `mysql`): tower-sessions' `MySqlStore`,
//! table `session` in the engine's database.

use async_trait::async_trait;
use tower_sessions::session_store::ExpiredDeletion;
use tower_sessions_sqlx_store::MySqlStore;

use super::DatabaseSessions;

#[async_trait]
impl DatabaseSessions for MySqlStore {
    async fn create_table(&self) -> Result<(), dedup_engine::sqlx::Error> {
        self.migrate().await
    }

    async fn delete_expired(&self) -> tower_sessions::session_store::Result<()> {
        ExpiredDeletion::delete_expired(self).await
    }
}
