//! The bookkeeping every transition writes itself on MySQL (no statement triggers; DESIGN.md,
//! "MySQL store"): count deltas in `record_counts`, new message types, attempt rows.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use sqlx::mysql::MySqlArguments;
use sqlx::query::Query;
use sqlx::{MySql, MySqlConnection};

use super::{MySqlStore, sql};
use crate::store::{ClaimedRecord, StoreError};

/// How often the message-type insert is run again after losing a race to another transaction's
/// first insert of the same type (1062, which rolls back only that statement).
const TYPE_RACES: usize = 3;

impl MySqlStore {
    /// Appends the non-zero `deltas` (status → change of its count) of `group`.
    pub(super) async fn add_counts(
        &self,
        conn: &mut MySqlConnection,
        group: &str,
        deltas: &BTreeMap<&str, i64>,
    ) -> Result<(), StoreError> {
        let rows: Vec<(&str, i64)> = deltas.iter().filter(|(_, n)| **n != 0).map(|(s, n)| (*s, *n)).collect();
        if rows.is_empty() {
            return Ok(());
        }
        let sql = self.render(&sql::add_counts(rows.len()));
        let mut query = sqlx::query(&sql);
        for (status, n) in rows {
            query = query.bind(group).bind(status).bind(n);
        }
        query.execute(&mut *conn).await?;
        Ok(())
    }

    /// Records `types` in `message_types` unless known (in sorted order, so two transactions
    /// bringing the same new types wait on each other rather than deadlock).
    pub(super) async fn add_types(&self, conn: &mut MySqlConnection, types: &BTreeSet<&str>) -> Result<(), StoreError> {
        if types.is_empty() {
            return Ok(());
        }
        let sql = self.render(&sql::add_types(types.len()));
        retry_type_race(conn, || types.iter().fold(sqlx::query(&sql), |query, t| query.bind(*t))).await?;
        Ok(())
    }

    /// Attempt rows of transactional attempts that ended now with `outcome`: each claim with
    /// when it started, by `worker`.
    pub(super) async fn add_attempts(
        &self,
        conn: &mut MySqlConnection,
        worker: &str,
        attempts: &[(&ClaimedRecord, DateTime<Utc>)],
        outcome: &str,
        error: Option<&str>,
    ) -> Result<(), StoreError> {
        if attempts.is_empty() {
            return Ok(());
        }
        let sql = self.render(&sql::add_attempts(attempts.len()));
        let mut query = sqlx::query(&sql);
        for (claim, started) in attempts {
            query = query.bind(claim.id).bind(claim.attempt).bind(worker).bind(*started).bind(outcome).bind(error);
        }
        query.execute(&mut *conn).await?;
        Ok(())
    }
}

/// Runs a message-type insert (`query()`: the types not yet known, without locking the known
/// ones), again when it lost a race to another transaction's first insert of a type (1062, which
/// rolls back only that statement), at most [`TYPE_RACES`] times.
pub(super) async fn retry_type_race<'q>(
    conn: &mut MySqlConnection,
    query: impl Fn() -> Query<'q, MySql, MySqlArguments>,
) -> Result<(), sqlx::Error> {
    let mut race = 0;
    loop {
        match query().execute(&mut *conn).await {
            Ok(_) => return Ok(()),
            Err(e) if race < TYPE_RACES && is_duplicate_key(&e) => race += 1,
            Err(e) => return Err(e),
        }
    }
}

/// A duplicate key (MySQL 1062): the statement was rolled back, the transaction lives on.
fn is_duplicate_key(error: &sqlx::Error) -> bool {
    error.as_database_error().is_some_and(|e| e.kind() == sqlx::error::ErrorKind::UniqueViolation)
}
