//! The engine's schema: its name ([`Schema`]), and what start-up refuses of it ([`SchemaError`]).
//! PostgreSQL's migrations in it are `store/postgres/migrations.rs`'s.

use std::fmt;

use sqlx::migrate::MigrateError;

/// Name of the UNIQUE constraint on `dedup_records (consumer_group, message_id)`. The whole
/// product rests on it: without it two concurrent deliveries could both insert a record.
pub const DEDUP_UNIQUE_CONSTRAINT: &str = "dedup_records_group_message_key";

/// Longest schema name, in bytes (PostgreSQL's identifier limit).
const MAX_SCHEMA_BYTES: usize = 63;

/// The name of a PostgreSQL schema the engine (or an example) keeps its tables in. Default
/// `dedup`.
///
/// Lower-case ASCII letters, digits and `_`, starting with a letter or `_`, at most 63 bytes,
/// and neither `public` nor a system schema (`pg_*`, `information_schema`): the engine's
/// tables must not share a schema with anyone's. The rule also means the name never needs
/// quoting in a `search_path` value.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Schema(String);

/// Why a schema name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid schema name {0:?}: use lower-case letters, digits and _ (starting with a letter or _), \
     at most 63 bytes, not public, information_schema or pg_*"
)]
pub struct SchemaNameError(pub String);

impl Schema {
    /// Validates a schema name (see [`Schema`]).
    ///
    /// Errors: [`SchemaNameError`] naming the value (its first 80 characters).
    pub fn parse(name: impl Into<String>) -> Result<Self, SchemaNameError> {
        let name = name.into();
        let mut chars = name.chars();
        let valid = chars.next().is_some_and(|c| c.is_ascii_lowercase() || c == '_')
            && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            && name.len() <= MAX_SCHEMA_BYTES
            && name != "public"
            && name != "information_schema"
            && !name.starts_with("pg_");
        if valid { Ok(Schema(name)) } else { Err(SchemaNameError(name.chars().take(80).collect())) }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name as a quoted SQL identifier (`"dedup"`), for statements.
    pub fn quoted(&self) -> String {
        format!("\"{}\"", self.0)
    }
}

impl Default for Schema {
    fn default() -> Self {
        Schema("dedup".to_owned())
    }
}

impl fmt::Display for Schema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for Schema {
    type Error = SchemaNameError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Schema::parse(value)
    }
}

impl From<Schema> for String {
    fn from(value: Schema) -> Self {
        value.0
    }
}

/// Schema problems found at start-up.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    /// A migration failed to apply.
    #[error("applying migrations failed: {0}")]
    Migrate(#[from] MigrateError),
    /// The dedup table lacks its UNIQUE constraint: refusing to run, since duplicates could slip
    /// through concurrent claims.
    #[error(
        "table {schema}.dedup_records has no UNIQUE constraint {DEDUP_UNIQUE_CONSTRAINT} on \
         (consumer_group, message_id); refusing to start because concurrent deliveries could \
         both be processed. Restore it with: ALTER TABLE {schema}.dedup_records ADD CONSTRAINT \
         {DEDUP_UNIQUE_CONSTRAINT} UNIQUE (consumer_group, message_id)"
    )]
    MissingUniqueConstraint {
        /// The engine's schema.
        schema: Schema,
    },
    /// Querying the catalog, or moving a database from before schemas, failed.
    #[error("checking the schema failed: {0}")]
    Query(#[from] sqlx::Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_names_are_plain_identifiers() {
        assert_eq!(Schema::default().as_str(), "dedup");
        assert_eq!(Schema::parse("ops_dedup2").unwrap().quoted(), "\"ops_dedup2\"");
        assert!(Schema::parse("_x").is_ok());
        for bad in ["", "public", "pg_temp", "information_schema", "Dedup", "2x", "a-b", "a b", "a\"b", "a;b"] {
            assert!(Schema::parse(bad).is_err(), "{bad:?} accepted");
        }
        assert!(Schema::parse("x".repeat(64)).is_err());
        assert!(Schema::parse("x".repeat(63)).is_ok());
    }
}
