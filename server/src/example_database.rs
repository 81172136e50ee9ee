//! The order example's database, for `migrate`, `simulate` and `verify`: PostgreSQL (the
//! engine's and the example's migrations, each in its schema) or, with `DATABASE_URL=mysql://…`,
//! MySQL 8 or MariaDB 10.11 (the example's tables in the URL's database, the engine's in the
//! database named by `schema`).

use dedup_example_orders::ShopPool;

use crate::config::Settings;

/// Connects to `settings.database_url` and, once the example's tables have a place there
/// ([`ShopPool::on`]), applies the engine's and the example's migrations; the example's tables'
/// pool (simulating and verifying runs, [`ShopPool`]).
///
/// Errors: the database unreachable, a failed migration, a MySQL URL without a database or
/// naming the engine's.
pub async fn open_example_database(settings: &Settings) -> anyhow::Result<ShopPool> {
    let host = crate::startup::connect(settings).await?;
    let shop = ShopPool::on(&host, &settings.schema)?;
    host.open_engine_pool(&settings.schema, 1).await?.close().await;
    shop.migrate().await?;
    Ok(shop)
}
