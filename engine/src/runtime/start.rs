//! What an engine starts the same way on every database: its keys' reads, the fast path, each
//! group's consumer over the pipeline's store, the heartbeat and the aggregate flusher
//! ([`EngineBuilder::start_groups`]).

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::books::RuntimeBooks;
use super::{EngineBuilder, EngineError, RunningGroup};
use crate::actions::cleanup::late::RetentionWatch;
use crate::actions::republish::Publishers;
use crate::consumer::Consumer;
use crate::db::SchemaError;
use crate::fastpath::FastPath;
use crate::group::Group;
use crate::instances::Beat;
use crate::pipeline::{Pipeline, PipelineSettings};
use crate::record::ConsumerGroup;
use crate::stats::Stats;
use crate::store::{DedupStore, PipelineStore};

impl EngineBuilder {
    /// Starts what every database runs the same way: the engine keys' reads, the fast path,
    /// each group's consumer over `store` (when the engine consumes), the heartbeat and the
    /// aggregate flusher, their tasks pushed onto `tasks`.
    pub(super) async fn start_groups<S: PipelineStore>(
        &self,
        store: S,
        books: &Arc<dyn RuntimeBooks>,
        retention: &Arc<RetentionWatch>,
        groups: Vec<(ConsumerGroup, Group)>,
        shutdown: &CancellationToken,
        tasks: &mut Vec<JoinHandle<()>>,
    ) -> Result<StartedGroups, EngineError> {
        let source_key = books.engine_key("source-headers").await.map_err(SchemaError::Query)?;
        // Markers are this database's (DESIGN.md, "Redis fast path"): another database on the same
        // Redis and prefix — one recreated, test and staging side by side — has other records, and
        // must not take this one's markers for duplicates and skip its messages.
        let database = books.engine_key("fast-path-namespace").await.map_err(SchemaError::Query)?;
        let mut fast_path = self.fast_path.clone();
        let namespace: String = database[..6].iter().map(|b| format!("{b:02x}")).collect();
        fast_path.prefix = format!("{}:{namespace}", fast_path.prefix);
        let fast_path = Arc::new(FastPath::new(&self.redis_url, fast_path));
        let stats = Arc::new(Stats::default());
        let mut publishers = Publishers::default();
        let mut running = Vec::with_capacity(groups.len());
        for (name, group) in groups {
            let factory = group.source_factory_keyed(Some(&source_key));
            publishers.add(name.as_str(), factory.clone());
            let types = group.handlers.types().into_iter().map(str::to_owned).collect();
            let http = group.handlers.http_endpoints();
            let status = if self.consume {
                warn_of_conflicts(books.as_ref(), &name).await;
                let s = &group.settings;
                let pipeline = Pipeline::new(
                    store.clone(),
                    fast_path.clone(),
                    stats.clone(),
                    group.handlers,
                    PipelineSettings {
                        group: name.clone(),
                        max_attempts: s.max_attempts.max(1),
                        lease: Duration::from_millis(s.lease_ms),
                        backoff: s.backoff.clone(),
                        id_policy: s.ids.clone(),
                        type_policy: s.types.clone(),
                        keep_poison_payload_bytes: s.keep_poison_payload_bytes,
                        late_duplicates: s.late_duplicates,
                    },
                )
                .with_retention(retention.clone());
                let consumer = Consumer::new(pipeline, factory.clone(), s.workers.clone());
                let status = consumer.status();
                tasks.push(tokio::spawn(consumer.run(shutdown.clone())));
                Some(status)
            } else {
                None
            };
            running.push(RunningGroup { name, source: factory, status, types, http });
        }
        let running = Arc::new(running);
        let beat = self.consume.then(|| Arc::new(Beat::new()));
        if let Some(beat) = &beat {
            tasks.push(tokio::spawn(crate::instances::run_heartbeat(
                books.clone(),
                beat.clone(),
                running.clone(),
                shutdown.clone(),
            )));
        }
        tasks.push(tokio::spawn(run_stats_flusher(
            books.clone(),
            store,
            stats,
            self.stats_flush,
            shutdown.clone(),
        )));
        Ok(StartedGroups { fast_path, publishers, groups: running, beat })
    }
}


/// What [`EngineBuilder::start_groups`] started, for the engine's handle.
pub(crate) struct StartedGroups {
    pub(super) fast_path: Arc<FastPath>,
    pub(super) publishers: Publishers,
    pub(super) groups: Arc<Vec<RunningGroup>>,
    pub(super) beat: Option<Arc<Beat>>,
}

/// Flushes the in-memory aggregates and folds the record counts' delta rows every `period`,
/// samples the table size every minute, until shutdown (then flushes once more).
async fn run_stats_flusher<S: DedupStore>(
    books: Arc<dyn RuntimeBooks>,
    store: S,
    stats: Arc<Stats>,
    period: Duration,
    shutdown: CancellationToken,
) {
    let mut ticker = tokio::time::interval(period.max(Duration::from_millis(10)));
    let mut last_sample: Option<tokio::time::Instant> = None;
    loop {
        let stopping = tokio::select! {
            () = shutdown.cancelled() => true,
            _ = ticker.tick() => false,
        };
        if let Err(e) = stats.flush_to(books.as_ref(), &store).await {
            tracing::warn!(error = %e, "flushing aggregates failed; will retry");
        }
        if let Err(e) = books.fold_record_counts().await {
            tracing::warn!(error = %e, "folding the record counts failed; will retry");
        }
        if last_sample.is_none_or(|at| at.elapsed() >= Duration::from_secs(60)) {
            if let Err(e) = books.sample_table().await {
                tracing::warn!(error = %e, "sampling the table size failed");
            }
            last_sample = Some(tokio::time::Instant::now());
        }
        if stopping {
            return;
        }
    }
}

/// Says at a group's start when conflicting copies of its deliveries wait for an operator
/// (DESIGN.md, "Reused ids and payload conflicts"): many of them mean its id source is wrong.
async fn warn_of_conflicts(books: &dyn RuntimeBooks, group: &ConsumerGroup) {
    match books.open_conflicts(group.as_str()).await {
        Ok(0) => {}
        Ok(open) => tracing::warn!(
            group = group.as_str(),
            open,
            "deliveries that reused an existing record's message id (another type or payload) wait for an operator: \
             is the group's ids.from right? The overview's \"id conflicts\" lists them; requeue them once it is"
        ),
        Err(e) => tracing::warn!(group = group.as_str(), error = %e, "counting conflicting copies failed"),
    }
}
