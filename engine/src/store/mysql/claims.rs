//! The claims of the MySQL store: one `INSERT … ON DUPLICATE KEY UPDATE` per batch, its nonce
//! read back in place of `RETURNING`, the duplicate check of the rows it did not take, and the
//! bookkeeping PostgreSQL's statement does in the same statement (count deltas, message types,
//! attempt rows of retries).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use chrono::{DateTime, Utc};
use sqlx::mysql::MySqlRow;
use sqlx::types::Json;
use sqlx::{MySqlConnection, Row};
use uuid::Uuid;

use super::{MySqlStore, sql, text};
use crate::db::storable::Storable;
use crate::message::{IdSourceKind, InboundMessage};
use crate::record::MessageId;
use crate::store::{ClaimAs, ClaimBatch, ClaimOutcome, ClaimedRecord, ExistingRecord, StoreError};

/// One message of a claim, as the store binds it (a batch item, or the testing-only single
/// claim, which stores no id source, as PostgreSQL's does not).
pub(super) struct Claim<'a> {
    pub message_id: &'a MessageId,
    pub message_type: &'a str,
    pub payload_hash: &'a [u8],
    pub message: &'a InboundMessage,
    pub id_source: Option<IdSourceKind>,
    /// Leased claims: whether an expired lease of its record may be taken over.
    pub reclaim: bool,
    /// Leased claims: whether its effect starts at once (`None`: unknown, the testing-only
    /// single claim, as PostgreSQL's).
    pub starts_at_once: Option<bool>,
}

/// `CHAR(1)` of an id source ([`IdSourceKind::code`]).
pub(super) fn id_source_code(kind: Option<IdSourceKind>) -> Option<String> {
    kind.map(|k| char::from(u8::try_from(k.code()).unwrap_or(b'?')).to_string())
}

/// A row the claim took, as read back by its nonce.
struct Taken {
    record: ClaimedRecord,
    /// The status it was taken from; `None` for a record the claim created.
    from: Option<String>,
}

impl MySqlStore {
    /// Claims `claims` (distinct message ids) as `claim_as` says, for [`crate::store::DedupStore::claim_many`].
    /// The statements run on `conn` in whatever transaction it is in: a transactional claim's
    /// caller holds one (the rows stay locked until it ends).
    pub(super) async fn claim_rows(
        &self,
        conn: &mut MySqlConnection,
        batch: &ClaimBatch<'_>,
        claims: &[Claim<'_>],
    ) -> Result<Vec<ClaimOutcome>, StoreError> {
        if claims.is_empty() {
            return Ok(Vec::new());
        }
        let leased = batch.claim_as == ClaimAs::Leased;
        // One lock order for every batch: by message id, byte-wise (as the VARBINARY key sorts).
        let mut order: Vec<usize> = (0..claims.len()).collect();
        order.sort_by(|&a, &b| claims[a].message_id.as_str().cmp(claims[b].message_id.as_str()));
        let nonce = Uuid::new_v4();
        let stored: Vec<Storable<'_>> = claims.iter().map(|c| Storable::of(c.message)).collect();
        let reclaim: Vec<&str> = claims.iter().filter(|c| leased && c.reclaim).map(|c| c.message_id.as_str()).collect();
        let sql = self.render(&sql::claim_many(claims.len(), batch.claim_as, reclaim.len()));
        let mut query = sqlx::query(&sql);
        for &i in &order {
            let (c, s) = (&claims[i], &stored[i]);
            query = query
                .bind(batch.group.as_str())
                .bind(c.message_id.as_str())
                .bind(c.message_type)
                .bind(batch.max_attempts);
            if batch.claim_as != ClaimAs::Succeeded {
                query = query.bind(&batch.lease.owner).bind(batch.lease.token).bind(batch.lease.millis());
            }
            query = query.bind(c.payload_hash).bind(s.content_type.as_deref());
            if leased {
                query = query.bind(s.type_property.as_deref());
            }
            query = query
                .bind(c.message.broker.as_str())
                .bind(s.exchange.as_deref())
                .bind(s.routing_key.as_deref())
                .bind(s.queue.as_deref())
                .bind(id_source_code(c.id_source))
                .bind(nonce);
            if leased {
                query = query.bind(&c.message.payload).bind(Json(&s.headers)).bind(c.starts_at_once);
            }
        }
        if leased {
            if reclaim.is_empty() {
                query = query.bind(""); // no message id is empty
            }
            for id in &reclaim {
                query = query.bind(*id);
            }
        }
        query.execute(&mut *conn).await?;

        let rows = sqlx::query(&self.render(sql::CLAIMED)).bind(nonce).fetch_all(&mut *conn).await?;
        let mut taken: HashMap<String, Taken> = HashMap::with_capacity(rows.len());
        for row in &rows {
            let t = taken_from_row(row, batch)?;
            taken.insert(text(row, "message_id")?, t);
        }
        if leased {
            self.open_leased_attempts(conn, batch, claims, &mut taken).await?;
        }
        self.book_claims(conn, batch, claims, &taken).await?;

        let rest: Vec<usize> = order.iter().copied().filter(|&i| !taken.contains_key(claims[i].message_id.as_str())).collect();
        let mut seen = self.note_duplicates(conn, batch.group.as_str(), claims, &rest).await?;
        claims
            .iter()
            .map(|c| {
                let id = c.message_id.as_str();
                if let Some(t) = taken.remove(id) {
                    Ok(ClaimOutcome::Claimed(t.record))
                } else {
                    // The ODKU left a row for every id: inserted (ours) or existing, locked.
                    seen.remove(id).map(ClaimOutcome::Existing).ok_or_else(|| {
                        StoreError::Database(sqlx::Error::Protocol(format!("no record for {id} after its claim")))
                    })
                }
            })
            .collect()
    }

    /// A leased claim's attempt rows: the runs so far of the records it took over
    /// ([`ClaimedRecord::calls`], `previous_status`), the superseded attempts closed as
    /// `lease_lost`, and one attempt opened per claim, named by its endpoint (group and type).
    async fn open_leased_attempts(
        &self,
        conn: &mut MySqlConnection,
        batch: &ClaimBatch<'_>,
        claims: &[Claim<'_>],
        taken: &mut HashMap<String, Taken>,
    ) -> Result<(), StoreError> {
        if taken.is_empty() {
            return Ok(());
        }
        let again: Vec<i64> = taken.values().filter(|t| !t.record.created).map(|t| t.record.id).collect();
        if !again.is_empty() {
            let sql = self.render(&sql::prior_runs(again.len()));
            let mut query = sqlx::query(&sql);
            for id in &again {
                query = query.bind(*id);
            }
            let mut runs: HashMap<i64, (i64, Option<i16>)> = HashMap::new();
            for row in query.fetch_all(&mut *conn).await? {
                runs.insert(row.try_get("record_id")?, (row.try_get("runs")?, row.try_get("previous_status")?));
            }
            for t in taken.values_mut().filter(|t| !t.record.created) {
                let (n, previous) = runs.get(&t.record.id).copied().unwrap_or((0, None));
                t.record.calls = i32::try_from(n).unwrap_or(i32::MAX).saturating_add(1);
                t.record.previous_status = previous.and_then(|s| u16::try_from(s).ok());
            }
            let sql = self.render(&sql::close_superseded(again.len()));
            let mut query = sqlx::query(&sql).bind(&batch.lease.owner).bind(&batch.lease.owner);
            for t in taken.values().filter(|t| !t.record.created) {
                query = query.bind(t.record.id).bind(t.record.attempt);
            }
            query.execute(&mut *conn).await?;
        }
        let sql = self.render(&sql::open_attempts(taken.len()));
        let mut query = sqlx::query(&sql);
        for c in claims {
            if let Some(t) = taken.get(c.message_id.as_str()) {
                query = query
                    .bind(t.record.id)
                    .bind(t.record.attempt)
                    .bind(&batch.lease.owner)
                    .bind(batch.group.as_str())
                    .bind(c.message_type);
            }
        }
        query.execute(&mut *conn).await?;
        Ok(())
    }

    /// The count deltas, message types and attempt rows of the rows a claim took: a created
    /// record counts under its new status, a taken one moves from its old status; a claim into
    /// `succeeded` of a retry writes its attempt row (a first try writes none).
    async fn book_claims(
        &self,
        conn: &mut MySqlConnection,
        batch: &ClaimBatch<'_>,
        claims: &[Claim<'_>],
        taken: &HashMap<String, Taken>,
    ) -> Result<(), StoreError> {
        if taken.is_empty() {
            return Ok(());
        }
        let mut deltas: BTreeMap<&str, i64> = BTreeMap::new();
        for t in taken.values() {
            *deltas.entry(batch.claim_as.as_str()).or_default() += 1;
            if let Some(from) = &t.from {
                *deltas.entry(from.as_str()).or_default() -= 1;
            }
        }
        self.add_counts(conn, batch.group.as_str(), &deltas).await?;
        let types: BTreeSet<&str> =
            claims.iter().filter(|c| taken.contains_key(c.message_id.as_str())).map(|c| c.message_type).collect();
        self.add_types(conn, &types).await?;
        if batch.claim_as == ClaimAs::Succeeded {
            let retries: Vec<(&ClaimedRecord, DateTime<Utc>)> =
                taken.values().filter(|t| t.record.attempt > 1).map(|t| (&t.record, t.record.claimed_at)).collect();
            self.add_attempts(conn, &batch.lease.owner, &retries, "succeeded", None).await?;
        }
        Ok(())
    }

    /// The duplicate check of `rest` (indexes into `claims`): judged with one clock reading,
    /// then counted (a delivery under a live lease is sent back uncounted; one of another type
    /// is no duplicate; a stuck record's delivery is parked). By message id.
    async fn note_duplicates(
        &self,
        conn: &mut MySqlConnection,
        group: &str,
        claims: &[Claim<'_>],
        rest: &[usize],
    ) -> Result<HashMap<String, ExistingRecord>, StoreError> {
        if rest.is_empty() {
            return Ok(HashMap::new());
        }
        let sql = self.render(&sql::judge_duplicates(rest.len()));
        let mut query = sqlx::query(&sql).bind(group);
        for &i in rest {
            query = query.bind(claims[i].message_id.as_str());
        }
        let rows = query.fetch_all(&mut *conn).await?;
        let by_id: HashMap<&str, &Claim<'_>> = rest.iter().map(|&i| (claims[i].message_id.as_str(), &claims[i])).collect();
        let mut seen = HashMap::with_capacity(rows.len());
        let (mut dups, mut conflicts, mut parks, mut all) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for row in &rows {
            let message_id = text(row, "message_id")?;
            let Some(delivery) = by_id.get(message_id.as_str()) else { continue };
            let status: String = text(row, "status")?;
            let stored_hash: Vec<u8> = row.try_get("payload_hash")?;
            let same_type = same_type(row, delivery, &stored_hash)?;
            let same_payload = stored_hash == delivery.payload_hash;
            let lease_expired: bool = row.try_get("lease_expired")?;
            let live: bool = row.try_get("lease_live")?;
            let parked = status == "processing" && lease_expired && same_type;
            let dup = same_type && !live;
            let id: i64 = row.try_get("id")?;
            if dup {
                dups.push(id);
                if !same_payload {
                    conflicts.push(id);
                }
            }
            if parked {
                parks.push(id);
            }
            if dup || parked {
                all.push(id);
            }
            let existing = ExistingRecord {
                id,
                status: status.parse().map_err(|e| sqlx::Error::Decode(Box::new(e)))?,
                lease_expired,
                lease_expires_at: row.try_get("lease_expires_at")?,
                same_payload,
                same_type,
                delay_ms: row.try_get::<Option<i64>, _>("delay_ms")?.unwrap_or_default(),
                parked,
            };
            seen.insert(message_id, existing);
        }
        if !all.is_empty() {
            let sql = self.render(&sql::note_duplicates(dups.len(), conflicts.len(), parks.len(), all.len()));
            let mut query = sqlx::query(&sql);
            for list in [&dups, &dups, &conflicts, &parks, &all] {
                if list.is_empty() {
                    query = query.bind(-1_i64);
                }
                for id in list {
                    query = query.bind(*id);
                }
            }
            query.execute(&mut *conn).await?;
        }
        Ok(seen)
    }
}

fn taken_from_row(row: &MySqlRow, batch: &ClaimBatch<'_>) -> Result<Taken, sqlx::Error> {
    let attempts: i32 = row.try_get("attempts")?;
    let created: bool = row.try_get("created")?;
    let from = if created { None } else { row.try_get::<Option<Vec<u8>>, _>("claimed_from")?.map(lossy) };
    Ok(Taken {
        record: ClaimedRecord {
            id: row.try_get("id")?,
            attempt: attempts,
            max_attempts: row.try_get("max_attempts")?,
            created,
            took_over: from.as_deref() == Some("processing"),
            first_seen_at: row.try_get("first_seen_at")?,
            claimed_at: row.try_get("claimed_at")?,
            lease_token: batch.lease.token,
            calls: attempts,
            previous_status: None,
        },
        from,
    })
}

/// `same_type!` of `postgres/sql.rs`, judged on the record's `row` as read by the duplicate
/// check: the delivery is of the record's type, or the record is dead for want of a handler
/// (`NO_HANDLER:` error class) and the delivery is its own message typed anew (the same payload,
/// or the record found no type). Byte-wise, as the columns compare.
fn same_type(row: &MySqlRow, delivery: &Claim<'_>, stored_hash: &[u8]) -> Result<bool, sqlx::Error> {
    let stored_type: Vec<u8> = row.try_get("message_type")?;
    let error_class: Option<Vec<u8>> = row.try_get("error_class")?;
    let no_handler = error_class.is_some_and(|c| c.starts_with(b"NO_HANDLER:"));
    Ok(stored_type == delivery.message_type.as_bytes()
        || (no_handler && (stored_type == b"UNKNOWN" || stored_hash == delivery.payload_hash)))
}

fn lossy(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}
