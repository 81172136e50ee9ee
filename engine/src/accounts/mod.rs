//! Operator accounts: users with a role and an argon2id password hash, per-user API tokens
//! (stored as SHA-256), and the login-failure throttle. No web code: the server's sign-in,
//! session and authorisation layers, the console's Users and Account pages and the
//! `dedup-console user` commands all call these functions.
//!
//! Roles (least to most): `viewer` reads everything; `operator` also acts on records (release,
//! mark succeeded, requeue, drill); `admin` also manages cleanup schedules, users and settings.

pub mod books;
pub mod passwords;
pub mod throttle;
pub mod tokens;
pub mod users;

pub use books::AccountBooks;
pub use users::{Role, User, UserName};

/// Why an account operation failed.
#[derive(Debug, thiserror::Error)]
pub enum AccountError {
    /// The input is invalid (a user name, a password, a role); the text says why (safe to show).
    #[error("{0}")]
    Invalid(String),
    /// A user with this name exists already (names are compared ignoring case).
    #[error("a user named {0:?} exists already")]
    NameTaken(String),
    /// No such user (or token).
    #[error("{0}")]
    NotFound(String),
    /// The change would leave no enabled admin.
    #[error("refused: this would leave no enabled admin")]
    LastAdmin,
    /// The database failed (details are for the log).
    #[error(transparent)]
    Unexpected(#[from] anyhow::Error),
}

impl From<sqlx::Error> for AccountError {
    fn from(e: sqlx::Error) -> Self {
        AccountError::Unexpected(anyhow::Error::new(e).context("accounts query failed"))
    }
}
