//! The copies of conflicting deliveries on MySQL (DESIGN.md, "Reused ids and payload
//! conflicts"; `postgres/conflicts.rs`): one row per record and distinct payload in
//! `record_conflicts`, written on the caller's connection — in the transaction that judges the
//! deliveries (transactional) or before they are acknowledged (leased).

use async_trait::async_trait;
use sqlx::{Connection, MySqlConnection};
use sqlx::types::Json;

use super::{MySqlStore, sql};
use crate::db::storable::Storable;
use crate::record::ConsumerGroup;
use crate::store::{ConflictCopy, MAX_OPEN_PAYLOAD_COPIES, StoreError, all_locked, records_of};
use crate::store::roles::ConflictCopies;

#[async_trait]
impl ConflictCopies for MySqlStore {
    async fn keep_conflicts(
        &self,
        conn: &mut MySqlConnection,
        group: &ConsumerGroup,
        copies: &[ConflictCopy<'_>],
    ) -> Result<(), StoreError> {
        let rows = ConflictCopy::per_payload(copies);
        if rows.is_empty() {
            return Ok(());
        }
        // The records first, locked in id order (the leased path runs this alone, a transaction
        // of its own; the transactional one in the claim's, which holds them already): the
        // statement counts a record's open payload conflicts, and without the lock concurrent
        // workers all count the same few and pass the limit (a review saw 7-8 open rows of 5
        // under eight leased workers; PostgreSQL's keeper takes the same lock). A cleanup batch skips a
        // locked record, and one it deleted first is gone.
        let records = records_of(&rows);
        let mut tx = conn.begin().await?;
        let lock = self.render(&sql::lock_records(records.len()));
        let mut query = sqlx::query_scalar(&lock);
        for id in &records {
            query = query.bind(id);
        }
        let locked: Vec<i64> = query.fetch_all(&mut *tx).await?;
        all_locked(&records, &locked)?;
        let stored: Vec<Storable<'_>> = rows.iter().map(|(c, _)| Storable::of(c.message)).collect();
        let sql = self.render(&sql::keep_conflicts(rows.len()));
        let mut query = sqlx::query(&sql).bind(group.as_str());
        for ((c, n), m) in rows.iter().zip(&stored) {
            query = query
                .bind(c.record_id)
                .bind(c.message_id)
                .bind(c.kind.as_str())
                .bind(c.message_type)
                .bind(c.id_source.as_str())
                .bind(c.payload_hash)
                .bind(&c.message.payload[..])
                .bind(Json(&m.headers))
                .bind(m.content_type.as_deref())
                .bind(m.type_property.as_deref())
                .bind(c.message.broker.as_str())
                .bind(m.exchange.as_deref())
                .bind(m.routing_key.as_deref())
                .bind(m.queue.as_deref())
                .bind(*n);
        }
        query.bind(MAX_OPEN_PAYLOAD_COPIES).execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(())
    }
}
