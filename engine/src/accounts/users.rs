//! The `users` table: names, roles, password hashes, enabled or disabled.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::{FromRow, PgExecutor, PgPool};

use super::AccountError;

/// What a user may do. Ordered: each role may do everything the ones before it may.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Reads every page and API resource.
    Viewer,
    /// Also acts on records: release, mark succeeded, requeue, drill.
    Operator,
    /// Also manages cleanup schedules, users and settings.
    Admin,
}

impl Role {
    /// Every role, least to most.
    pub const ALL: [Role; 3] = [Role::Viewer, Role::Operator, Role::Admin];

    /// The stored (and wire) name.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = AccountError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Role::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| AccountError::Invalid(format!("unknown role {s:?}: use viewer, operator or admin")))
    }
}

/// A validated user name: 1 to 64 ASCII letters, digits, `.`, `_`, `-`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserName(String);

impl UserName {
    /// Longest user name.
    pub(crate) const MAX_CHARS: usize = 64;

    /// Parses a user name (surrounding spaces trimmed).
    ///
    /// # Errors
    /// [`AccountError::Invalid`] naming the rule broken.
    pub fn parse(value: &str) -> Result<Self, AccountError> {
        let value = value.trim();
        let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
        if value.is_empty() || value.len() > Self::MAX_CHARS || !value.chars().all(ok_char) {
            return Err(AccountError::Invalid(format!(
                "a user name has 1 to {} letters, digits, '.', '_' or '-'",
                Self::MAX_CHARS
            )));
        }
        Ok(UserName(value.to_owned()))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A user, without the password hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct User {
    /// Row id.
    pub id: i64,
    /// Login name.
    pub name: String,
    /// What the user may do.
    pub role: Role,
    /// A disabled user can neither sign in nor use API tokens; existing sessions stop working.
    pub disabled: bool,
    /// When the account was created.
    pub created_at: DateTime<Utc>,
    /// Last successful sign-in.
    pub last_login_at: Option<DateTime<Utc>>,
}

impl User {
    /// The audit log's actor string, `user:<name>`.
    pub fn actor(&self) -> String {
        format!("user:{}", self.name)
    }
}

#[derive(FromRow)]
struct UserRow {
    id: i64,
    name: String,
    role: String,
    disabled: bool,
    created_at: DateTime<Utc>,
    last_login_at: Option<DateTime<Utc>>,
}

impl TryFrom<UserRow> for User {
    type Error = AccountError;

    fn try_from(r: UserRow) -> Result<Self, AccountError> {
        Ok(User {
            id: r.id,
            name: r.name,
            role: r.role.parse()?,
            disabled: r.disabled,
            created_at: r.created_at,
            last_login_at: r.last_login_at,
        })
    }
}

const COLUMNS: &str = "id, name, role, disabled, created_at, last_login_at";

/// Adds a user with an already hashed password (see [`super::passwords::hash_password`]).
///
/// # Errors
/// [`AccountError::NameTaken`] when the name (ignoring case) exists; the database error.
pub async fn user_add<'e>(
    db: impl PgExecutor<'e>,
    name: &UserName,
    role: Role,
    password_hash: &str,
) -> Result<User, AccountError> {
    let row: Result<UserRow, sqlx::Error> = sqlx::query_as(&format!(
        "INSERT INTO users (name, role, password_hash) VALUES ($1, $2, $3) RETURNING {COLUMNS}"
    ))
    .bind(name.as_str())
    .bind(role.as_str())
    .bind(password_hash)
    .fetch_one(db)
    .await;
    match row {
        Err(e) if e.as_database_error().and_then(|d| d.constraint()) == Some("users_name_key") => {
            Err(AccountError::NameTaken(name.as_str().to_owned()))
        }
        other => other?.try_into(),
    }
}

/// Every user, by name.
///
/// # Errors
/// The database error.
pub async fn user_list<'e>(db: impl PgExecutor<'e>) -> Result<Vec<User>, AccountError> {
    let rows: Vec<UserRow> =
        sqlx::query_as(&format!("SELECT {COLUMNS} FROM users ORDER BY lower(name)")).fetch_all(db).await?;
    rows.into_iter().map(User::try_from).collect()
}

/// The user with this id, if any.
///
/// # Errors
/// The database error.
pub async fn user_by_id<'e>(db: impl PgExecutor<'e>, id: i64) -> Result<Option<User>, AccountError> {
    let row: Option<UserRow> =
        sqlx::query_as(&format!("SELECT {COLUMNS} FROM users WHERE id = $1")).bind(id).fetch_optional(db).await?;
    row.map(User::try_from).transpose()
}

#[derive(FromRow)]
struct CredentialRow {
    #[sqlx(flatten)]
    user: UserRow,
    password_hash: String,
}

/// The user with this name (ignoring case) and their password hash, for signing in.
///
/// # Errors
/// The database error.
pub async fn user_credentials<'e>(db: impl PgExecutor<'e>, name: &str) -> Result<Option<(User, String)>, AccountError> {
    let row: Option<CredentialRow> =
        sqlx::query_as(&format!("SELECT {COLUMNS}, password_hash FROM users WHERE lower(name) = lower($1)"))
            .bind(name)
            .fetch_optional(db)
            .await?;
    row.map(|r| Ok((r.user.try_into()?, r.password_hash))).transpose()
}

/// Records a successful sign-in.
///
/// # Errors
/// The database error.
pub async fn user_touch_login<'e>(db: impl PgExecutor<'e>, id: i64) -> Result<(), AccountError> {
    sqlx::query("UPDATE users SET last_login_at = now() WHERE id = $1").bind(id).execute(db).await?;
    Ok(())
}

/// Replaces the password hash of the user named `name` (ignoring case); returns the user.
///
/// # Errors
/// [`AccountError::NotFound`] when no user has the name; the database error.
pub async fn user_set_password<'e>(
    db: impl PgExecutor<'e>,
    name: &str,
    password_hash: &str,
) -> Result<User, AccountError> {
    let row: Option<UserRow> = sqlx::query_as(&format!(
        "UPDATE users SET password_hash = $2, updated_at = now() WHERE lower(name) = lower($1) RETURNING {COLUMNS}"
    ))
    .bind(name)
    .bind(password_hash)
    .fetch_optional(db)
    .await?;
    row.ok_or_else(|| AccountError::NotFound(format!("no user named {name:?}")))?.try_into()
}

/// What [`user_update`] changes; `None` keeps the current value.
#[derive(Debug, Clone, Copy, Default)]
pub struct UserChange {
    /// The new role.
    pub role: Option<Role>,
    /// Disable (`true`) or enable (`false`).
    pub disabled: Option<bool>,
}

/// Changes a user's role or enabled state, in one transaction that refuses to leave no enabled
/// admin (the admins are locked first, so two concurrent demotions cannot both pass).
///
/// # Errors
/// [`AccountError::NotFound`], [`AccountError::LastAdmin`] (nothing changed); the database error.
pub async fn user_update(pool: &PgPool, id: i64, change: UserChange) -> Result<User, AccountError> {
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT id FROM users WHERE role = 'admin' AND NOT disabled FOR UPDATE").execute(&mut *tx).await?;
    let row: Option<UserRow> = sqlx::query_as(&format!(
        "UPDATE users SET role = coalesce($2, role), disabled = coalesce($3, disabled), updated_at = now()
         WHERE id = $1 RETURNING {COLUMNS}"
    ))
    .bind(id)
    .bind(change.role.map(Role::as_str))
    .bind(change.disabled)
    .fetch_optional(&mut *tx)
    .await?;
    let user: User = row.ok_or_else(|| AccountError::NotFound(format!("no user with id {id}")))?.try_into()?;
    let admins: i64 = sqlx::query_scalar("SELECT count(*) FROM users WHERE role = 'admin' AND NOT disabled")
        .fetch_one(&mut *tx)
        .await?;
    if admins == 0 {
        return Err(AccountError::LastAdmin);
    }
    tx.commit().await?;
    Ok(user)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_roles_parse_with_clear_errors() {
        assert_eq!(UserName::parse(" alice.b-2 ").unwrap().as_str(), "alice.b-2");
        for bad in ["", "a b", "<script>", &"x".repeat(65)] {
            assert!(UserName::parse(bad).unwrap_err().to_string().contains("1 to 64"), "{bad}");
        }
        assert_eq!("operator".parse::<Role>().unwrap(), Role::Operator);
        assert!("root".parse::<Role>().unwrap_err().to_string().contains("viewer, operator or admin"));
        assert!(Role::Viewer < Role::Operator && Role::Operator < Role::Admin);
    }
}
