//! The copies of conflicting deliveries, as every store keeps them (DESIGN.md, "Reused ids and
//! payload conflicts"): what a copy is, and how many a record keeps open.

use super::StoreError;
use crate::message::InboundMessage;

/// Open payload conflicts a record keeps at most: a producer that puts a send time in its
/// payload makes every retry one.
pub(crate) const MAX_OPEN_PAYLOAD_COPIES: i64 = 5;

/// What a conflicting delivery conflicts in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ConflictKind {
    /// Another message type: a reused id, never a duplicate.
    Type,
    /// The same type, another payload.
    Payload,
}

impl ConflictKind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ConflictKind::Type => "type",
            ConflictKind::Payload => "payload",
        }
    }
}

/// A conflicting delivery to keep.
#[derive(Clone)]
pub(crate) struct ConflictCopy<'a> {
    /// The record whose message id it carried.
    pub record_id: i64,
    pub message_id: &'a str,
    pub kind: ConflictKind,
    /// Its own message type.
    pub message_type: &'a str,
    /// The `ids.from` source its message id came from, as written (`key`, `header:<name>`, ...).
    pub id_source: String,
    pub payload_hash: &'a [u8],
    pub message: &'a InboundMessage,
}

impl<'a> ConflictCopy<'a> {
    /// `copies` one per record and payload, with how many came (two of one record and payload
    /// are one row with two copies), in the order they first came.
    pub(crate) fn per_payload<'c>(copies: &'c [ConflictCopy<'a>]) -> Vec<(&'c ConflictCopy<'a>, i32)> {
        let mut rows: Vec<(&ConflictCopy<'_>, i32)> = Vec::with_capacity(copies.len());
        for copy in copies {
            match rows.iter_mut().find(|(c, _)| c.record_id == copy.record_id && c.payload_hash == copy.payload_hash) {
                Some((_, n)) => *n += 1,
                None => rows.push((copy, 1)),
            }
        }
        rows
    }
}

/// The records `rows` (from [`ConflictCopy::per_payload`]) name, once each, in id order: the
/// order a keeper locks them in, so that two keepers never wait on each other.
pub(crate) fn records_of(rows: &[(&ConflictCopy<'_>, i32)]) -> Vec<i64> {
    let mut records: Vec<i64> = rows.iter().map(|(c, _)| c.record_id).collect();
    records.sort_unstable();
    records.dedup();
    records
}

/// A keeper locks the records its copies name before it keeps them: a cleanup batch skips a
/// locked record, and one that a batch deleted first is no longer there to lock. `Ok` when each
/// of `wanted` is among `locked`.
///
/// # Errors
/// [`StoreError::RecordDeleted`] with the first record gone: the copy would name no record, so
/// nothing is kept and its delivery goes back to be judged again.
pub(crate) fn all_locked(wanted: &[i64], locked: &[i64]) -> Result<(), StoreError> {
    match wanted.iter().find(|id| !locked.contains(id)) {
        Some(gone) => Err(StoreError::RecordDeleted(*gone)),
        None => Ok(()),
    }
}
