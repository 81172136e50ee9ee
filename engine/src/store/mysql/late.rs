//! Late duplicates on MySQL (DESIGN.md, "Late duplicates"; `postgres/late.rs`): the lookup of a
//! batch's deliveries in `dedup_fingerprints`, the notes in `late_duplicates`, and a late
//! duplicate held for an operator as a parked record. Cleanup's delete batches write the
//! fingerprints (`cleanup.rs`).

use std::collections::{BTreeMap, BTreeSet};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::types::Json;
use uuid::Uuid;

use super::claims::id_source_code;
use super::{MySqlStore, sql, text};
use crate::db::storable::{self, Storable};
use crate::record::ConsumerGroup;
use crate::store::StoreError;
use crate::store::{HeldDelivery, LATE_DUPLICATE_CLASS};
use crate::store::roles::LateFingerprints;

#[async_trait]
impl LateFingerprints for MySqlStore {
    async fn fingerprint_matches(
        &self,
        group: &ConsumerGroup,
        ids: &[&str],
        types: &[&str],
    ) -> Result<Vec<(String, DateTime<Utc>)>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let sql = self.render(&sql::fingerprint_matches(ids.len()));
        let mut query = sqlx::query(&sql);
        for (id, message_type) in ids.iter().zip(types) {
            query = query.bind(*id).bind(*message_type);
        }
        let rows = query.bind(group.as_str()).fetch_all(&self.pool).await?;
        let matches = rows.iter().map(|row| Ok((text(row, "message_id")?, row.try_get("first_seen_at")?)));
        matches.collect::<Result<_, sqlx::Error>>().map_err(Into::into)
    }

    /// On the pool, after the batch committed. One statement notes them, a second reads back
    /// the delays of those it noted (by its nonce).
    async fn note_late_duplicates(
        &self,
        group: &ConsumerGroup,
        matches: &[(String, DateTime<Utc>)],
    ) -> Result<Vec<i64>, StoreError> {
        if matches.is_empty() {
            return Ok(Vec::new());
        }
        let nonce = Uuid::new_v4();
        let sql = self.render(&sql::note_late_duplicates(matches.len()));
        let mut query = sqlx::query(&sql).bind(nonce);
        for (id, first_seen_at) in matches {
            query = query.bind(id.as_str()).bind(*first_seen_at);
        }
        query = query.bind(group.as_str());
        for (id, _) in matches {
            query = query.bind(id.as_str());
        }
        query.execute(&self.pool).await?;
        Ok(sqlx::query_scalar(&self.render(sql::NOTED)).bind(nonce).fetch_all(&self.pool).await?)
    }

    /// In a transaction of its own: the record (its nonce read back tells whether this created
    /// it), its count delta and message type, and its note.
    async fn hold_late_duplicate(&self, d: &HeldDelivery<'_>) -> Result<Option<(i64, i64)>, StoreError> {
        let m = Storable::of(d.message);
        let reason = d.reason();
        let nonce = Uuid::new_v4();
        let mut tx = self.pool.begin().await?;
        sqlx::query(&self.render(&sql::hold_late_duplicate()))
            .bind(d.group.as_str())
            .bind(d.message_id.as_str())
            .bind(d.message_type)
            .bind(d.handler_mode.as_str())
            .bind(d.max_attempts)
            .bind(Uuid::new_v4())
            .bind(storable::text(&reason))
            .bind(LATE_DUPLICATE_CLASS)
            .bind(d.payload_hash)
            .bind(&d.message.payload[..])
            .bind(Json(&m.headers))
            .bind(m.content_type.as_deref())
            .bind(d.message.broker.as_str())
            .bind(m.exchange.as_deref())
            .bind(m.routing_key.as_deref())
            .bind(m.queue.as_deref())
            .bind(m.type_property.as_deref())
            .bind(id_source_code(Some(d.id_source)))
            .bind(nonce)
            .execute(&mut *tx)
            .await?;
        let held = sqlx::query(&self.render(sql::HELD_LATE_DUPLICATE))
            .bind(d.first_seen_at)
            .bind(nonce)
            .fetch_optional(&mut *tx)
            .await?;
        let Some(held) = held else {
            // Its record exists; the statement changed nothing but locked it: let go at once.
            tx.rollback().await?;
            return Ok(None);
        };
        let (id, delay_ms): (i64, i64) = (held.try_get("id")?, held.try_get("delay_ms")?);
        let group = d.group.as_str();
        self.add_counts(&mut tx, group, &BTreeMap::from([("processing", 1)])).await?;
        self.add_types(&mut tx, &BTreeSet::from([d.message_type])).await?;
        sqlx::query(&self.render(sql::NOTE_HELD))
            .bind(id)
            .bind(group)
            .bind(d.message_id.as_str())
            .bind(d.first_seen_at)
            .bind(delay_ms)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(Some((id, delay_ms)))
    }
}
