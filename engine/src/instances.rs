//! Every instance on the overview (DESIGN.md, "Instances"): each engine that consumes writes a
//! heartbeat row in `consumer_instances` every [`HEARTBEAT`] — its host, pid and start, and per
//! consumer group its broker, what it owns ([`SourceFactory::owned`]: Kafka partitions, or the
//! RabbitMQ queue its channels read), running workers and deliveries in flight. Any process that
//! serves the console lists every row (`EngineHandle::instances`), its own as it is now: an
//! operator sees who owns what during a rebalance. A clean stop deletes the row; a row not written for [`FORGET_AFTER`] is deleted by
//! any instance's next beat (a process killed for good).
//!
//! [`SourceFactory::owned`]: crate::source::SourceFactory::owned

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::runtime::RunningGroup;
use crate::runtime::books::{HeartbeatRow, RuntimeBooks};

/// How often an instance writes its row.
pub const HEARTBEAT: Duration = Duration::from_secs(5);

/// A row older than this is shown as gone: the process stopped without deleting it (SIGKILL, a
/// lost host) or cannot reach the database. Six beats.
pub const GONE_AFTER: Duration = Duration::from_secs(30);

/// A row older than this is deleted (a process that restarts in a loop leaves a gone row per
/// start; an hour of them is history enough).
pub const FORGET_AFTER: Duration = Duration::from_secs(3600);

/// Most instances listed: every live one of a large deployment, and the latest gone ones.
pub const MAX_LISTED: i64 = 100;

/// One consumer group of an instance. Every field but the group has a default, so a row written
/// by another version of the engine still reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceConsumer {
    /// The consumer group.
    pub group: String,
    /// `rabbitmq` or `kafka`.
    #[serde(default)]
    pub broker: String,
    /// What the instance owns: `<topic>[<partition>]` per Kafka partition, `queue <name>` for
    /// RabbitMQ; empty while it owns nothing (a Kafka member without partitions, a broker that
    /// cannot be reached).
    #[serde(default)]
    pub owned: Vec<String>,
    /// Workers running (each a RabbitMQ channel, or a reader of the Kafka member).
    #[serde(default)]
    pub workers: u64,
    /// Deliveries taken from the broker and not yet settled.
    #[serde(default)]
    pub in_flight: u64,
    /// Whether its broker connection was up.
    #[serde(default)]
    pub connected: bool,
}

/// One instance: an engine that consumes, as its last heartbeat described it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, sqlx::FromRow)]
pub struct Instance {
    /// `<host>:<pid>:<8 random hex digits>` (a pid reused after a restart, or two engines in
    /// one process, are other instances).
    pub instance_id: String,
    /// Host name.
    pub host: String,
    /// Process id.
    pub pid: i32,
    /// When it started.
    pub started_at: DateTime<Utc>,
    /// Its last heartbeat (database time).
    pub last_seen_at: DateTime<Utc>,
    /// True when the last heartbeat is older than 30 s (six beats).
    pub gone: bool,
    /// Whether it is the engine that answered: its consumers are shown as they are now, not as
    /// its last heartbeat wrote them.
    #[sqlx(skip)]
    pub this_process: bool,
    /// Its consumer groups, in their declared order.
    #[sqlx(json)]
    pub consumers: Vec<InstanceConsumer>,
}

/// The instances with a row, live ones first, then newest start first, at most
/// [`MAX_LISTED`] (database time decides what is gone); `own`, the asking engine's beat and
/// groups, has its row's consumers read now.
///
/// Errors: database errors.
pub(crate) async fn instances(
    books: &dyn RuntimeBooks,
    own: Option<(&Beat, &[RunningGroup])>,
) -> Result<Vec<Instance>, sqlx::Error> {
    let read = books.instances(millis(GONE_AFTER), MAX_LISTED);
    let now = async {
        match own {
            Some((_, groups)) => Some(Beat::consumers(groups).await),
            None => None,
        }
    };
    let (rows, now) = tokio::join!(read, now);
    let mut rows = rows?;
    if let (Some((beat, _)), Some(now)) = (own, now)
        && let Some(row) = rows.iter_mut().find(|r| r.instance_id == beat.instance_id)
    {
        row.this_process = true;
        row.gone = false;
        row.consumers = now;
    }
    Ok(rows)
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// An engine as an instance: its id and what its groups are doing now.
pub(crate) struct Beat {
    instance_id: String,
    host: String,
    pid: i32,
    started_at: DateTime<Utc>,
}

impl Beat {
    pub(crate) fn new() -> Self {
        let host = crate::worker::hostname();
        let pid = std::process::id();
        let started_at = Utc::now();
        let instance_id = format!("{host}:{pid}:{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
        Self { instance_id, host, pid: i32::try_from(pid).unwrap_or(i32::MAX), started_at }
    }

    async fn consumers(groups: &[RunningGroup]) -> Vec<InstanceConsumer> {
        let each = groups.iter().filter_map(|g| {
            let status = g.status.clone()?;
            Some(async move {
                InstanceConsumer {
                    group: g.name.to_string(),
                    broker: g.broker().as_str().to_owned(),
                    owned: g.source.owned().await,
                    workers: status.running_workers() as u64,
                    in_flight: status.in_flight() as u64,
                    connected: g.source.connected(),
                }
            })
        });
        futures::future::join_all(each).await
    }

    async fn write(&self, books: &dyn RuntimeBooks, groups: &[RunningGroup]) -> Result<(), sqlx::Error> {
        let consumers = Self::consumers(groups).await;
        books
            .write_heartbeat(&HeartbeatRow {
                instance_id: &self.instance_id,
                host: &self.host,
                pid: self.pid,
                started_at: self.started_at,
                consumers: &consumers,
                forget_after_ms: millis(FORGET_AFTER),
            })
            .await
    }
}

/// Longest wait for the row's deletion at a clean stop (a database that hangs must not hold
/// the stop; the row then shows as gone after [`GONE_AFTER`]).
const DELETE_TIMEOUT: Duration = Duration::from_secs(2);

/// Writes `beat`'s row every [`HEARTBEAT`] until `shutdown` (a write in progress is abandoned
/// then), then deletes it. A failed write is logged and tried at the next beat.
pub(crate) async fn run_heartbeat(
    books: Arc<dyn RuntimeBooks>,
    beat: Arc<Beat>,
    groups: Arc<Vec<RunningGroup>>,
    shutdown: CancellationToken,
) {
    let mut ticker = tokio::time::interval(HEARTBEAT);
    loop {
        let written = tokio::select! {
            () = shutdown.cancelled() => break,
            _ = ticker.tick() => tokio::select! {
                () = shutdown.cancelled() => break,
                written = beat.write(books.as_ref(), &groups) => written,
            },
        };
        if let Err(e) = written {
            tracing::warn!(error = %e, "writing this instance's heartbeat failed; will retry");
        }
    }
    match tokio::time::timeout(DELETE_TIMEOUT, books.delete_heartbeat(&beat.instance_id)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "deleting this instance's heartbeat row failed; it shows as gone"),
        Err(_) => tracing::warn!("deleting this instance's heartbeat row timed out; it shows as gone"),
    }
}
