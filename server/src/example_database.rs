//! The order example's database, for `migrate`, `simulate` and `verify`: PostgreSQL (the
//! engine's and the example's migrations, each in its schema) or, with `DATABASE_URL=mysql://…`,
//! MySQL 8 or MariaDB 10.11 (the example's tables in the URL's database, the engine's in the
//! database named by `schema`).

use dedup_example_orders::ShopPool;

use crate::config::Settings;
use crate::startup::{Databases, open_database_with_example};

/// Connects to `settings.database_url` and applies the engine's and the example's migrations;
/// the example's tables' pool (simulating and verifying runs, [`ShopPool`]).
///
/// Errors: the database unreachable, a failed migration.
pub(crate) async fn open_example_database(settings: &Settings) -> anyhow::Result<ShopPool> {
    if !settings.on_mysql() {
        let Databases { host, engine } = open_database_with_example(settings).await?;
        engine.close().await;
        return Ok(ShopPool::Postgres(host));
    }
    let shop = crate::startup::mysql::shop(settings)?;
    let pool = crate::startup::mysql::connect(settings).await?;
    dedup_engine::mysql::migrate_engine(&pool, &settings.schema).await?;
    let shop = ShopPool::MySql(pool, shop);
    shop.migrate().await?;
    Ok(shop)
}
