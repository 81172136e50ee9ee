//! The records list (filters, keyset pages) and one record's detail with its attempt history
//! and Redis marker state ([`record_detail`], [`record_marker`]).

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::QueryError;
use super::filter::{Cursor, CursorKey, PageAt, RecordFilter, RecordListParams, SortKey, SortOrder};
use crate::record::RecordStatus;

/// One row of a records list.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct RecordRow {
    /// Record id.
    pub id: i64,
    /// Consumer group.
    pub consumer_group: String,
    /// Message id.
    pub message_id: String,
    /// `<entity>.<event>`, or `POISON`.
    pub message_type: String,
    /// Status.
    #[sqlx(try_from = "String")]
    pub status: RecordStatus,
    /// `transactional` or `leased`; `None` for poison messages.
    pub handler_mode: Option<String>,
    /// Handler executions so far.
    pub attempts: i32,
    /// Attempts allowed.
    pub max_attempts: i32,
    /// First delivery (database clock).
    pub first_seen_at: DateTime<Utc>,
    /// Last change.
    pub updated_at: DateTime<Utc>,
    /// For failed records: when the retry copy is due.
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// Error kind + first line of the last failure.
    pub error_class: Option<String>,
    /// Duplicate deliveries seen.
    pub duplicate_count: i32,
}

impl RecordRow {
    /// This row's position under `sort`.
    pub fn cursor(&self, sort: SortKey) -> Cursor {
        let key = match sort {
            SortKey::Time => CursorKey::Time(self.first_seen_at.timestamp_micros()),
            SortKey::Attempts => CursorKey::Attempts(self.attempts),
            SortKey::MessageId => CursorKey::MessageId(self.message_id.clone()),
        };
        Cursor { key, id: self.id }
    }
}

/// One page of a records list.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordPage {
    /// The rows, in the requested order.
    pub rows: Vec<RecordRow>,
    /// Cursor of the next page (`after`), `None` on the last page.
    pub next: Option<Cursor>,
    /// Cursor of the previous page (`before`), `None` on the first page.
    pub prev: Option<Cursor>,
    /// Set when the page searched a bounded stretch of the table and stopped short of its end:
    /// the filter has no index to narrow it in this order (a group, message type or error class
    /// over the succeeded bulk; in message-id order a type, class or time range), so a page
    /// reads at most [`SCAN_WINDOW`] records past its cursor in time order (by id), and
    /// [`INDEX_SCAN_WINDOW`] in attempts and message-id order. The id of the last record
    /// searched; `next` (or `prev`, going back) continues from there. The console says so
    /// rather than scan the whole table.
    pub searched_to: Option<i64>,
}

/// Records a page reads at most when its filter has no index (see [`RecordPage::searched_to`]):
/// a primary-key scan that filters them, 20 000 rows in about 25 ms on this project's loaded
/// 2-core machine at 10 M records (50 000 took 60 ms there; BENCHMARKS.md, "Lean write path"),
/// so a page stays under the console's 50 ms.
pub const SCAN_WINDOW: i64 = 20_000;

/// Records an attempts- or message-id-ordered page reads at most when its filter has no index
/// in that order (see [`RecordPage::searched_to`]): those are read in the order of a secondary
/// index, one row lookup each, about ten times a primary-key scan's cost per record on MariaDB
/// (20 000 took 280 ms at 1 M records on this project's loaded 2-core machine; BENCHMARKS.md).
pub const INDEX_SCAN_WINDOW: i64 = 2_000;

/// Whether a list under `filter` in order `sort` must be bounded by a window
/// ([`SCAN_WINDOW`], [`INDEX_SCAN_WINDOW`]): something
/// no index serves in that order is asked for, and nothing an index serves narrows the records
/// first. In message-id order the dedup key serves a group, and a time range is not an id range.
fn needs_window(sort: SortKey, filter: &RecordFilter) -> bool {
    let narrowed = filter.status.is_some_and(|s| s != RecordStatus::Succeeded)
        || filter.message_id.is_some()
        || filter.id_prefix.is_some()
        || filter.min_attempts.is_some_and(|n| n > 1)
        || filter.flag.is_some();
    let unindexed = filter.message_type.is_some() || filter.error_class.is_some();
    let selective = match sort {
        SortKey::Time | SortKey::Attempts => unindexed || filter.group.is_some(),
        SortKey::MessageId => unindexed || filter.from.is_some() || filter.to.is_some(),
    };
    selective && !narrowed
}

/// What one page reads of a store ([`RecordReads::record_rows`]): the rows matching `filter`
/// past `cursor` (none: from the start) in `direction` under `sort`, ties by id, at most
/// `rows`, none past `window_end` (the row at it included).
#[derive(Debug, Clone, Copy)]
pub struct RowsQuery<'a> {
    /// The filter.
    pub filter: &'a RecordFilter,
    /// The order.
    pub sort: SortKey,
    /// The row the page starts after, in `direction`; its key matches `sort`.
    pub cursor: Option<&'a Cursor>,
    /// The direction read (a previous page reads backwards).
    pub direction: SortOrder,
    /// Rows to read (a page's limit and one more, to tell whether more follow).
    pub rows: i64,
    /// The far end of a bounded search ([`SCAN_WINDOW`], [`INDEX_SCAN_WINDOW`]), included: a
    /// position in `sort` (in time order only its id counts).
    pub window_end: Option<&'a Cursor>,
}

/// The records list's reads on one database. Errors: [`QueryError::Database`].
#[async_trait]
pub trait RecordReads: Send + Sync {
    /// The rows one page reads.
    async fn record_rows(&self, query: &RowsQuery<'_>) -> Result<Vec<RecordRow>, QueryError>;

    /// The smallest and the largest record id; `None` for an empty table.
    async fn id_bounds(&self) -> Result<Option<(i64, i64)>, QueryError>;

    /// The position in attempts order `rows` records past `from` (none: from the start) in
    /// `direction`, over every record (an attempts [`Cursor`]); `None` unless a record lies past
    /// it.
    /// Reads the parts' indexes only.
    async fn attempts_window_end(
        &self,
        from: Option<&Cursor>,
        direction: SortOrder,
        rows: i64,
    ) -> Result<Option<Cursor>, QueryError>;

    /// The dedup key `rows` keys past `from` (none: from the start) in `direction`, in `group`
    /// or, without one, the nearest such key of every group, with its record's id (a message-id
    /// [`Cursor`]), of the groups with a key past it; `None` when no group has. Reads the dedup
    /// key only.
    async fn message_id_window_end(
        &self,
        group: Option<&str>,
        from: Option<&Cursor>,
        direction: SortOrder,
        rows: i64,
    ) -> Result<Option<Cursor>, QueryError>;

    /// Every stored field of record `id` (its attempt history empty); `None` when no record
    /// has this id.
    async fn record_fields(&self, id: i64) -> Result<Option<RecordDetail>, QueryError>;

    /// The attempt rows of record `id`, oldest first, each answer cut to [`ANSWER_CHARS`]
    /// characters.
    async fn attempt_rows(&self, id: i64) -> Result<Vec<AttemptRow>, QueryError>;

    /// The late duplicate record `id` is, if it is one (DESIGN.md, "Late duplicates"): when the
    /// deleted record of its message id was first seen, the delay after it (ms), and whether it
    /// was held.
    async fn late_duplicate_note(&self, id: i64) -> Result<Option<(DateTime<Utc>, i64, bool)>, QueryError>;
}

/// One page of records matching `params.filter`, ordered by `params.sort` (ties by id), by
/// keyset: a page is "the `limit` rows past a cursor", so it stays stable while new records
/// arrive and costs the same at any depth.
///
/// Time order is arrival order: the record id (the primary key), which the engine hands out as
/// records arrive; `first_seen_at` follows it within ten minutes. Attempts order reads the
/// records tried more than once (or never) apart from the first tries. Message-id order walks
/// the dedup key of each group. How each store reads them: [`RecordReads`].
///
/// Errors: [`QueryError::Database`].
pub async fn records_list(reads: &dyn RecordReads, params: &RecordListParams) -> Result<RecordPage, QueryError> {
    // A previous page reads backwards from its cursor, then flips the rows.
    let (direction, cursor) = match &params.at {
        PageAt::First => (params.order, None),
        PageAt::After(c) => (params.order, Some(c)),
        PageAt::Before(c) => (params.order.reversed(), Some(c)),
    };
    let window = if needs_window(params.sort, &params.filter) {
        Window::of(reads, params, cursor, direction).await?
    } else {
        None
    };
    let query = RowsQuery {
        filter: &params.filter,
        sort: params.sort,
        cursor,
        direction,
        rows: params.limit + 1,
        window_end: window.as_ref().map(|w| &w.end),
    };
    let mut rows = reads.record_rows(&query).await?;
    let more = rows.len() as i64 > params.limit;
    rows.truncate(params.limit as usize);
    // The window stopped the search short: the page continues from its far end.
    let resume = window.filter(|w| w.short && !more).map(|w| w.end);
    let searched_to = resume.as_ref().map(|c| c.id);
    let backwards = matches!(params.at, PageAt::Before(_));
    if backwards {
        rows.reverse();
    }
    let first = rows.first().map(|r| r.cursor(params.sort));
    let last = rows.last().map(|r| r.cursor(params.sort));
    let (next, prev) = match params.at {
        PageAt::First => (last.filter(|_| more).or(resume), None),
        PageAt::After(ref c) => (last.filter(|_| more).or(resume), first.or_else(|| Some(c.clone()))),
        PageAt::Before(ref c) => (last.or_else(|| Some(c.clone())), first.filter(|_| more).or(resume)),
    };
    Ok(RecordPage { rows, next, prev, searched_to })
}

/// The stretch a page under a filter without an index searches: [`SCAN_WINDOW`] ids, or
/// [`INDEX_SCAN_WINDOW`] positions in attempts or message-id order, from its cursor (or from the
/// start) in its direction.
#[derive(Debug, Clone)]
struct Window {
    /// The far end, included.
    end: Cursor,
    /// Whether records lie beyond it.
    short: bool,
}

impl Window {
    /// `None` for an empty table, and in attempts or message-id order when no record lies past
    /// the window. Two probes of the primary key's ends, or one read of an index.
    async fn of(
        reads: &dyn RecordReads,
        params: &RecordListParams,
        cursor: Option<&Cursor>,
        direction: SortOrder,
    ) -> Result<Option<Self>, QueryError> {
        let end = match params.sort {
            SortKey::Time => {
                let Some((min, max)) = reads.id_bounds().await? else { return Ok(None) };
                let from = cursor.map(|c| c.id);
                let (end, short) = match direction {
                    SortOrder::Desc => {
                        let end = from.unwrap_or(max + 1) - SCAN_WINDOW;
                        (end, end > min)
                    }
                    SortOrder::Asc => {
                        let end = from.unwrap_or(min - 1) + SCAN_WINDOW;
                        (end, end < max)
                    }
                };
                return Ok(Some(Self { end: Cursor { key: CursorKey::Time(0), id: end }, short }));
            }
            SortKey::Attempts => reads.attempts_window_end(cursor, direction, INDEX_SCAN_WINDOW).await?,
            SortKey::MessageId => {
                let group = params.filter.group.as_deref();
                reads.message_id_window_end(group, cursor, direction, INDEX_SCAN_WINDOW).await?
            }
        };
        Ok(end.map(|end| Self { end, short: true }))
    }
}

mod detail;
pub use detail::{
    ANSWER_CHARS, AttemptRow, MarkerState, RecordDetail, UNRECORDED_WORKER, record_detail, record_marker,
};
