//! The order example, one of the engine's two examples: `ORDER.CREATE`, `ORDER.PAY` and
//! `ORDER.NOTIFY` handlers, an SMS gateway stand-in, a simulator that produces duplicate-laden
//! traffic, a verifier that proves every effect happened once, the domain of the console's
//! synthetic records ([`seed`]) and the demo's crashing worker. The `dedup-console` binary runs
//! it (`serve --demo`, `simulate`, `verify`, `seed`).
//!
//! Message ids: `ORDER.<EVENT>.<order no>:<version>`; CREATE is version 1, PAY 2, NOTIFY 3.
//! Its tables live in the schema `shop` ([`SCHEMA`]), with a migration history of their own
//! ([`migrate`]); its SQL names them with that schema, so it runs under any `search_path`.
//! With the feature `mysql`, `mysql` holds the same on MySQL 8 / MariaDB 10.11 (the database
//! `shop`), sharing all but the statements; [`ShopPool`] runs the example on either.

pub mod crashing_worker;
pub mod demo;
mod handlers;
#[cfg(feature = "mysql")]
pub mod mysql;
pub mod seed;
mod shop_pool;
pub mod simulate;
mod sms;
pub mod verify;

use std::sync::Arc;

use dedup_engine::{Handler, HandlerRegistry, LeaseExpiryPolicy, Schema, SchemaError};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use sqlx::migrate::Migrator;

pub use handlers::{CreateOrder, NotifyOrder, PayOrder};
pub use shop_pool::ShopPool;
pub use sms::SmsGateway;

/// The schema of the example's tables.
pub const SCHEMA: &str = "shop";

/// The example's migrations (`examples/orders/migrations`), applied in [`SCHEMA`].
pub static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// Applies the example's migrations in [`SCHEMA`], with their own history. A database from
/// before the example had a schema keeps its order tables: the first migration moves them.
///
/// Errors: the database's, or a migration's.
pub async fn migrate(pool: &PgPool) -> Result<(), SchemaError> {
    dedup_engine::migrate_schema(pool, &Schema::parse(SCHEMA).expect("a valid schema name"), &MIGRATOR).await
}

/// The message types of the example, in lifecycle order.
pub const MESSAGE_TYPES: [&str; 3] = ["ORDER.CREATE", "ORDER.PAY", "ORDER.NOTIFY"];

/// Settings of the order domain.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OrderSettings {
    /// Number of SKUs stocked at start (`SKU-0001` ...). Default 100.
    pub skus: u32,
    /// Units of each SKU stocked at start (only when the SKU is new). Default 1 000 000.
    pub initial_stock: i32,
    /// Latency of the SMS gateway stand-in, in ms. Default 20.
    pub sms_latency_ms: u64,
    /// Share of SMS sends the stand-in rejects (0.0–1.0). Default 0.
    pub sms_failure_rate: f64,
    /// `on_lease_expiry` of the leased NOTIFY handler. Default `hold`.
    pub notify_on_lease_expiry: LeaseExpiryPolicy,
    /// Share of the NOTIFY sends of the demo's crashing worker on which it freezes and is
    /// killed (0.0–1.0; [`crashing_worker`]). Default 0; the demo sets it.
    pub notify_crash_rate: f64,
}

impl Default for OrderSettings {
    fn default() -> Self {
        Self {
            skus: 100,
            initial_stock: 1_000_000,
            sms_latency_ms: 20,
            sms_failure_rate: 0.0,
            notify_on_lease_expiry: LeaseExpiryPolicy::Hold,
            notify_crash_rate: 0.0,
        }
    }
}

/// The SKU code of index `i` (1-based).
pub fn sku(i: u32) -> String {
    format!("SKU-{i:04}")
}

/// Stocks the SKUs that do not exist yet.
pub async fn stock_inventory(pool: &PgPool, settings: &OrderSettings) -> Result<(), sqlx::Error> {
    let skus: Vec<String> = (1..=settings.skus.max(1)).map(sku).collect();
    sqlx::query(
        "INSERT INTO shop.inventory (sku, available) SELECT unnest($1::text[]), $2 ON CONFLICT (sku) DO NOTHING",
    )
    .bind(skus)
    .bind(settings.initial_stock)
    .execute(pool)
    .await?;
    Ok(())
}

/// The order handlers: CREATE and PAY transactional, NOTIFY leased (through the SMS stand-in,
/// which logs sends on `pool`).
pub fn handlers(pool: PgPool, settings: &OrderSettings) -> HandlerRegistry {
    let mut registry = HandlerRegistry::new();
    registry
        .register("ORDER.CREATE", Handler::Transactional(Arc::new(CreateOrder)))
        .register("ORDER.PAY", Handler::Transactional(Arc::new(PayOrder)))
        .register(
            "ORDER.NOTIFY",
            Handler::Leased {
                handler: Arc::new(NotifyOrder::new(SmsGateway::new(
                    pool,
                    settings.sms_latency_ms,
                    settings.sms_failure_rate,
                ))),
                on_lease_expiry: settings.notify_on_lease_expiry,
            },
        );
    registry
}
