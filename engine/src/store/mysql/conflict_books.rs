//! MySQL's kept copies for operators ([`ConflictBooks`]): their listing, and a settlement in a
//! transaction (`SELECT … FOR UPDATE`, the `UPDATE`, the audit entry beside it). Text and bytes
//! are read `AS CHAR`, the headers as JSON text (MariaDB's JSON is text).

use async_trait::async_trait;
use sqlx::mysql::MySqlPool;

use super::operator_tx::MySqlOperatorTx;
use crate::actions::conflicts::{ConflictBooks, ConflictChange, LockedConflict, PAYLOAD_SHOWN_BYTES, RecordConflict};

#[async_trait]
impl ConflictBooks for MySqlPool {
    async fn conflict_copies(&self, record_id: i64) -> Result<Vec<RecordConflict>, sqlx::Error> {
        // On `record_conflicts_open_key`, which leads with the record id.
        sqlx::query_as(
            "SELECT id, record_id, CAST(consumer_group AS CHAR) AS consumer_group,
                    CAST(message_id AS CHAR) AS message_id, CAST(kind AS CHAR) AS kind,
                    CAST(message_type AS CHAR) AS message_type, CAST(id_source AS CHAR) AS id_source,
                    SUBSTRING(payload, 1, ?) AS payload_excerpt, CAST(LENGTH(payload) AS SIGNED) AS payload_bytes,
                    CAST(source_exchange AS CHAR) AS source_exchange,
                    CAST(source_routing_key AS CHAR) AS source_routing_key, copies, first_seen_at, last_seen_at,
                    CAST(requeued_as AS CHAR) AS requeued_as, settled_at, CAST(settled_by AS CHAR) AS settled_by
             FROM record_conflicts WHERE record_id = ? ORDER BY id",
        )
        .bind(PAYLOAD_SHOWN_BYTES)
        .bind(record_id)
        .fetch_all(self)
        .await
    }

    async fn open_conflict_ids(&self, group: Option<&str>) -> Result<Vec<i64>, sqlx::Error> {
        let group = group.map(str::as_bytes);
        sqlx::query_scalar(
            "SELECT id FROM record_conflicts
             WHERE settled_at IS NULL AND kind = 'type' AND (? IS NULL OR consumer_group = ?)
             ORDER BY id",
        )
        .bind(group)
        .bind(group)
        .fetch_all(self)
        .await
    }

    async fn begin_conflict_change(&self) -> Result<Box<dyn ConflictChange>, sqlx::Error> {
        Ok(Box::new(MySqlOperatorTx(self.begin().await?)))
    }
}

#[async_trait]
impl ConflictChange for MySqlOperatorTx {
    async fn lock(&mut self, id: i64) -> Result<Option<LockedConflict>, sqlx::Error> {
        sqlx::query_as(
            "SELECT record_id AS id, CAST(consumer_group AS CHAR) AS consumer_group,
                    CAST(message_id AS CHAR) AS message_id, CAST(source_broker AS CHAR) AS source_broker,
                    CAST(source_exchange AS CHAR) AS source_exchange,
                    CAST(source_routing_key AS CHAR) AS source_routing_key, payload, FALSE AS payload_truncated,
                    CAST(headers AS CHAR) AS headers, CAST(content_type AS CHAR) AS content_type,
                    CAST(type_property AS CHAR) AS type_property, FALSE AS poison, settled_at,
                    CAST(id_source AS CHAR) AS id_source
             FROM record_conflicts WHERE id = ? FOR UPDATE",
        )
        .bind(id)
        .fetch_optional(&mut *self.0)
        .await
    }

    async fn settle(&mut self, id: i64, actor: &str, requeued_as: Option<&str>) -> Result<(), sqlx::Error> {
        sqlx::query(
            "UPDATE record_conflicts SET requeued_as = ?, settled_at = UTC_TIMESTAMP(6), settled_by = ? WHERE id = ?",
        )
        .bind(requeued_as.map(str::as_bytes))
        .bind(actor)
        .bind(id)
        .execute(&mut *self.0)
        .await?;
        Ok(())
    }
}
