//! PostgreSQL's duplicate drills ([`DrillBooks`]): the record drilled, a drill's row written in
//! the operator's transaction, a drill beside its record's counters now.

use async_trait::async_trait;
use sqlx::PgPool;

use super::operator_tx::PgOperatorTx;
use crate::actions::OperatorTx;
use crate::actions::drill::{DrillBooks, DrillRecord, DrillRow, DrillTarget};

const TARGET: &str = "SELECT id, consumer_group, message_id, status, source_broker, source_exchange, source_routing_key,
                             duplicate_count, payload_conflicts, attempts, payload_hash FROM dedup_records";

#[async_trait]
impl DrillBooks for PgPool {
    async fn drill_target(&self, target: &DrillTarget) -> Result<Option<DrillRecord>, sqlx::Error> {
        match target {
            DrillTarget::Record(id) => {
                sqlx::query_as(&format!("{TARGET} WHERE id = $1")).bind(id).fetch_optional(self).await
            }
            DrillTarget::LatestOfType(t) => {
                sqlx::query_as(&format!(
                    "{TARGET} WHERE status = 'succeeded' AND message_type = $1 ORDER BY first_seen_at DESC, id DESC LIMIT 1"
                ))
                .bind(t)
                .fetch_optional(self)
                .await
            }
        }
    }

    async fn begin_drill(
        &self,
        record: &DrillRecord,
        actor: &str,
        marker_present: bool,
    ) -> Result<(i64, Box<dyn OperatorTx>), sqlx::Error> {
        let mut tx = self.begin().await?;
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO drills (record_id, consumer_group, message_id, actor, marker_present, duplicates_before,
                                 conflicts_before, attempts_before)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING id",
        )
        .bind(record.id)
        .bind(&record.consumer_group)
        .bind(&record.message_id)
        .bind(actor)
        .bind(marker_present)
        .bind(record.duplicate_count)
        .bind(record.payload_conflicts)
        .bind(record.attempts)
        .fetch_one(&mut *tx)
        .await?;
        Ok((id, Box::new(PgOperatorTx(tx))))
    }

    async fn drill_row(&self, id: i64) -> Result<Option<DrillRow>, sqlx::Error> {
        sqlx::query_as(
            "SELECT d.id, d.record_id, d.consumer_group, d.message_id, d.actor, d.published_at, d.marker_present,
                    d.duplicates_before, d.conflicts_before, d.attempts_before,
                    r.duplicate_count, r.payload_conflicts, r.attempts, r.status
             FROM drills d LEFT JOIN dedup_records r ON r.id = d.record_id WHERE d.id = $1",
        )
        .bind(id)
        .fetch_optional(self)
        .await
    }
}
