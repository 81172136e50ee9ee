//! Where accounts are kept (docs/research/store-seam.md 3.7 step 5, "accounts"): users, API
//! tokens and the login throttle's counters, one implementation per database on its pool
//! (`store/postgres/accounts.rs`, `store/mysql/accounts.rs`), reached through
//! [`crate::console::ConsoleStore`]. What does not depend on the database (name and role
//! rules, token secrets, throttle keys) stays in the modules beside this one.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::FromRow;

use super::AccountError;
use super::tokens::ApiToken;
use super::users::{Role, User, UserChange, UserName};

/// The accounts' tables on one database. Every method is one statement or one transaction of
/// its own; errors other than the ones named are [`AccountError::Unexpected`] (the database's).
#[async_trait]
pub trait AccountBooks: Send + Sync {
    /// Adds a user with an already hashed password (see [`super::passwords::hash_password`]).
    ///
    /// # Errors
    /// [`AccountError::NameTaken`] when the name (ignoring case) exists.
    async fn user_add(&self, name: &UserName, role: Role, password_hash: &str) -> Result<User, AccountError>;

    /// Every user, by name ignoring case.
    async fn user_list(&self) -> Result<Vec<User>, AccountError>;

    /// The user with this id, if any.
    async fn user_by_id(&self, id: i64) -> Result<Option<User>, AccountError>;

    /// The user with this name (ignoring ASCII case, not trimmed) and their password hash, for
    /// signing in; `None` too for a name no user can have ([`crate::accounts::UserName`]: the
    /// databases' `LOWER` folds some non-ASCII letters onto ASCII ones, `İ` onto `i`).
    async fn user_credentials(&self, name: &str) -> Result<Option<(User, String)>, AccountError>;

    /// Records a successful sign-in (`last_login_at`, the database's clock).
    async fn user_touch_login(&self, id: i64) -> Result<(), AccountError>;

    /// Replaces the password hash of the user named `name` (ignoring case); returns the user.
    ///
    /// # Errors
    /// [`AccountError::NotFound`] when no user has the name.
    async fn user_set_password(&self, name: &str, password_hash: &str) -> Result<User, AccountError>;

    /// Changes a user's role or enabled state, in one transaction that refuses to leave no
    /// enabled admin (the enabled admins are locked first, so two concurrent demotions cannot
    /// both pass).
    ///
    /// # Errors
    /// [`AccountError::NotFound`], [`AccountError::LastAdmin`] (nothing changed).
    async fn user_update(&self, id: i64, change: UserChange) -> Result<User, AccountError>;

    /// Stores a token of `user_id` by its SHA-256 (`sha256`, 32 bytes) with its `name` and
    /// first characters (`prefix`); returns it as listed.
    async fn token_insert(&self, user_id: i64, name: &str, prefix: &str, sha256: &[u8]) -> Result<ApiToken, AccountError>;

    /// The tokens of `user_id`, newest first, revoked ones included.
    async fn token_list(&self, user_id: i64) -> Result<Vec<ApiToken>, AccountError>;

    /// Revokes token `id` of `user_id` (a no-op on an already revoked one); returns it.
    ///
    /// # Errors
    /// [`AccountError::NotFound`] when `user_id` has no such token.
    async fn token_revoke(&self, user_id: i64, id: i64) -> Result<ApiToken, AccountError>;

    /// The owner's user id of the token not revoked whose SHA-256 is `sha256`, noting its use
    /// (`last_used_at`, written at most once a minute).
    async fn token_owner(&self, sha256: &[u8]) -> Result<Option<i64>, AccountError>;

    /// Seconds until the first of the keys over its limit is let through again; `None` when
    /// none is throttled. `limits` pairs each key with its limit; a key's window is `window`
    /// from its first failure, at most a year ([`MAX_THROTTLE_WINDOW`]: a longer one is taken
    /// as a year).
    async fn throttle_check(&self, limits: &[(String, u32)], window: Duration) -> Result<Option<u64>, AccountError>;

    /// Counts one failure for each key (a key whose window has ended starts a new one); the
    /// window at most a year, as in [`AccountBooks::throttle_check`].
    async fn throttle_fail(&self, keys: &[String], window: Duration) -> Result<(), AccountError>;

    /// Forgets the failures of `key` (after a successful sign-in).
    async fn throttle_clear(&self, key: &str) -> Result<(), AccountError>;
}


/// The longest throttle window: a year (longer ones would overflow the databases' date
/// arithmetic: MySQL makes such a date NULL, which would turn the throttle off).
pub const MAX_THROTTLE_WINDOW: Duration = Duration::from_secs(366 * 24 * 3600);

/// `window`, at most [`MAX_THROTTLE_WINDOW`].
pub(crate) fn throttle_window(window: Duration) -> Duration {
    window.min(MAX_THROTTLE_WINDOW)
}

/// Whether `name` is a user name exactly as given (no trimming): only such a name is looked up.
pub(crate) fn is_user_name(name: &str) -> bool {
    UserName::parse(name).is_ok_and(|n| n.as_str() == name)
}

/// Seconds to wait, from the largest number of seconds left in a window (`None`: no key is
/// throttled): whole seconds, at least one.
pub(crate) fn wait_secs(left: Option<f64>) -> Option<u64> {
    left.map(|s| s.ceil().max(1.0) as u64)
}

/// A `users` row as both stores read it (`id, name, role, disabled, created_at, last_login_at`).
#[derive(FromRow)]
pub(crate) struct UserRow {
    pub(crate) id: i64,
    pub(crate) name: String,
    pub(crate) role: String,
    pub(crate) disabled: bool,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) last_login_at: Option<DateTime<Utc>>,
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

/// A `users` row with its password hash.
#[derive(FromRow)]
pub(crate) struct CredentialRow {
    #[sqlx(flatten)]
    pub(crate) user: UserRow,
    pub(crate) password_hash: String,
}

impl CredentialRow {
    /// The user and their password hash.
    pub(crate) fn into_pair(self) -> Result<(User, String), AccountError> {
        Ok((self.user.try_into()?, self.password_hash))
    }
}
