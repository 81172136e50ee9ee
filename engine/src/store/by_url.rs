//! The store a database URL names, chosen by its scheme ([`connect`]): each database's folder
//! connects, this file only reads the scheme.

use crate::db::PoolSettings;
use crate::runtime::EnginePool;
use crate::service::Unreachable;

/// The schemes of MySQL 8 and MariaDB URLs.
const MYSQL_SCHEMES: [&str; 2] = ["mysql", "mariadb"];

/// Opens a pool on the database `url` names ([`EnginePool::connect`]): MySQL's store for a
/// `mysql://` or `mariadb://` URL, PostgreSQL's for any other (its parser names a bad one).
///
/// Errors: [`Unreachable`], as each store's connect; a MySQL URL on a build without the feature
/// `mysql`.
pub(crate) async fn connect(url: &str, settings: &PoolSettings) -> Result<EnginePool, Unreachable> {
    let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
    if !MYSQL_SCHEMES.iter().any(|mysql| scheme.eq_ignore_ascii_case(mysql)) {
        return super::postgres::connect(url, settings).await.map(EnginePool::from);
    }
    #[cfg(feature = "mysql")]
    return super::mysql::connect_url(url, settings).await.map(EnginePool::from);
    #[cfg(not(feature = "mysql"))]
    Err(Unreachable::new(
        crate::Service::MySql,
        url,
        anyhow::anyhow!("this build of dedup-engine has no MySQL store (its feature `mysql` is off)"),
    ))
}
