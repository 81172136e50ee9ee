//! The operator commands of the CLI (`release`, `mark-succeeded`, `dead-letter`, `requeue`,
//! `requeue-bulk`, `requeue-conflicts`): the same engine calls as the console and the REST API,
//! audited as `cli:<$USER>`, on PostgreSQL or MySQL.

use clap::Args;
use dedup_engine::console::actions::{ActionError, RecordAction, RecordActionKind, record_action};
use dedup_engine::console::{RecordStatus, console_store};
use uuid::Uuid;

use crate::config::{Settings, publishers};
use crate::startup::open_engine_database;

/// Options of the single-record commands.
#[derive(Debug, Args)]
pub struct RecordArgs {
    /// The record's id (as the console and `GET /api/v1/records` show it).
    pub id: i64,
    /// Why (required by release, mark-succeeded and dead-letter); written to the audit log.
    #[arg(long)]
    pub reason: Option<String>,
    /// The lease token of a processing record, as shown with it (required for one): the action
    /// is refused if the record was claimed again meanwhile.
    #[arg(long)]
    pub lease_token: Option<Uuid>,
    /// Refuse unless the record is still in this status (processing, failed, dead).
    #[arg(long)]
    pub expect_status: Option<RecordStatus>,
    /// Refuse unless the record still has this version (the `version` the console and
    /// `GET /api/v1/records/{id}` show; every state transition of the record raises it).
    #[arg(long)]
    pub expect_version: Option<i64>,
    /// Act on a processing record whose lease has not expired yet.
    #[arg(long)]
    pub force: bool,
    /// `release` only: also republish the stored message at once.
    #[arg(long)]
    pub requeue: bool,
}

/// The audit actor of CLI actions: `cli:<$USER>` (`cli:unknown` without `USER`).
pub fn cli_actor() -> String {
    format!("cli:{}", std::env::var("USER").unwrap_or_else(|_| "unknown".to_owned()))
}

/// Runs one single-record action and prints the outcome.
///
/// Errors: the action's refusal or failure (nothing changed then), an unreachable database or
/// broker.
pub async fn run_record(settings: &Settings, kind: RecordActionKind, args: RecordArgs) -> anyhow::Result<()> {
    let engine = open_engine_database(settings).await?;
    let pool = console_store(&engine);
    let actor = cli_actor();
    let params = RecordAction {
        record_id: args.id,
        expected_status: args.expect_status,
        lease_token: args.lease_token,
        expected_version: args.expect_version,
        force: args.force,
        reason: args.reason.as_deref(),
        requeue: args.requeue,
    };
    let publishers = publishers(&settings.consumer_groups()?, settings.amqp_url.expose());
    let outcome = record_action(pool, &actor, kind, &params, &publishers).await;
    publishers.close().await;
    engine.close().await;
    let o = outcome?;
    println!(
        "record {} ({} / {}): {} -> {}{}; audit entry {}",
        o.record_id,
        o.consumer_group,
        o.message_id,
        o.from,
        o.status,
        if o.republished { ", message published again" } else { "" },
        o.audit_id
    );
    Ok(())
}

/// `requeue-bulk` options: the records filter (as on the records page) and the job settings.
#[derive(Debug, Args)]
pub struct BulkArgs {
    /// Status: `dead` (default) or `failed` (others only show up as skipped).
    #[arg(long, default_value = "dead")]
    pub status: String,
    /// Consumer group.
    #[arg(long)]
    pub group: Option<String>,
    /// Message type, e.g. ORDER.PAY.
    #[arg(long = "type")]
    pub message_type: Option<String>,
    /// Error class (a dead-letter group).
    #[arg(long)]
    pub error_class: Option<String>,
    /// Messages per second.
    #[arg(long, default_value_t = dedup_engine::console::actions::bulk::DEFAULT_RATE)]
    pub rate: f64,
    /// Canary batch size.
    #[arg(long, default_value_t = dedup_engine::console::actions::bulk::DEFAULT_CANARY)]
    pub canary: i32,
    /// Failure threshold (share of recent publishes, 0–1).
    #[arg(long, default_value_t = dedup_engine::console::actions::bulk::DEFAULT_FAILURE_THRESHOLD)]
    pub threshold: f64,
    /// Why (audited).
    #[arg(long)]
    pub reason: Option<String>,
    /// Start the job (without it only the preview is printed). Confirms the preview's count.
    #[arg(long)]
    pub yes: bool,
}

/// Prints the preview of a bulk requeue; with `--yes` starts the job and runs it here (a
/// running server's runner takes over instead if it holds the job), printing progress.
///
/// Errors: an invalid filter or settings, refusals, database or broker errors.
pub async fn run_bulk(settings: &Settings, args: BulkArgs) -> anyhow::Result<()> {
    use dedup_engine::console::actions::bulk::{
        RequeueJobParams, requeue_job, requeue_job_start, requeue_preview, runner,
    };
    use dedup_engine::console::filter::{FilterText, RecordFilter};
    let filter = RecordFilter::parse(&FilterText {
        status: Some(&args.status),
        group: args.group.as_deref(),
        message_type: args.message_type.as_deref(),
        error_class: args.error_class.as_deref(),
        ..FilterText::default()
    })?;
    let engine = open_engine_database(settings).await?;
    let pool = console_store(&engine);
    let preview = requeue_preview(pool, &filter).await?;
    println!("matched now: {}; would be requeued: {}", preview.matched, preview.would_requeue);
    for (reason, n) in &preview.skipped {
        println!("  skipped ({reason}): {n}");
    }
    if !args.yes {
        println!("nothing started; add --yes to requeue {} records", preview.would_requeue);
        return Ok(());
    }
    let params = RequeueJobParams {
        filter: &filter,
        rate_per_sec: args.rate,
        canary_size: args.canary,
        failure_threshold: args.threshold,
        expected_count: Some(preview.would_requeue),
        reason: args.reason.as_deref(),
    };
    let job = requeue_job_start(pool, &cli_actor(), &params).await?;
    println!("job {} started ({} records frozen)", job.id, job.total - job.skipped);
    let publishers = publishers(&settings.consumer_groups()?, settings.amqp_url.expose());
    let shutdown = tokio_util::sync::CancellationToken::new();
    let progress = async {
        loop {
            tokio::time::sleep(std::time::Duration::from_secs(2)).await;
            if let Ok(j) = requeue_job(pool, job.id).await {
                println!(
                    "  {}: {} done, {} skipped, {} failed, {:.0}/s",
                    j.state,
                    j.done,
                    j.skipped,
                    j.failed,
                    j.observed_rate()
                );
            }
        }
    };
    tokio::select! {
        r = runner::run_job(pool, &publishers, job.id, &shutdown) => {
            if let Err(e) = r {
                let why = match e {
                    ActionError::Publish(broker) => broker,
                    other => other.to_string(),
                };
                publishers.close().await;
                anyhow::bail!(
                    "job {} stopped: {why}; it stays running, so a console server (`serve`) resumes it; \
                     pause or cancel it on the Requeues page",
                    job.id
                );
            }
        }
        () = progress => {}
    }
    let j = requeue_job(pool, job.id).await?;
    println!(
        "job {}: {} ({} done, {} skipped, {} failed){}",
        j.id,
        j.state,
        j.done,
        j.skipped,
        j.failed,
        j.paused_reason.as_deref().map(|r| format!("; {r}")).unwrap_or_default()
    );
    publishers.close().await;
    engine.close().await;
    // A job that stopped short (paused by its canary or failure ratio) is a failed command.
    anyhow::ensure!(
        j.state == "completed",
        "job {} is {}: see its reason above (resume it on the Requeues page)",
        j.id,
        j.state
    );
    Ok(())
}

/// `requeue-conflicts` options.
#[derive(Debug, Args)]
pub struct ConflictArgs {
    /// Only this consumer group's.
    #[arg(long)]
    pub group: Option<String>,
    /// Requeue them (without it, only count them).
    #[arg(long)]
    pub yes: bool,
}

/// Runs `requeue-conflicts`.
///
/// Errors: an unreachable database; exits non-zero when any copy failed to requeue.
pub async fn run_conflicts(settings: &Settings, args: ConflictArgs) -> anyhow::Result<()> {
    use dedup_engine::console::actions::conflicts::{open_conflicts, requeue_conflicts};
    let engine = open_engine_database(settings).await?;
    let pool = console_store(&engine);
    let open = open_conflicts(pool, args.group.as_deref()).await?.len();
    println!("open reused-id copies: {open}");
    if !args.yes {
        println!("nothing requeued; add --yes to requeue them under new message ids");
        engine.close().await;
        return Ok(());
    }
    let publishers = publishers(&settings.consumer_groups()?, settings.amqp_url.expose());
    let result = requeue_conflicts(pool, &cli_actor(), args.group.as_deref(), &publishers).await;
    publishers.close().await;
    engine.close().await;
    let (done, failed) = result?;
    println!("requeued: {}", done.len());
    for (id, e) in &failed {
        println!("  conflict {id} failed: {e}");
    }
    anyhow::ensure!(failed.is_empty(), "{} conflicting copies were not requeued", failed.len());
    Ok(())
}
