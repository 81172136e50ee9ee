//! `billing`: the billing example's service (`serve`, the default), its mail stand-in
//! (`mail-stand-in`) and its Spring-style producer (`publish`). Every option also reads an
//! environment variable (`--help` lists them).

use axum::serve::ListenerExt;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use axum::Router;
use axum::http::request::Parts;
use axum::routing::get;
use clap::{Args, Parser, Subcommand};
use dedup_app::ssr::mount::{ConsoleAuth, ConsoleConfig, DelegatedAuth, console_router, mount};
use dedup_engine::rabbitmq::RabbitConnector;
use dedup_engine::{Engine, FastPathSettings, HealthProbes, PoolSettings, SourceFactory, connect};
use dedup_example_billing::mail::{self, MailClient};
use dedup_example_billing::producer::{PublishParams, publish_invoices};
use dedup_example_billing::staff::{self, StaffAuth};
use dedup_example_billing::{BillingQueue, group, migrate, page, rabbit_settings};

/// Where the dedup console is mounted.
const CONSOLE_PATH: &str = "/ops/dedup";

/// The billing example of dedup-console.
#[derive(Debug, Parser)]
#[command(name = "billing", version, about)]
struct Cli {
    #[command(flatten)]
    common: Common,
    #[command(subcommand)]
    command: Option<Command>,
}

/// What every command connects to.
#[derive(Debug, Args)]
struct Common {
    /// PostgreSQL: the billing tables (schema `billing`) and the engine's (schema `dedup`).
    #[arg(
        long,
        global = true,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/billing_example"
    )]
    database_url: String,
    /// RabbitMQ.
    #[arg(long, global = true, env = "AMQP_URL", default_value = "amqp://guest:guest@127.0.0.1:5672/%2f")]
    amqp_url: String,
    /// The exchange invoice events are published to.
    #[arg(long, global = true, env = "BILLING_EXCHANGE", default_value = "billing.events")]
    exchange: String,
    /// The consumer group's queue (declared, bound to the exchange, by `serve` and `publish`).
    #[arg(long, global = true, env = "BILLING_QUEUE", default_value = "billing.invoices")]
    queue: String,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The service: consumes invoice events, serves its page on `--listen`.
    Serve(ServeArgs),
    /// The mail service stand-in: logs every call in `billing.mail_calls`.
    MailStandIn {
        /// Address to listen on.
        #[arg(long, env = "MAIL_LISTEN", default_value = "127.0.0.1:3101")]
        listen: SocketAddr,
        /// How long each call takes, in ms.
        #[arg(long, env = "MAIL_LATENCY_MS", default_value_t = 20)]
        latency_ms: u64,
    },
    /// Issues invoices and publishes their events like a Spring producer, with duplicates.
    Publish {
        /// Invoices to issue.
        #[arg(long, default_value_t = 100)]
        invoices: u64,
        /// Share of messages published twice (0–1).
        #[arg(long, default_value_t = 0.2)]
        duplicate_rate: f64,
        /// Random seed.
        #[arg(long, default_value_t = 7)]
        seed: u64,
    },
}

#[derive(Debug, Args, Clone)]
struct ServeArgs {
    /// Address of the service's page.
    #[arg(long, env = "BILLING_LISTEN", default_value = "127.0.0.1:3100")]
    listen: SocketAddr,
    /// Redis of the dedup fast path.
    #[arg(long, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379")]
    redis_url: String,
    /// Key prefix of the fast path's markers.
    #[arg(long, env = "BILLING_REDIS_PREFIX", default_value = "billing")]
    redis_prefix: String,
    /// The mail service.
    #[arg(long, env = "MAIL_URL", default_value = "http://127.0.0.1:3101")]
    mail_url: String,
    /// Lease of each claim, in ms.
    #[arg(long, env = "BILLING_LEASE_MS", default_value_t = 30_000)]
    lease_ms: u64,
    /// Staff who may use the dedup console, `name:role:password,...` (roles viewer, operator,
    /// admin); none: an operator `ops` with a random password, printed at start.
    #[arg(long, env = "BILLING_STAFF")]
    staff: Option<String>,
    /// The dedup console's built browser bundle (`./scripts/build` writes it).
    #[arg(long, env = "DEDUP_SITE_ROOT", default_value = "target/site")]
    site_root: std::path::PathBuf,
}

impl ServeArgs {
    /// The options of `serve` from the environment and defaults alone (`billing` without a
    /// command).
    fn from_env() -> Self {
        #[derive(Parser)]
        struct Only {
            #[command(flatten)]
            serve: ServeArgs,
        }
        Only::parse_from(["billing"]).serve
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,dedup_example_billing=info,billing=info,dedup_engine=info".into()),
        )
        .init();
    match run(Cli::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let pool = connect(&cli.common.database_url, &PoolSettings::default()).await?;
    migrate(&pool).await?;
    match cli.command.unwrap_or_else(|| Command::Serve(ServeArgs::from_env())) {
        Command::Serve(args) => serve(pool, &cli.common, args).await,
        Command::MailStandIn { listen, latency_ms } => {
            mail::stand_in(pool, listen, Duration::from_millis(latency_ms), shutdown_signal()).await
        }
        Command::Publish { invoices, duplicate_rate, seed } => {
            let connector = RabbitConnector::new(
                &cli.common.amqp_url,
                rabbit_settings(&cli.common.exchange, &cli.common.queue),
                Default::default(),
            );
            let publisher = connector.publisher().await?;
            let params = PublishParams { invoices, duplicate_rate, exchange: cli.common.exchange.clone(), seed };
            let report = publish_invoices(&pool, &publisher, &params).await?;
            connector.close().await;
            println!(
                "{} invoices (numbers start with {}): {} messages published, {} of them second copies",
                report.invoices, report.prefix, report.published, report.duplicates
            );
            Ok(())
        }
    }
}

/// The service: the engine with the billing group, and the page, until SIGTERM or Ctrl-C.
async fn serve(pool: sqlx::PgPool, common: &Common, args: ServeArgs) -> anyhow::Result<()> {
    let queue = BillingQueue {
        amqp_url: common.amqp_url.clone(),
        exchange: common.exchange.clone(),
        queue: common.queue.clone(),
        lease: Duration::from_millis(args.lease_ms),
    };
    // A call that hangs must end well within the lease.
    let mail = MailClient::new(&args.mail_url, queue.lease / 3)?;
    let engine = Engine::builder(pool.clone())
        .redis(&args.redis_url)
        .fast_path(FastPathSettings { prefix: args.redis_prefix.clone(), ..FastPathSettings::default() })
        .group(group(&queue, mail))
        .start()
        .await?;
    // The dedup console at /ops/dedup, for the staff this service signs in.
    let staff = StaffAuth::from_spec(args.staff.as_deref())?;
    let resolver = staff.clone();
    let auth = DelegatedAuth::new(move |parts: &Parts| Ok(resolver.resolve(parts)), "/signin").sign_out_url("/signout");
    let probes = HealthProbes::new(
        engine.handle().pool().clone(),
        &common.database_url,
        &args.redis_url,
        Duration::from_secs(2),
    )
    .with_rabbitmq(&common.amqp_url);
    let config = ConsoleConfig::new(&args.site_root, CONSOLE_PATH, ConsoleAuth::Delegated(auth));
    let console_shutdown = config.shutdown.clone();
    let console = console_router(engine.handle().clone(), probes, config).await?;
    let own = Router::new().route("/", get(page::index)).with_state(pool.clone()).merge(
        Router::new()
            .route("/signin", get(staff::form).post(staff::sign_in))
            .route("/signout", get(staff::sign_out))
            .with_state(staff),
    );
    let app = mount(own, CONSOLE_PATH, console);
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    tracing::info!("billing listening on http://{}; the dedup console at {CONSOLE_PATH}", listener.local_addr()?);
    // Pages go out in several writes: without TCP_NODELAY a client's delayed ACK adds ~40 ms.
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
        .with_graceful_shutdown(async move {
            shutdown_signal().await;
            console_shutdown.cancel(); // open console tabs' event streams end now
        })
        .await?;
    engine.stop().await;
    pool.close().await;
    Ok(())
}

/// Resolves on SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
