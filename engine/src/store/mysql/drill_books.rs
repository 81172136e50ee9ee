//! MySQL's duplicate drills ([`DrillBooks`]; migration `20261205000009`): the record drilled, a
//! drill's row written in the operator's transaction (its id read back as `LAST_INSERT_ID()`,
//! no `RETURNING`), a drill beside its record's counters now. Text and bytes are read `AS CHAR`.

use async_trait::async_trait;
use sqlx::mysql::MySqlPool;

use super::operator_tx::MySqlOperatorTx;
use crate::actions::OperatorTx;
use crate::actions::drill::{DrillBooks, DrillRecord, DrillRow, DrillTarget};

const TARGET: &str = "SELECT id, CAST(consumer_group AS CHAR) AS consumer_group, CAST(message_id AS CHAR) AS message_id,
                             CAST(status AS CHAR) AS status, CAST(source_broker AS CHAR) AS source_broker,
                             CAST(source_exchange AS CHAR) AS source_exchange,
                             CAST(source_routing_key AS CHAR) AS source_routing_key, duplicate_count,
                             payload_conflicts, attempts, payload_hash
                      FROM dedup_records";

#[async_trait]
impl DrillBooks for MySqlPool {
    async fn drill_target(&self, target: &DrillTarget) -> Result<Option<DrillRecord>, sqlx::Error> {
        match target {
            DrillTarget::Record(id) => {
                sqlx::query_as(&format!("{TARGET} WHERE id = ?")).bind(id).fetch_optional(self).await
            }
            DrillTarget::LatestOfType(t) => {
                sqlx::query_as(&format!(
                    "{TARGET} WHERE status = 'succeeded' AND message_type = ? ORDER BY first_seen_at DESC, id DESC LIMIT 1"
                ))
                .bind(t.as_bytes())
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
        let inserted = sqlx::query(
            "INSERT INTO drills (record_id, consumer_group, message_id, actor, marker_present, duplicates_before,
                                 conflicts_before, attempts_before)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(record.id)
        .bind(record.consumer_group.as_bytes())
        .bind(record.message_id.as_bytes())
        .bind(actor)
        .bind(marker_present)
        .bind(record.duplicate_count)
        .bind(record.payload_conflicts)
        .bind(record.attempts)
        .execute(&mut *tx)
        .await?;
        let id = i64::try_from(inserted.last_insert_id())
            .map_err(|_| sqlx::Error::Protocol("a drill id past i64".to_owned()))?;
        Ok((id, Box::new(MySqlOperatorTx(tx))))
    }

    async fn drill_row(&self, id: i64) -> Result<Option<DrillRow>, sqlx::Error> {
        sqlx::query_as(
            "SELECT d.id, d.record_id, CAST(d.consumer_group AS CHAR) AS consumer_group,
                    CAST(d.message_id AS CHAR) AS message_id, CAST(d.actor AS CHAR) AS actor, d.published_at,
                    d.marker_present, d.duplicates_before, d.conflicts_before, d.attempts_before,
                    r.duplicate_count, r.payload_conflicts, r.attempts, CAST(r.status AS CHAR) AS status
             FROM drills d LEFT JOIN dedup_records r ON r.id = d.record_id WHERE d.id = ?",
        )
        .bind(id)
        .fetch_optional(self)
        .await
    }
}
