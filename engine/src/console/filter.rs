//! Record filters, sort orders and keyset cursors, parsed from the text a URL or a form carries.
//!
//! Every value is validated here, once, for the server functions and the REST API alike: an
//! unknown status, a malformed time, a search string longer than a message id may be or a cursor that
//! does not match the sort is a [`QueryError::BadFilter`] with a message an operator understands.

use chrono::{DateTime, NaiveDate, NaiveDateTime, Utc};

use super::QueryError;
use crate::record::{MAX_MESSAGE_ID_BYTES, RecordStatus};

/// Longest search string (message id or prefix, group, type, error class), in bytes.
pub(crate) const MAX_SEARCH_BYTES: usize = MAX_MESSAGE_ID_BYTES;
/// Rows per page when none is asked for.
pub(crate) const DEFAULT_PAGE_SIZE: i64 = 50;
/// Most rows per page.
pub(crate) const MAX_PAGE_SIZE: i64 = 500;

/// The filters as text (a URL query string, a form, CLI flags). Empty strings mean "no filter".
#[derive(Debug, Clone, Copy, Default)]
pub struct FilterText<'a> {
    /// Consumer group, exact.
    pub group: Option<&'a str>,
    /// `processing`, `succeeded`, `failed` or `dead`.
    pub status: Option<&'a str>,
    /// Message type (`ORDER.PAY`), exact.
    pub message_type: Option<&'a str>,
    /// Error class, exact (a dead-letter group's drill-down).
    pub error_class: Option<&'a str>,
    /// First seen at or after: RFC 3339, `YYYY-MM-DDTHH:MM[:SS]` (UTC) or `YYYY-MM-DD`.
    pub from: Option<&'a str>,
    /// First seen before (same formats).
    pub to: Option<&'a str>,
    /// Attempts at least this many (a non-negative integer).
    pub min_attempts: Option<&'a str>,
    /// Message id, exact.
    pub message_id: Option<&'a str>,
    /// Message id prefix.
    pub id_prefix: Option<&'a str>,
    /// A mark an operator checks ([`RecordFlag`]): `double_effect`.
    pub flag: Option<&'a str>,
    /// `time` (default) or `attempts`.
    pub sort: Option<&'a str>,
    /// `desc` (default) or `asc`.
    pub order: Option<&'a str>,
    /// Cursor: rows after this one (the next page).
    pub after: Option<&'a str>,
    /// Cursor: rows before this one (the previous page).
    pub before: Option<&'a str>,
    /// Rows per page, 1 to 500.
    pub limit: Option<&'a str>,
}

/// Which records a list shows (or a bulk requeue selects). `None` fields do not filter.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct RecordFilter {
    /// Consumer group.
    pub group: Option<String>,
    /// Status.
    pub status: Option<RecordStatus>,
    /// Message type.
    pub message_type: Option<String>,
    /// Error class.
    pub error_class: Option<String>,
    /// First seen at or after.
    pub from: Option<DateTime<Utc>>,
    /// First seen before.
    pub to: Option<DateTime<Utc>>,
    /// Attempts at least.
    pub min_attempts: Option<i32>,
    /// Message id, exact.
    pub message_id: Option<String>,
    /// Message id prefix.
    pub id_prefix: Option<String>,
    /// Only records carrying this mark.
    pub flag: Option<RecordFlag>,
}

/// A mark on a record that an operator should check, listed by the `flag` filter (each set is
/// small and has an index of its own, so the filter narrows before anything else).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordFlag {
    /// Possible double effect: an attempt's effect ran after its lease was lost, so the effect
    /// may have run twice (the overview's "possible double effects" count, the record page's
    /// warning; partial index `record_attempts_late_effect_idx`).
    DoubleEffect,
    /// Late duplicate: a record created by a copy that came back after cleanup deleted the
    /// record of the same message id (known by its fingerprint; the Cleanup page's late
    /// duplicates; table `late_duplicates`).
    LateDuplicate,
    /// Conflict: a record whose message id came again with another message type (a reused id)
    /// or another payload, with a kept copy not requeued yet (the overview's "id conflicts";
    /// table `record_conflicts`).
    Conflict,
}

impl RecordFlag {
    /// Every flag, as the console offers them.
    pub const ALL: [RecordFlag; 3] = [RecordFlag::DoubleEffect, RecordFlag::LateDuplicate, RecordFlag::Conflict];

    /// The text form (`double_effect`), as in URLs.
    pub fn as_str(self) -> &'static str {
        match self {
            RecordFlag::DoubleEffect => "double_effect",
            RecordFlag::LateDuplicate => "late_duplicate",
            RecordFlag::Conflict => "conflict",
        }
    }

    /// Parses the text form.
    ///
    /// Errors: [`QueryError::BadFilter`] naming the flags there are.
    pub fn parse(text: &str) -> Result<Self, QueryError> {
        Self::ALL.into_iter().find(|f| f.as_str() == text).ok_or_else(|| {
            let known: Vec<&str> = Self::ALL.iter().map(|f| f.as_str()).collect();
            QueryError::BadFilter(format!("unknown flag {:?}; expected {}", clip(text), known.join(" or ")))
        })
    }
}

/// The column a list is ordered by (ties broken by record id).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SortKey {
    /// First seen.
    #[default]
    Time,
    /// Attempts.
    Attempts,
    /// Message id (byte order). The order of a prefix search: it walks the message-id index, so
    /// it is fast however many records match.
    MessageId,
}

/// Ascending or descending.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SortOrder {
    /// Largest first (newest, most attempts).
    #[default]
    Desc,
    /// Smallest first.
    Asc,
}

impl SortOrder {
    /// The other direction.
    pub(crate) fn reversed(self) -> Self {
        match self {
            SortOrder::Desc => SortOrder::Asc,
            SortOrder::Asc => SortOrder::Desc,
        }
    }

    /// The SQL comparison of a row past another in this direction (`<` descending, `>`
    /// ascending), `inclusive` with `=` after it. A row not past a far end passes
    /// `reversed().past(true)`.
    pub(crate) fn past(self, inclusive: bool) -> &'static str {
        match (self, inclusive) {
            (SortOrder::Desc, false) => "<",
            (SortOrder::Desc, true) => "<=",
            (SortOrder::Asc, false) => ">",
            (SortOrder::Asc, true) => ">=",
        }
    }
}

/// The sort-key value of a cursor's row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CursorKey {
    /// First seen, Unix microseconds.
    Time(i64),
    /// Attempts.
    Attempts(i32),
    /// Message id.
    MessageId(String),
}

/// A position in a sorted list: the sort key of one row and its id. Encoded in URLs as
/// `t<unix microseconds>.<id>` (time), `a<attempts>.<id>` (attempts) or `m<id>.<message id>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    /// The row's sort key.
    pub key: CursorKey,
    /// Record id.
    pub id: i64,
}

impl Cursor {
    /// The sort the cursor belongs to.
    pub fn sort(&self) -> SortKey {
        match self.key {
            CursorKey::Time(_) => SortKey::Time,
            CursorKey::Attempts(_) => SortKey::Attempts,
            CursorKey::MessageId(_) => SortKey::MessageId,
        }
    }

    /// The text form (see [`Cursor`]).
    pub fn encode(&self) -> String {
        match &self.key {
            CursorKey::Time(t) => format!("t{t}.{}", self.id),
            CursorKey::Attempts(n) => format!("a{n}.{}", self.id),
            CursorKey::MessageId(m) => format!("m{}.{m}", self.id),
        }
    }

    /// Parses the text form; the cursor must belong to `sort`.
    pub fn decode(text: &str, sort: SortKey) -> Result<Self, QueryError> {
        let bad = || QueryError::BadFilter(format!("invalid page cursor {:?}", clip(text)));
        let (tag, rest) = text.split_at_checked(1).ok_or_else(bad)?;
        let (first, second) = rest.split_once('.').ok_or_else(bad)?;
        let cursor = match tag {
            "t" => Cursor {
                key: CursorKey::Time(first.parse().map_err(|_| bad())?),
                id: second.parse().map_err(|_| bad())?,
            },
            "a" => Cursor {
                key: CursorKey::Attempts(first.parse().map_err(|_| bad())?),
                id: second.parse().map_err(|_| bad())?,
            },
            "m" => Cursor { key: CursorKey::MessageId(second.to_owned()), id: first.parse().map_err(|_| bad())? },
            _ => return Err(bad()),
        };
        if cursor.sort() != sort {
            return Err(QueryError::BadFilter("the page cursor belongs to another sort order".to_owned()));
        }
        Ok(cursor)
    }
}

/// Which page of a sorted list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum PageAt {
    /// From the start.
    #[default]
    First,
    /// The rows after a cursor (next page).
    After(Cursor),
    /// The rows before a cursor (previous page).
    Before(Cursor),
}

/// A records-list request: filter, order and page.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecordListParams {
    /// Which records.
    pub filter: RecordFilter,
    /// Order by.
    pub sort: SortKey,
    /// Direction.
    pub order: SortOrder,
    /// Which page.
    pub at: PageAt,
    /// Rows per page.
    pub limit: i64,
}

/// First 40 characters of a value, for error messages.
fn clip(value: &str) -> String {
    value.chars().take(40).collect()
}

/// A search value: `None` when absent or blank; refused when longer than [`MAX_SEARCH_BYTES`]
/// or when it holds a control character.
fn search_text(name: &str, value: Option<&str>) -> Result<Option<String>, QueryError> {
    let Some(value) = value.map(str::trim).filter(|v| !v.is_empty()) else { return Ok(None) };
    if value.len() > MAX_SEARCH_BYTES {
        return Err(QueryError::BadFilter(format!(
            "{name} is {} bytes long; the limit is {MAX_SEARCH_BYTES}",
            value.len()
        )));
    }
    if value.chars().any(char::is_control) {
        return Err(QueryError::BadFilter(format!("{name} contains a control character")));
    }
    Ok(Some(value.to_owned()))
}

fn present(value: Option<&str>) -> Option<&str> {
    value.map(str::trim).filter(|v| !v.is_empty())
}

/// Parses a time: RFC 3339, `YYYY-MM-DDTHH:MM[:SS]` (UTC, as an HTML `datetime-local` input
/// sends it) or `YYYY-MM-DD` (midnight UTC).
pub fn parse_time(name: &str, value: &str) -> Result<DateTime<Utc>, QueryError> {
    if let Ok(t) = DateTime::parse_from_rfc3339(value) {
        return Ok(t.with_timezone(&Utc));
    }
    for format in ["%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M"] {
        if let Ok(t) = NaiveDateTime::parse_from_str(value, format) {
            return Ok(t.and_utc());
        }
    }
    if let Ok(d) = NaiveDate::parse_from_str(value, "%Y-%m-%d") {
        return Ok(d.and_hms_opt(0, 0, 0).unwrap_or_default().and_utc());
    }
    Err(QueryError::BadFilter(format!(
        "{name} {:?} is not a time; use RFC 3339 (2026-01-31T08:00:00Z) or 2026-01-31T08:00",
        clip(value)
    )))
}

impl RecordFilter {
    /// Validates the filter part of `text`.
    pub fn parse(text: &FilterText<'_>) -> Result<Self, QueryError> {
        let status = present(text.status)
            .map(|s| s.parse::<RecordStatus>().map_err(|e| QueryError::BadFilter(e.to_string())))
            .transpose()?;
        let min_attempts = present(text.min_attempts)
            .map(|s| {
                s.parse::<i32>().ok().filter(|n| *n >= 0).ok_or_else(|| {
                    QueryError::BadFilter(format!("min_attempts {:?} is not a non-negative integer", clip(s)))
                })
            })
            .transpose()?;
        let from = present(text.from).map(|v| parse_time("from", v)).transpose()?;
        let to = present(text.to).map(|v| parse_time("to", v)).transpose()?;
        if let (Some(f), Some(t)) = (from, to)
            && f >= t
        {
            return Err(QueryError::BadFilter("the time range is empty: from must be before to".to_owned()));
        }
        Ok(RecordFilter {
            group: search_text("consumer group", text.group)?,
            status,
            message_type: search_text("message type", text.message_type)?,
            error_class: search_text("error class", text.error_class)?,
            from,
            to,
            min_attempts,
            message_id: search_text("message id", text.message_id)?,
            id_prefix: search_text("message id prefix", text.id_prefix)?,
            flag: present(text.flag).map(RecordFlag::parse).transpose()?,
        })
    }
}

impl RecordListParams {
    /// Validates filter, sort, order, cursor and page size.
    pub fn parse(text: &FilterText<'_>) -> Result<Self, QueryError> {
        let sort = match present(text.sort) {
            // A prefix search lists its matches in message-id order unless told otherwise.
            None if present(text.id_prefix).is_some() => SortKey::MessageId,
            None | Some("time") => SortKey::Time,
            Some("attempts") => SortKey::Attempts,
            Some("message_id") => SortKey::MessageId,
            Some(other) => {
                return Err(QueryError::BadFilter(format!(
                    "unknown sort {:?}; expected time, attempts or message_id",
                    clip(other)
                )));
            }
        };
        let order = match present(text.order) {
            None | Some("desc") => SortOrder::Desc,
            Some("asc") => SortOrder::Asc,
            Some(other) => {
                return Err(QueryError::BadFilter(format!("unknown order {:?}; expected desc or asc", clip(other))));
            }
        };
        let at = match (present(text.after), present(text.before)) {
            (Some(_), Some(_)) => {
                return Err(QueryError::BadFilter("give either after or before, not both".to_owned()));
            }
            (Some(c), None) => PageAt::After(Cursor::decode(c, sort)?),
            (None, Some(c)) => PageAt::Before(Cursor::decode(c, sort)?),
            (None, None) => PageAt::First,
        };
        let limit = present(text.limit)
            .map(|s| {
                s.parse::<i64>().ok().filter(|n| (1..=MAX_PAGE_SIZE).contains(n)).ok_or_else(|| {
                    QueryError::BadFilter(format!("limit {:?} must be between 1 and {MAX_PAGE_SIZE}", clip(s)))
                })
            })
            .transpose()?
            .unwrap_or(DEFAULT_PAGE_SIZE);
        Ok(RecordListParams { filter: RecordFilter::parse(text)?, sort, order, at, limit })
    }
}

/// The smallest string greater than every string starting with `prefix` in byte order (the
/// upper bound of a prefix range on a `COLLATE "C"` column); `None` when there is none (the
/// prefix is all `U+10FFFF`).
pub(crate) fn prefix_upper_bound(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let next = (u32::from(last) + 1..=0x10FFFF).find_map(char::from_u32);
        if let Some(next) = next {
            chars.push(next);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bad(text: FilterText<'_>) -> String {
        match RecordListParams::parse(&text) {
            Err(QueryError::BadFilter(m)) => m,
            other => panic!("expected a bad filter, got {other:?}"),
        }
    }

    #[test]
    fn empty_text_is_the_first_page_newest_first() {
        let p = RecordListParams::parse(&FilterText { group: Some(" "), ..FilterText::default() }).unwrap();
        assert_eq!(p, RecordListParams { limit: DEFAULT_PAGE_SIZE, ..RecordListParams::default() });
        let prefix = RecordListParams::parse(&FilterText { id_prefix: Some("ORDER."), ..FilterText::default() });
        assert_eq!(prefix.unwrap().sort, SortKey::MessageId, "a prefix search lists in message-id order");
    }

    #[test]
    fn bad_values_are_named() {
        assert!(bad(FilterText { status: Some("done"), ..Default::default() }).contains("unknown status"));
        let long = "x".repeat(513);
        assert!(bad(FilterText { id_prefix: Some(&long), ..Default::default() }).contains("limit is 512"));
        assert!(bad(FilterText { from: Some("yesterday"), ..Default::default() }).contains("not a time"));
        assert!(bad(FilterText { min_attempts: Some("-1"), ..Default::default() }).contains("min_attempts"));
        assert!(bad(FilterText { sort: Some("size"), ..Default::default() }).contains("unknown sort"));
        assert!(bad(FilterText { limit: Some("0"), ..Default::default() }).contains("limit"));
        assert!(bad(FilterText { after: Some("zz"), ..Default::default() }).contains("cursor"));
        assert!(bad(FilterText { flag: Some("doubled"), ..Default::default() }).contains("expected double_effect"));
        let range = FilterText { from: Some("2026-02-01"), to: Some("2026-01-01"), ..Default::default() };
        assert!(bad(range).contains("empty"));
    }

    #[test]
    fn cursors_round_trip_and_belong_to_their_sort() {
        let c = Cursor { key: CursorKey::Attempts(3), id: 42 };
        assert_eq!(Cursor::decode(&c.encode(), SortKey::Attempts).unwrap(), c);
        assert!(Cursor::decode(&c.encode(), SortKey::Time).is_err());
        let t = Cursor { key: CursorKey::Time(-5), id: 1 };
        assert_eq!(Cursor::decode(&t.encode(), SortKey::Time).unwrap(), t);
        let m = Cursor { key: CursorKey::MessageId("ORDER.PAY.1:1".to_owned()), id: 7 };
        assert_eq!(m.encode(), "m7.ORDER.PAY.1:1");
        assert_eq!(Cursor::decode(&m.encode(), SortKey::MessageId).unwrap(), m);
    }

    #[test]
    fn times_parse_in_three_formats() {
        let want = "2026-01-31T08:00:00Z".parse::<DateTime<Utc>>().unwrap();
        assert_eq!(parse_time("from", "2026-01-31T08:00:00Z").unwrap(), want);
        assert_eq!(parse_time("from", "2026-01-31T08:00").unwrap(), want);
        assert_eq!(parse_time("from", "2026-01-31").unwrap(), want - chrono::TimeDelta::hours(8));
    }

    #[test]
    fn prefix_bounds_follow_byte_order() {
        assert_eq!(prefix_upper_bound("ORDER.PAY").as_deref(), Some("ORDER.PAZ"));
        assert_eq!(prefix_upper_bound("a\u{10FFFF}").as_deref(), Some("b"));
        assert_eq!(prefix_upper_bound("\u{10FFFF}"), None);
    }
}
