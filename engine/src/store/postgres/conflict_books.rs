//! PostgreSQL's kept copies for operators ([`ConflictBooks`]): their listing, and a settlement
//! in a transaction (`SELECT … FOR UPDATE`, the `UPDATE`, the audit entry beside it).

use async_trait::async_trait;
use sqlx::PgPool;

use super::operator_tx::PgOperatorTx;
use crate::actions::conflicts::{ConflictBooks, ConflictChange, LockedConflict, RecordConflict};

const COLUMNS: &str = "id, record_id, consumer_group, message_id, kind, message_type, id_source,
    substring(payload FROM 1 FOR 2048) AS payload_excerpt, length(payload) AS payload_bytes,
    source_exchange, source_routing_key, copies, first_seen_at, last_seen_at, requeued_as, settled_at, settled_by";

#[async_trait]
impl ConflictBooks for PgPool {
    async fn conflict_copies(&self, record_id: i64) -> Result<Vec<RecordConflict>, sqlx::Error> {
        sqlx::query_as(&format!("SELECT {COLUMNS} FROM record_conflicts WHERE record_id = $1 ORDER BY id"))
            .bind(record_id)
            .fetch_all(self)
            .await
    }

    async fn open_conflict_ids(&self, group: Option<&str>) -> Result<Vec<i64>, sqlx::Error> {
        sqlx::query_scalar(
            "SELECT id FROM record_conflicts
             WHERE settled_at IS NULL AND kind = 'type' AND ($1::text IS NULL OR consumer_group = $1)
             ORDER BY id",
        )
        .bind(group)
        .fetch_all(self)
        .await
    }

    async fn begin_conflict_change(&self) -> Result<Box<dyn ConflictChange>, sqlx::Error> {
        Ok(Box::new(PgOperatorTx(self.begin().await?)))
    }
}

#[async_trait]
impl ConflictChange for PgOperatorTx {
    async fn lock(&mut self, id: i64) -> Result<Option<LockedConflict>, sqlx::Error> {
        sqlx::query_as(
            "SELECT record_id AS id, consumer_group, message_id, source_broker, source_exchange, source_routing_key,
                    payload, false AS payload_truncated, headers, content_type, type_property, false AS poison,
                    settled_at, id_source
             FROM record_conflicts WHERE id = $1 FOR UPDATE",
        )
        .bind(id)
        .fetch_optional(&mut *self.0)
        .await
    }

    async fn settle(&mut self, id: i64, actor: &str, requeued_as: Option<&str>) -> Result<(), sqlx::Error> {
        sqlx::query("UPDATE record_conflicts SET requeued_as = $2, settled_at = now(), settled_by = $3 WHERE id = $1")
            .bind(id)
            .bind(requeued_as)
            .bind(actor)
            .execute(&mut *self.0)
            .await?;
        Ok(())
    }
}
