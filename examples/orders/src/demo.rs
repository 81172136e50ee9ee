//! Demo traffic for `serve --demo`: a gentle, endless order stream with duplicates, reordering
//! and poison messages, so a newcomer's console has something on every page within a minute.
//! (The demo also runs a worker that crashes mid-SMS now and then, [`crate::crashing_worker`],
//! and makes the SMS gateway reject some sends: see [`demo_order_settings`].)

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::simulate::{SimulateParams, SimulatedGroup};
use super::{OrderSettings, ShopPool};
use dedup_engine::{IdPolicy, SourceFactory};

/// Orders published per burst.
const ORDERS_PER_BURST: u64 = 8;
/// Pause between bursts.
const PAUSE: Duration = Duration::from_secs(4);

/// The order settings of the demo: the crashing worker freezes on 20 % of its NOTIFY sends
/// (stuck records), 10 % of SMS sends are rejected by the gateway (retries), unless the
/// configuration already sets them.
pub fn demo_order_settings(configured: &OrderSettings) -> OrderSettings {
    let mut settings = configured.clone();
    if settings.notify_crash_rate == 0.0 {
        settings.notify_crash_rate = 0.2;
    }
    if settings.sms_failure_rate == 0.0 {
        settings.sms_failure_rate = 0.1;
    }
    settings
}

/// Publishes bursts of simulated orders through `source` (to its destination, reaching
/// `groups`), each run recorded in `shop`, until shutdown. Broker or database trouble is logged and retried after the pause;
/// it never stops the server.
pub async fn run_demo_traffic(
    shop: ShopPool,
    source: Arc<dyn SourceFactory>,
    groups: Vec<SimulatedGroup>,
    orders: OrderSettings,
    ids: IdPolicy,
    shutdown: CancellationToken,
) {
    tracing::info!("demo mode: publishing simulated orders every {} s", PAUSE.as_secs());
    let mut seed: u64 = rand::random();
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(PAUSE) => {}
        }
        let params = SimulateParams {
            orders: ORDERS_PER_BURST,
            rate: 15.0,
            duplicate_rate: 0.25,
            duplicate_delay_ms: 5000,
            reorder_window: 6,
            poison_rate: 0.04,
            groups: groups.clone(),
            exchange: source.destination(),
            seed,
        };
        seed = seed.wrapping_add(1);
        let burst = async {
            let publisher = source.open_publisher().await?;
            shop.simulate(publisher.as_ref(), &params, &orders, &ids, |_, _| {}).await
        };
        tokio::select! {
            () = shutdown.cancelled() => return,
            result = burst => if let Err(e) = result {
                tracing::warn!(error = %format_args!("{e:#}"), "demo traffic: burst not published; retrying later");
            },
        }
    }
}
