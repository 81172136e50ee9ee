//! The demo's crashing worker (`serve --demo`): one more worker process of the NOTIFY groups that
//! freezes in the middle of an SMS now and then and is then killed, so the console has stuck
//! records for an operator to act on.
//!
//! It is a whole engine on a runtime and thread of its own. The kill is that runtime shut down
//! with everything in it, as the kernel ends a process: the frozen handler never returns, its
//! lease is no longer extended, nothing is completed or recorded as failed, and its broker and
//! database connections close, so the broker gives its unacknowledged deliveries to the other
//! workers. Once the lease runs out the record it held is stuck (DESIGN.md, "Two handler
//! modes"); its redelivery finds it so. The engine needs nothing for this: it is what the
//! crashes it is built for look like.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dedup_engine::{
    Engine, EnginePool, Handler, HandlerError, HandlerInput, HandlerRegistry, LeaseGuard, LeasedHandler,
};
use rand::Rng;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::{OrderSettings, ShopPool};

/// How long the worker stays frozen before it is killed.
pub const FROZEN_FOR: Duration = Duration::from_secs(1);
/// How long after a kill (or a failed start) the next crashing worker starts.
pub const RESTART_AFTER: Duration = Duration::from_secs(20);

/// Starts the crashing worker's engine on the pool it is given (the worker's own, on its own
/// runtime, which runs the future where it stands: it need not be `Send`), with the groups it
/// joins bound to `handlers`: the order handlers, the NOTIFY one of which freezes.
pub type StartEngine =
    Arc<dyn Fn(EnginePool, HandlerRegistry) -> Pin<Box<dyn Future<Output = anyhow::Result<Engine>>>> + Send + Sync>;

/// Runs crashing workers one after another on a thread of its own until `shutdown`: each
/// opens a pool of its own made as `shop`'s ([`ShopPool::reconnect`]: PostgreSQL or MySQL),
/// starts its engine with `start`, and is killed
/// [`FROZEN_FOR`] after one of its NOTIFY sends froze (a share `settings.notify_crash_rate` of
/// them, half before the SMS went out and half after). The next one starts [`RESTART_AFTER`]
/// later. At shutdown the running one is killed too.
pub fn spawn_crashing_worker(
    shop: ShopPool,
    settings: OrderSettings,
    start: StartEngine,
    shutdown: CancellationToken,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new().name("crashing-worker".to_owned()).spawn(move || {
        while !shutdown.is_cancelled() {
            let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build() {
                Ok(runtime) => runtime,
                Err(e) => {
                    tracing::warn!(error = %e, "demo: no runtime for the crashing worker");
                    return;
                }
            };
            let frozen = Arc::new(Notify::new());
            let lived = runtime.block_on(live(&shop, &settings, &start, frozen, &shutdown));
            // The kill: every task of the worker dropped where it stands, its sockets closed.
            runtime.shutdown_background();
            match lived {
                Ok(()) if !shutdown.is_cancelled() => {
                    tracing::warn!("demo: the crashing worker was killed mid-SMS; its record will be stuck")
                }
                Ok(()) => {}
                Err(e) => tracing::warn!(error = %format_args!("{e:#}"), "demo: the crashing worker did not start"),
            }
            let pause = tokio::runtime::Builder::new_current_thread().enable_time().build();
            if let Ok(pause) = pause {
                pause.block_on(async {
                    tokio::select! {
                        () = shutdown.cancelled() => {}
                        () = tokio::time::sleep(RESTART_AFTER) => {}
                    }
                });
            }
        }
    })
}

/// One crashing worker's life: until a send froze (and [`FROZEN_FOR`] more), or shutdown.
async fn live(
    shop: &ShopPool,
    settings: &OrderSettings,
    start: &StartEngine,
    frozen: Arc<Notify>,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    let own = shop.reconnect(4).await?;
    let handlers = freezing_handlers(own.handlers(settings), settings, frozen.clone());
    let _engine = start(own.engine_pool(), handlers).await?;
    tokio::select! {
        () = shutdown.cancelled() => {}
        () = frozen.notified() => tokio::time::sleep(FROZEN_FOR).await,
    }
    Ok(())
}

/// The order `handlers`, the NOTIFY one wrapped in [`Freezing`].
fn freezing_handlers(mut handlers: HandlerRegistry, settings: &OrderSettings, frozen: Arc<Notify>) -> HandlerRegistry {
    if let Some(Handler::Leased { handler, on_lease_expiry }) = handlers.get("ORDER.NOTIFY").cloned() {
        let freezing = Freezing { inner: handler, rate: settings.notify_crash_rate.clamp(0.0, 1.0), frozen };
        handlers.register("ORDER.NOTIFY", Handler::Leased { handler: Arc::new(freezing), on_lease_expiry });
    }
    handlers
}

/// A leased handler that, for a share `rate` of its messages, freezes for good (tells `frozen`
/// and never returns), before or after running `inner`'s effect.
struct Freezing {
    inner: Arc<dyn LeasedHandler>,
    rate: f64,
    frozen: Arc<Notify>,
}

#[async_trait]
impl LeasedHandler for Freezing {
    async fn handle(&self, input: &HandlerInput<'_>, lease: &LeaseGuard) -> Result<(), HandlerError> {
        let (freeze, after_the_effect) = {
            let mut rng = rand::rng();
            (self.rate > 0.0 && rng.random_bool(self.rate), rng.random_bool(0.5))
        };
        if !freeze {
            return self.inner.handle(input, lease).await;
        }
        if after_the_effect {
            self.inner.handle(input, lease).await?;
        }
        tracing::warn!(message_id = %input.message_id, after_the_effect, "demo: the crashing worker froze mid-SMS");
        self.frozen.notify_one();
        std::future::pending().await
    }
}
