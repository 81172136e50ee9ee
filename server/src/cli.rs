//! The command line: `serve` (default), `migrate`, `simulate`, `publish`, `verify`, `seed`, `user`, and the operator
//! commands (`release`, `mark-succeeded`, `dead-letter`, `requeue`, `requeue-bulk`; see
//! [`crate::operator`]) and `cleanup` ([`crate::cli_cleanup`]).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand, ValueEnum};
use dedup_engine::Broker;
use dedup_engine::console::console_store;
use dedup_engine::console::seed::{SeedParams, seed_records};
use dedup_example_orders::simulate::SimulateParams;
use dedup_example_orders::verify::{VerifyReport, check_kafka_lag};

use crate::cli_cleanup::{CleanupArgs, run_cleanup};
use crate::cli_users::UserCommand;
use crate::config::{GroupConfig, Settings};
use crate::example_database::open_example_database;
use crate::operator::{BulkArgs, ConflictArgs, RecordArgs, run_bulk, run_conflicts, run_record};
use crate::publish::{PublishArgs, run_publish};
use crate::startup::{Application, open_engine_database};
use crate::telemetry;
use dedup_engine::console::actions::RecordActionKind;

/// dedup-console: an idempotent message consumer (RabbitMQ → PostgreSQL dedup table + Redis fast
/// path) and the web console to watch and repair it.
#[derive(Debug, Parser)]
#[command(name = "dedup-console", version, about)]
pub struct Cli {
    /// TOML configuration file (keys as in README.md); environment variables override it.
    #[arg(long, global = true, env = "DEDUP_CONFIG")]
    pub config: Option<PathBuf>,
    /// What to do; `serve` when omitted.
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the console and API, with the embedded consumer and background tasks.
    Serve(ServeArgs),
    /// Apply pending database migrations, verify the schema, and exit.
    Migrate,
    /// Publish a simulated order event stream (with duplicates, reordering and poison messages)
    /// to RabbitMQ or Kafka, and record what was sent for `verify`.
    Simulate(SimulateArgs),
    /// Publish one message (with --copies, duplicates of it) to where a consumer group reads
    /// from, as a team's producer would: to try a configuration without writing a producer.
    Publish(PublishArgs),
    /// Check that a simulation run's effects happened exactly once and every message is
    /// accounted for; exits 1 on any violation.
    Verify(VerifyArgs),
    /// Fill the dedup table with synthetic records (statuses, groups, types, attempts, errors,
    /// duplicates over a time window ending now) and matching aggregates, for demos and
    /// benchmarks.
    Seed(SeedArgs),
    /// Manage operator accounts: add, set-password, list.
    #[command(subcommand)]
    User(UserCommand),
    /// Release a stuck record (processing -> failed, lease cleared, claimable). Needs
    /// --lease-token and --reason; --force for a live lease; --requeue to republish at once.
    Release(RecordArgs),
    /// Mark a stuck, failed or dead record succeeded after verifying its effect (--reason).
    MarkSucceeded(RecordArgs),
    /// Dead-letter a stuck or failed record by hand (--reason).
    DeadLetter(RecordArgs),
    /// Requeue a failed or dead record: republish its stored message, make it claimable.
    Requeue(RecordArgs),
    /// Requeue the records a filter matches, rate-limited with a canary: prints the preview;
    /// --yes starts the job and runs it.
    RequeueBulk(BulkArgs),
    /// Requeue the reused-id copies kept on records, each under a new message id
    /// `<message id>#conflict-<n>`, once: prints how many are open; --yes requeues them.
    /// Payload conflicts (judged duplicates) are settled one by one on their record.
    RequeueConflicts(ConflictArgs),
    /// Cleanup schedules: list, create, edit, or run one now (cleanup run ID [--dry-run], or
    /// cleanup ID [--dry-run]).
    Cleanup(CleanupArgs),
}

/// `seed` options.
#[derive(Debug, Args)]
pub struct SeedArgs {
    /// Records to insert.
    #[arg(long, default_value_t = 100_000)]
    pub records: u64,
    /// Days the records' first-seen times spread over, ending now.
    #[arg(long, default_value_t = 60)]
    pub days: u32,
    /// Records generated and loaded at a time (PostgreSQL: per COPY; MySQL splits them into
    /// statements of at most 1 MiB).
    #[arg(long, default_value_t = 50_000)]
    pub batch: u64,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// `serve` options.
#[derive(Debug, Args, Default)]
pub struct ServeArgs {
    /// Demo mode: publish a gentle simulated order stream (with duplicates and poison messages)
    /// in the background and run a worker that is killed mid-SMS now and then, so every console
    /// page has something to show. Off unless given; `scripts/run` gives it.
    #[arg(long)]
    pub demo: bool,
}

/// The broker `--source` names.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum SourceArg {
    /// RabbitMQ (`[consumer.rabbitmq]`).
    Rabbitmq,
    /// Kafka (`[consumer.kafka]`).
    Kafka,
}

/// The configured groups on the broker `--source` names (the first group's when not given):
/// the run is published where the first of them reads from.
///
/// Errors: invalid groups, or none on that broker.
fn groups_on(settings: &Settings, source: Option<SourceArg>) -> anyhow::Result<Vec<GroupConfig>> {
    let mut groups = settings.consumer_groups()?;
    let broker = match source {
        Some(SourceArg::Rabbitmq) => Broker::RabbitMq,
        Some(SourceArg::Kafka) => Broker::Kafka,
        None => groups.first().map_or(Broker::RabbitMq, |g| g.source),
    };
    if groups.len() == 1 {
        // The one group of `[consumer]` reads from whichever broker `--source` names.
        groups[0].source = broker;
    }
    groups.retain(|g| g.source == broker);
    anyhow::ensure!(!groups.is_empty(), "no consumer group reads from {}", broker.as_str());
    Ok(groups)
}

/// `simulate` options.
#[derive(Debug, Args)]
pub struct SimulateArgs {
    /// Broker to publish to (to the exchange, or to the first topic keyed by order number);
    /// default `consumer.source` of the configuration.
    #[arg(long, value_enum)]
    pub source: Option<SourceArg>,
    /// Orders to simulate (each: CREATE, PAY, NOTIFY).
    #[arg(long, default_value_t = 1000)]
    pub orders: u64,
    /// Messages per second; 0 publishes as fast as the broker confirms.
    #[arg(long, default_value_t = 500.0)]
    pub rate: f64,
    /// Share of messages resent by a "producer retry" with the same message id (0–1).
    #[arg(long, default_value_t = 0.2)]
    pub duplicate_rate: f64,
    /// Longest delay of such a resend, in milliseconds.
    #[arg(long, default_value_t = 3000)]
    pub duplicate_delay_ms: u64,
    /// Shuffle events within windows of this many messages (1: keep order).
    #[arg(long, default_value_t = 8)]
    pub reorder_window: usize,
    /// Share of orders followed by a poison message (0–1).
    #[arg(long, default_value_t = 0.01)]
    pub poison_rate: f64,
    /// Random seed; a random one when omitted.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// `verify` options.
#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// With `kafka`, also check that the consumer group has consumed and committed every record
    /// (lag 0); default `consumer.source` of the configuration.
    #[arg(long, value_enum)]
    pub source: Option<SourceArg>,
    /// The simulation run to check; the latest when omitted.
    #[arg(long)]
    pub run: Option<i64>,
    /// Wait up to this many seconds for the run's messages to be recorded and settle before
    /// judging (it returns as soon as they have).
    #[arg(long, default_value_t = 60)]
    pub wait_secs: u64,
    /// Print the report as JSON (an object with a boolean `ok` and the counts).
    #[arg(long)]
    pub json: bool,
    /// Check only that each Kafka group (or `--group`) has consumed and committed every record
    /// (lag 0), whoever produced them: no simulation run is needed. Waits up to `--wait-secs`.
    #[arg(long, conflicts_with_all = ["run", "json"])]
    pub lag_only: bool,
    /// With `--lag-only`: only this consumer group.
    #[arg(long, requires = "lag_only")]
    pub group: Option<String>,
}

fn validate_share(name: &str, value: f64) -> anyhow::Result<()> {
    anyhow::ensure!((0.0..=1.0).contains(&value), "--{name} must be between 0 and 1, got {value}");
    Ok(())
}

/// Runs the parsed command. Errors are printed by `main` and exit with status 1.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    let settings = Settings::load(cli.config.as_deref()).context("invalid configuration")?;
    telemetry::init(settings.log_format);
    let command = cli.command.unwrap_or(Command::Serve(ServeArgs::default()));
    match command {
        Command::Serve(args) => {
            tracing::info!(settings = %settings.redacted_json(), demo = args.demo, "starting dedup-console");
            let app = Application::build(settings, args.demo).await?;
            app.run_until_stopped(shutdown_signal()).await
        }
        Command::Migrate => {
            let groups = settings.consumer_groups().context("invalid consumer groups")?;
            let example: Vec<&str> = groups.iter().filter(|g| g.uses_example()).map(|g| g.group.as_str()).collect();
            if example.is_empty() {
                // A team's own groups (HTTP handlers): nothing of the example's in its database.
                open_engine_database(&settings).await?.close().await;
            } else {
                open_example_database(&settings).await?.close().await;
            }
            println!("migrations applied; schema {} verified ({})", settings.schema, settings.database_url.redacted());
            if !example.is_empty() {
                println!(
                    "the order example's tables are in that database too: group {} runs its handlers (configure \
                     your own groups with DEDUP_CONFIG, and point DATABASE_URL at a database of its own to try the example)",
                    example.join(", ")
                );
            }
            Ok(())
        }
        Command::Simulate(args) => run_simulate(&settings, args).await,
        Command::Publish(args) => run_publish(&settings, args).await,
        Command::Verify(args) => run_verify(&settings, args).await,
        Command::Seed(args) => run_seed(&settings, args).await,
        Command::User(command) => {
            let db = open_engine_database(&settings).await?;
            let result = crate::cli_users::run(&db, command).await;
            db.close().await;
            result
        }
        Command::Release(args) => run_record(&settings, RecordActionKind::Release, args).await,
        Command::MarkSucceeded(args) => run_record(&settings, RecordActionKind::MarkSucceeded, args).await,
        Command::DeadLetter(args) => run_record(&settings, RecordActionKind::DeadLetter, args).await,
        Command::Requeue(args) => run_record(&settings, RecordActionKind::Requeue, args).await,
        Command::RequeueBulk(args) => run_bulk(&settings, args).await,
        Command::RequeueConflicts(args) => run_conflicts(&settings, args).await,
        Command::Cleanup(args) => run_cleanup(&settings, args).await,
    }
}

async fn run_seed(settings: &Settings, args: SeedArgs) -> anyhow::Result<()> {
    let engine = open_engine_database(settings).await?;
    let bar = indicatif::ProgressBar::new(args.records);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} records ({per_sec})",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let params = SeedParams { records: args.records, days: args.days, batch: args.batch };
    let domain = dedup_example_orders::seed::order_domain();
    let report = seed_records(console_store(&engine), &params, &domain, |done, _| bar.set_position(done)).await;
    bar.finish_and_clear();
    engine.close().await;
    let report = report?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "seeded {} records first seen from {} until now in {:.1} s ({:.0} records/s)",
            report.records,
            report.from.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            report.seconds,
            report.rate
        );
        let asked = chrono::Utc::now() - chrono::TimeDelta::days(i64::from(args.days));
        if report.from - asked > chrono::TimeDelta::minutes(1) {
            println!(
                "(not the last {} days: records newer than that were there already, and a seed run starts after \
                 the newest of them, so that ids keep following first sightings; seed an empty database to spread them)",
                args.days
            );
        }
    }
    Ok(())
}

async fn run_simulate(settings: &Settings, args: SimulateArgs) -> anyhow::Result<()> {
    validate_share("duplicate-rate", args.duplicate_rate)?;
    validate_share("poison-rate", args.poison_rate)?;
    anyhow::ensure!(args.rate >= 0.0 && args.rate.is_finite(), "--rate must be 0 or more");
    let groups = groups_on(settings, args.source)?;
    let db = open_example_database(settings).await?;
    let first = &groups[0];
    let destination = first.destination();
    let source = first.source_factory(settings.amqp_url.expose());
    let publisher = source.open_publisher().await?;
    let params = SimulateParams {
        orders: args.orders,
        rate: args.rate,
        duplicate_rate: args.duplicate_rate,
        duplicate_delay_ms: args.duplicate_delay_ms,
        reorder_window: args.reorder_window,
        poison_rate: args.poison_rate,
        groups: groups.iter().filter_map(|g| g.simulated(&destination)).collect(),
        exchange: destination.clone(),
        seed: args.seed.unwrap_or_else(rand_seed),
    };
    let bar = indicatif::ProgressBar::new(args.orders * 3);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} messages ({per_sec}, eta {eta})",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let report = db
        .simulate(publisher.as_ref(), &params, &settings.orders, &first.settings.ids, |done, total| {
            bar.set_length(total);
            bar.set_position(done);
        })
        .await?;
    bar.finish_and_clear();
    publisher.close().await;
    source.close().await;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "run {}: {} orders, {} messages ({} poison), {} copies published ({} duplicates) in {:.1} s ({:.0}/s); \
             order numbers start with {}",
            report.run_id,
            report.orders,
            report.messages,
            report.poison,
            report.published,
            report.duplicates,
            report.seconds,
            report.rate,
            report.order_prefix
        );
    }
    db.close().await;
    Ok(())
}

fn rand_seed() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::SystemTime::now())
}

async fn run_verify(settings: &Settings, args: VerifyArgs) -> anyhow::Result<()> {
    let wait = Duration::from_secs(args.wait_secs);
    let groups = groups_on(settings, args.source)?;
    if args.lag_only {
        return run_lag_check(&groups, args.group.as_deref(), wait).await;
    }
    let db = open_example_database(settings).await?;
    let mut report = db.verify(&settings.schema, args.run, wait).await?;
    db.close().await;
    for group in groups.iter().filter(|g| g.source == Broker::Kafka) {
        check_kafka_lag(&mut report, &kafka_connector(group), wait).await?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_report(&report);
    }
    anyhow::ensure!(report.ok, "verification failed: {}", report.violations.join("; "));
    Ok(())
}

/// The Kafka connector of `group`, as its consumer has it.
fn kafka_connector(group: &GroupConfig) -> dedup_engine::kafka::KafkaConnector {
    let id_header = group.settings.ids.header().unwrap_or("x-message-id");
    dedup_engine::kafka::KafkaConnector::new(
        group.kafka.clone(),
        &group.group,
        group.settings.backoff.clone(),
        id_header,
    )
}

/// `verify --lag-only`: every Kafka group of `groups` (or `only`) has consumed and committed
/// every record of its topics, whoever produced them, within `wait`; prints each group's lag.
/// RabbitMQ groups are named and skipped (their queue depth is on the overview).
///
/// Errors: an unknown `only`, a group left with a lag, Kafka not answering.
async fn run_lag_check(groups: &[GroupConfig], only: Option<&str>, wait: Duration) -> anyhow::Result<()> {
    if let Some(name) = only {
        anyhow::ensure!(groups.iter().any(|g| g.group.as_str() == name), "no consumer group {name:?} is configured");
    }
    let mut lagging = Vec::new();
    for group in groups.iter().filter(|g| only.is_none_or(|name| g.group.as_str() == name)) {
        if group.source != Broker::Kafka {
            println!("group {}: RabbitMQ, no lag to check (its queue depth is on the overview)", group.group);
            continue;
        }
        let mut report = VerifyReport::default();
        check_kafka_lag(&mut report, &kafka_connector(group), wait).await?;
        let lag = report.kafka_lag.unwrap_or_default();
        println!(
            "group {}: lag {lag}{}",
            group.group,
            if lag == 0 { " (every record consumed and committed)" } else { "" }
        );
        if lag > 0 {
            lagging.push(group.group.to_string());
        }
    }
    anyhow::ensure!(lagging.is_empty(), "records not consumed and committed after {wait:?}: {}", lagging.join(", "));
    Ok(())
}

fn print_report(r: &VerifyReport) {
    println!("run {} (orders {}…): {}", r.run_id, r.order_prefix, if r.ok { "OK" } else { "VIOLATIONS" });
    println!(
        "  orders: {} published, {} created, {} paid; {} SMS sent",
        r.orders, r.orders_created, r.orders_paid, r.sms_sent
    );
    println!(
        "  messages: {} ids ({} copies): {} succeeded, {} dead ({} poison), {} failed, {} processing, {} missing",
        r.messages, r.copies, r.succeeded, r.dead, r.poison_dead, r.failed, r.processing, r.missing
    );
    if r.parked > 0 {
        println!(
            "  parked: {} stuck records with a redelivery parked on them (on_lease_expiry = hold): they wait for an \
             operator (release, mark succeeded or dead-letter on the Stuck page), not for the consumer",
            r.parked
        );
    }
    println!(
        "  double effects: {} reservations, {} payments, {} SMS; {} inconsistent orders; {} inventory mismatches",
        r.double_reservations, r.double_payments, r.double_sms, r.inconsistent_orders, r.inventory_mismatches
    );
    if let Some(lag) = r.kafka_lag {
        println!("  Kafka: {lag} records not yet consumed and committed by the group");
    }
    for v in &r.violations {
        println!("  violation: {v}");
    }
}

/// Resolves on SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
    tracing::info!("shutdown signal received");
}
