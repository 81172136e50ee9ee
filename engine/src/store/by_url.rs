//! The store a database URL names, chosen by its scheme ([`connect`]): each database's folder
//! connects, this file only reads the scheme.

use crate::db::PoolSettings;
use crate::runtime::EnginePool;
use crate::service::{Unreachable, redact_url};

/// The schemes of PostgreSQL URLs.
const POSTGRES_SCHEMES: [&str; 2] = ["postgres", "postgresql"];
/// The schemes of MySQL 8 and MariaDB URLs.
const MYSQL_SCHEMES: [&str; 2] = ["mysql", "mariadb"];

/// Why [`EnginePool::connect`] opened no pool.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The URL's scheme (the text before its first `:`, any case) is none this build has a
    /// store for: `postgres` or `postgresql`, and with the feature `mysql` `mysql` or `mariadb`.
    /// (`jdbc:mysql://…`, `localhost:3306/db` or a URL without a scheme are refused here rather
    /// than read as something else.)
    #[error(
        "the database URL {url} starts with no scheme this build runs on: use postgres:// or postgresql://{mysql}"
    )]
    UnknownScheme {
        /// The URL, password redacted.
        url: String,
        /// `" (or mysql:// or mariadb://)"` when the build has the feature `mysql`, else a note
        /// that it has not.
        mysql: &'static str,
    },
    /// The database did not answer, or refused the connection.
    #[error(transparent)]
    Unreachable(#[from] Unreachable),
}

/// Opens a pool on the database `url` names ([`EnginePool::connect`]) by its scheme.
///
/// Errors: [`ConnectError`].
pub(crate) async fn connect(url: &str, settings: &PoolSettings) -> Result<EnginePool, ConnectError> {
    let scheme = url.split_once(':').map_or("", |(scheme, _)| scheme);
    let is = |schemes: [&str; 2]| schemes.iter().any(|s| scheme.eq_ignore_ascii_case(s));
    if is(POSTGRES_SCHEMES) {
        return Ok(super::postgres::connect(url, settings).await?.into());
    }
    #[cfg(feature = "mysql")]
    if is(MYSQL_SCHEMES) {
        return Ok(super::mysql::connect_url(url, settings).await?.into());
    }
    let mysql = if cfg!(feature = "mysql") {
        " (or mysql:// or mariadb:// for MySQL 8 or MariaDB)"
    } else if is(MYSQL_SCHEMES) {
        " (this build of dedup-engine has no MySQL store: its feature `mysql` is off)"
    } else {
        ""
    };
    Err(ConnectError::UnknownScheme { url: redact_url(url), mysql })
}
