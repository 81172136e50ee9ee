//! `dedup-console cleanup list|create|edit|run`: cleanup schedules from the command line, the
//! same engine calls as the Cleanup page and `POST`/`PUT /api/v1/cleanup/schedules`, validated
//! and audited alike (actor `cli:<$USER>`), on the engine's database (PostgreSQL or MySQL)
//! through the console store. `cleanup ID [--dry-run]` is `cleanup run`.

use clap::{Args, Subcommand};
use dedup_engine::EnginePool;
use dedup_engine::console::actions::cleanup::{
    CleanupSchedule, ScheduleInput, cleanup_dry_run, cleanup_runs, cleanup_schedule_save, cleanup_schedules, scheduler,
};
use dedup_engine::console::{RecordStatus, console_store};

use crate::config::Settings;
use crate::operator::cli_actor;
use crate::startup::open_engine_database;

/// `cleanup` options: a subcommand, or a schedule id to run now.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct CleanupArgs {
    /// What to do with schedules.
    #[command(subcommand)]
    pub command: Option<CleanupCommand>,
    /// Run this schedule now (as `cleanup run ID`).
    #[command(flatten)]
    pub run: RunArgs,
}

/// `cleanup` subcommands.
#[derive(Debug, Subcommand)]
pub enum CleanupCommand {
    /// List the schedules: id, name, cron, retention, statuses, group, next run.
    List,
    /// Create a schedule (enabled unless --disabled).
    Create(CreateArgs),
    /// Change a schedule: the options given replace those values, the rest stay.
    Edit(EditArgs),
    /// Run a schedule now and wait for the run to end, or count what it would delete.
    Run(RunArgs),
}

/// `cleanup run` options.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The schedule's id (see `cleanup list`).
    pub schedule: Option<i64>,
    /// Only count what would be deleted.
    #[arg(long)]
    pub dry_run: bool,
}

/// `cleanup create` options.
#[derive(Debug, Args)]
pub struct CreateArgs {
    /// A unique name, 1 to 100 characters.
    #[arg(long)]
    pub name: String,
    /// Five-field cron expression, UTC (minute hour day-of-month month day-of-week).
    #[arg(long, default_value = "0 3 * * *")]
    pub cron: String,
    /// Delete records older than this many days (1 to 3650). Keep it above the retention
    /// advice on the Cleanup page (twice the longest duplicate delay seen).
    #[arg(long, default_value_t = 30)]
    pub retention_days: i32,
    /// Records per delete statement (1 to 100 000).
    #[arg(long, default_value_t = 5000)]
    pub batch_size: i32,
    /// A status to delete (repeat for more): succeeded (default), failed, dead.
    #[arg(long = "status")]
    pub statuses: Vec<RecordStatus>,
    /// Only this consumer group (default: all).
    #[arg(long)]
    pub group: Option<String>,
    /// Create it without letting the scheduler run it.
    #[arg(long)]
    pub disabled: bool,
    /// Days to keep the fingerprints of what it deletes, by which late duplicates are known
    /// (0 to 36500; 0 keeps none). Default: ten times the retention.
    #[arg(long)]
    pub fingerprint_days: Option<i32>,
}

/// `cleanup edit` options.
#[derive(Debug, Args)]
pub struct EditArgs {
    /// The schedule's id (see `cleanup list`).
    pub schedule: i64,
    /// New name.
    #[arg(long)]
    pub name: Option<String>,
    /// New cron expression.
    #[arg(long)]
    pub cron: Option<String>,
    /// New retention, days.
    #[arg(long)]
    pub retention_days: Option<i32>,
    /// New batch size.
    #[arg(long)]
    pub batch_size: Option<i32>,
    /// Days to keep fingerprints of deleted records (0 keeps none).
    #[arg(long, conflicts_with = "default_fingerprint_days")]
    pub fingerprint_days: Option<i32>,
    /// Keep fingerprints ten times the retention again (the default).
    #[arg(long)]
    pub default_fingerprint_days: bool,
    /// The statuses to delete, replacing the old ones (repeat for more).
    #[arg(long = "status")]
    pub statuses: Vec<RecordStatus>,
    /// Only this consumer group.
    #[arg(long, conflicts_with = "all_groups")]
    pub group: Option<String>,
    /// Every consumer group.
    #[arg(long)]
    pub all_groups: bool,
    /// Let the scheduler run it.
    #[arg(long, conflicts_with = "disable")]
    pub enable: bool,
    /// Stop the scheduler running it.
    #[arg(long)]
    pub disable: bool,
}

impl EditArgs {
    /// The stored schedule with the given options laid over it.
    fn apply(self, stored: CleanupSchedule) -> anyhow::Result<ScheduleInput> {
        let statuses = if self.statuses.is_empty() {
            stored.statuses.iter().map(|s| s.parse()).collect::<Result<_, _>>()?
        } else {
            self.statuses
        };
        let consumer_group = match (self.group, self.all_groups) {
            (Some(group), _) => Some(group),
            (None, true) => None,
            (None, false) => stored.consumer_group,
        };
        Ok(ScheduleInput {
            name: self.name.unwrap_or(stored.name),
            cron: self.cron.unwrap_or(stored.cron),
            retention_days: self.retention_days.unwrap_or(stored.retention_days),
            batch_size: self.batch_size.unwrap_or(stored.batch_size),
            statuses,
            consumer_group,
            enabled: (stored.enabled || self.enable) && !self.disable,
            fingerprint_days: match (self.fingerprint_days, self.default_fingerprint_days) {
                (Some(days), _) => Some(days),
                (None, true) => None,
                (None, false) => stored.fingerprint_days,
            },
        })
    }
}

/// Runs a `cleanup` command.
///
/// Errors: an invalid schedule (the message says which value and why), a name taken, an unknown
/// schedule, a run in progress or stopped early, an unreachable database.
pub async fn run_cleanup(settings: &Settings, args: CleanupArgs) -> anyhow::Result<()> {
    let engine = open_engine_database(settings).await?;
    let result = cleanup_command(&engine, args).await;
    engine.close().await;
    result
}

async fn cleanup_command(engine: &EnginePool, args: CleanupArgs) -> anyhow::Result<()> {
    let actor = cli_actor();
    let pool = console_store(engine);
    match args.command {
        Some(CleanupCommand::List) => {
            println!(
                "{:>4}  {:<24} {:<14} {:>9}  {:>12}  {:<24} {:<16} next run (UTC)",
                "id", "name", "cron", "retention", "fingerprints", "statuses", "group"
            );
            for s in cleanup_schedules(pool).await? {
                let next = next_run(&s);
                let group = s.consumer_group.as_deref().unwrap_or("all");
                let retention = format!("{} d", s.retention_days);
                let fingerprints = format!("{} d", s.fingerprint_horizon_days());
                // Names and groups are printed escaped: they come from operators' input.
                println!(
                    "{:>4}  {:<24} {:<14} {:>9}  {:>12}  {:<24} {:<16} {next}",
                    s.id,
                    s.name.escape_debug().to_string(),
                    s.cron,
                    retention,
                    fingerprints,
                    s.statuses.join(","),
                    group.escape_debug().to_string()
                );
            }
        }
        Some(CleanupCommand::Create(c)) => {
            let input = ScheduleInput {
                name: c.name,
                cron: c.cron,
                retention_days: c.retention_days,
                batch_size: c.batch_size,
                statuses: if c.statuses.is_empty() { vec![RecordStatus::Succeeded] } else { c.statuses },
                consumer_group: c.group,
                enabled: !c.disabled,
                fingerprint_days: c.fingerprint_days,
            };
            let saved = cleanup_schedule_save(pool, &actor, None, &input).await?;
            println!("schedule {} created; next run: {}", saved.id, next_run(&saved));
        }
        Some(CleanupCommand::Edit(e)) => {
            let id = e.schedule;
            let stored = cleanup_schedules(pool).await?.into_iter().find(|s| s.id == id);
            let stored =
                stored.ok_or_else(|| anyhow::anyhow!("no cleanup schedule has id {id} (cleanup list shows them)"))?;
            let input = e.apply(stored)?;
            let saved = cleanup_schedule_save(pool, &actor, Some(id), &input).await?;
            println!("schedule {} saved; next run: {}", saved.id, next_run(&saved));
        }
        Some(CleanupCommand::Run(run)) => run_now(engine, &actor, run).await?,
        None => run_now(engine, &actor, args.run).await?,
    }
    Ok(())
}

/// The next tick (UTC), `disabled`, or `-` when the expression never matches again.
fn next_run(s: &CleanupSchedule) -> String {
    match (s.enabled, s.next_run_at) {
        (false, _) => "disabled".to_owned(),
        (true, Some(at)) => at.format("%Y-%m-%d %H:%M").to_string(),
        (true, None) => "-".to_owned(),
    }
}

/// Dry-runs or runs a schedule now and waits for the run to finish.
async fn run_now(engine: &EnginePool, actor: &str, args: RunArgs) -> anyhow::Result<()> {
    let pool = console_store(engine);
    let Some(schedule) = args.schedule else {
        anyhow::bail!("name a schedule to run (cleanup run ID; cleanup list shows them), or a subcommand");
    };
    if args.dry_run {
        println!("{} records would be deleted", cleanup_dry_run(pool, schedule).await?);
        return Ok(());
    }
    let run_id = scheduler::cleanup_run_now(engine, actor, schedule).await?;
    loop {
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        let runs = cleanup_runs(pool, Some(schedule), 20).await?;
        if let Some(run) = runs.iter().find(|r| r.id == run_id && r.finished_at.is_some()) {
            println!("run {run_id}: {} records deleted in {} batches", run.rows_deleted, run.batches);
            anyhow::ensure!(run.error.is_none(), "cleanup stopped early: {}", run.error.clone().unwrap_or_default());
            return Ok(());
        }
    }
}
