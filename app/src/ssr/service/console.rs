//! The console's reads as wire types: one function per page or API resource, called by the
//! page's server function and by the REST API alike (parse, one engine call, convert, map the
//! error).

use std::time::Duration;

use dedup_engine::console::filter::{FilterText, RecordListParams};
use dedup_engine::console::{QueryError, failures, overview, records};

use super::convert::{endpoint_view, record_detail_view, totals};
use super::state::ConsoleState;
use crate::error::ConsoleError;
use crate::wire::failures::{DeadLetterGroupView, RetriesView, StuckView};
use crate::wire::overview::{ConsumerView, EndpointView, GroupView, GrowthView, LiveView, OverviewView};
use crate::wire::records::{
    ConflictView, LateDuplicateNote, RecordDetailView, RecordFilterOptions, RecordPageView, RecordsQuery,
};

/// Rows on the stuck page (the longest stuck; the total is shown): each row hydrates its action
/// buttons, and 200 of them took about 300 ms in Chromium at 10 M records (BENCHMARKS.md).
const STUCK_ROWS: i64 = 50;
/// Rows of the retries page's "most retried" list.
const MOST_RETRIED_ROWS: i64 = 50;
/// Dead-letter groups shown.
const DEAD_LETTER_GROUPS: i64 = 200;
/// Longest wait for the broker's queue depth on the overview.
const QUEUE_DEPTH_TIMEOUT: Duration = Duration::from_millis(500);

/// The live numbers (also what `/api/v1/events` pushes).
pub async fn live(state: &ConsoleState) -> Result<LiveView, ConsoleError> {
    Ok(overview::live_snapshot(state.store()).await?.into())
}

/// The engine's consumer groups; each queue depth (or lag) asked of the broker with a short
/// timeout, all at once.
pub async fn consumers(state: &ConsoleState) -> Vec<ConsumerView> {
    let views = state.engine.groups().iter().map(|group| async move {
        let queue_depth = tokio::time::timeout(QUEUE_DEPTH_TIMEOUT, group.source.depth()).await.ok().flatten();
        let status = group.status.as_deref();
        ConsumerView {
            enabled: status.is_some(),
            group: group.name.to_string(),
            types: group.types.clone(),
            broker: group.broker().as_str().to_owned(),
            connected: group.source.connected(),
            running_workers: status.map_or(0, |s| s.running_workers() as u64),
            in_flight: status.map_or(0, |s| s.in_flight() as u64),
            queue_depth,
            last_error: status.and_then(|s| s.last_error()).map(|(at, e)| format!("{}: {e}", super::convert::time(at))),
            topology_refused: status.and_then(|s| s.topology_refused()),
            failed_batches: status.map_or(0, |s| s.failed_batches()),
            failing: status
                .and_then(|s| s.failing())
                .map(|run| format!("{} batches given back since {}", run.batches, super::convert::time(run.since))),
            last_recovery: status.and_then(|s| s.last_recovery()).and_then(|run| {
                let resumed = run.resumed_at?;
                let took = (resumed - run.since).num_milliseconds() as f64 / 1000.0;
                Some(format!(
                    "resumed {} after {took:.1} s ({} batches given back)",
                    super::convert::time(resumed),
                    run.batches
                ))
            }),
        }
    });
    futures::future::join_all(views).await
}

/// The engine's HTTP endpoints (each group's HTTP handlers, in declared order) with their calls
/// of the last 15 minutes: one query for all.
pub async fn endpoints(state: &ConsoleState) -> Result<Vec<EndpointView>, ConsoleError> {
    let declared: Vec<_> = state.engine.groups().iter().flat_map(|g| g.http.iter().map(move |e| (g, e))).collect();
    let keys: Vec<(&str, &str)> = declared.iter().map(|(g, e)| (g.name.as_str(), e.message_type.as_str())).collect();
    let (calls, pauses) = tokio::join!(state.store().endpoint_calls(&keys), state.store().handler_pauses());
    let pauses = pauses.map_err(ConsoleError::internal)?;
    let pause = |group: &str, message_type: &str| {
        pauses.iter().find(|p| p.consumer_group == group && p.message_type == message_type)
    };
    Ok(declared
        .into_iter()
        .zip(calls?)
        .map(|((g, e), c)| {
            endpoint_view(e, g.name.as_str(), g.status.is_some(), c, pause(g.name.as_str(), &e.message_type))
        })
        .collect())
}

/// Everything on the overview but the chart and the dependency health.
pub async fn overview(state: &ConsoleState) -> Result<OverviewView, ConsoleError> {
    let reads = state.store();
    let (snapshot, last_hour, last_day, delays, consumers, endpoints, instances) = tokio::join!(
        overview::live_snapshot(reads),
        reads.traffic(3600),
        reads.traffic(86_400),
        reads.duplicate_delays(30),
        consumers(state),
        endpoints(state),
        state.engine.instances(),
    );
    let snapshot = snapshot?;
    Ok(OverviewView {
        groups: group_views(&snapshot.counts),
        live: snapshot.into(),
        last_hour: last_hour?.into(),
        last_day: last_day?.into(),
        consumers,
        duplicate_delays: delays?.into_iter().map(Into::into).collect(),
        endpoints: endpoints?,
        instances: instances.map_err(QueryError::from)?.into_iter().map(Into::into).collect(),
    })
}

fn group_views(counts: &[overview::StatusCount]) -> Vec<GroupView> {
    let mut names: Vec<&str> = counts.iter().map(|c| c.consumer_group.as_str()).collect();
    names.dedup();
    names
        .into_iter()
        .map(|name| GroupView {
            name: name.to_owned(),
            counts: totals(counts.iter().filter(|c| c.consumer_group == name)),
        })
        .collect()
}

/// Consumer groups with their records by status.
pub async fn groups(state: &ConsoleState) -> Result<Vec<GroupView>, ConsoleError> {
    Ok(group_views(&state.store().status_counts().await?))
}

/// Known message types.
pub async fn message_types(state: &ConsoleState) -> Result<Vec<String>, ConsoleError> {
    Ok(state.store().message_types().await?)
}

/// The records filter's choices: consumer groups and message types.
pub async fn filter_options(state: &ConsoleState) -> Result<RecordFilterOptions, ConsoleError> {
    let (groups, message_types) = tokio::try_join!(state.store().consumer_groups(), state.store().message_types())?;
    Ok(RecordFilterOptions { groups, message_types })
}

/// The growth chart over `range` (`1h`, `24h` (default), `7d`, `30d`).
pub async fn growth(state: &ConsoleState, range: Option<&str>) -> Result<GrowthView, ConsoleError> {
    let range = overview::GrowthRange::parse(range)?;
    let points = state.store().growth(range).await?;
    Ok(GrowthView {
        range: range.as_str().to_owned(),
        bucket_secs: range.seconds().1,
        points: points.into_iter().map(Into::into).collect(),
    })
}

/// The text of a records query, for the engine's parsers (records list, bulk requeue filter).
pub fn filter_text(q: &RecordsQuery) -> FilterText<'_> {
    FilterText {
        group: q.group.as_deref(),
        status: q.status.as_deref(),
        message_type: q.message_type.as_deref(),
        error_class: q.error_class.as_deref(),
        from: q.from.as_deref(),
        to: q.to.as_deref(),
        min_attempts: q.min_attempts.as_deref(),
        message_id: q.id.as_deref(),
        id_prefix: q.prefix.as_deref(),
        flag: q.flag.as_deref(),
        sort: q.sort.as_deref(),
        order: q.order.as_deref(),
        after: q.after.as_deref(),
        before: q.before.as_deref(),
        limit: q.limit.as_deref(),
    }
}

/// One page of records.
pub async fn records(state: &ConsoleState, q: &RecordsQuery) -> Result<RecordPageView, ConsoleError> {
    let params = RecordListParams::parse(&filter_text(q))?;
    Ok(records::records_list(state.store(), &params).await?.into())
}

/// One record with its history and its Redis marker.
///
/// Errors: [`ConsoleError::NotFound`] when no record has `id`.
pub async fn record(state: &ConsoleState, id: i64) -> Result<RecordDetailView, ConsoleError> {
    let detail = records::record_detail(state.store(), id)
        .await?
        .ok_or_else(|| ConsoleError::NotFound(format!("no record has id {id}")))?;
    let key = state.fast_path().key(&detail.row.consumer_group, &detail.row.message_id);
    let marker = records::record_marker(state.fast_path(), &detail.row.consumer_group, &detail.row.message_id).await;
    let late = state.store().late_duplicate_note(id).await?;
    let late = late.map(|(first_seen_at, delay_ms, held)| LateDuplicateNote {
        first_seen_at: super::convert::time(first_seen_at),
        delay_ms,
        held,
    });
    let conflicts = dedup_engine::console::actions::conflicts::record_conflicts(state.store(), id).await?;
    let mut view = record_detail_view(detail, late, key, marker);
    view.conflicts = conflicts
        .into_iter()
        .map(|c| ConflictView {
            id: c.id,
            kind: c.kind,
            message_type: c.message_type,
            id_source: c.id_source,
            payload_excerpt: c.payload_excerpt.0,
            payload_bytes: c.payload_bytes,
            source_exchange: c.source_exchange,
            source_routing_key: c.source_routing_key,
            copies: c.copies,
            first_seen_at: super::convert::time(c.first_seen_at),
            last_seen_at: super::convert::time(c.last_seen_at),
            requeued_as: c.requeued_as,
            settled_at: c.settled_at.map(super::convert::time),
            settled_by: c.settled_by,
        })
        .collect();
    Ok(view)
}

/// Stuck records, longest stuck first.
pub async fn stuck(state: &ConsoleState) -> Result<StuckView, ConsoleError> {
    Ok(state.store().stuck_records(STUCK_ROWS).await?.into())
}

/// The retries page.
pub async fn retries(state: &ConsoleState) -> Result<RetriesView, ConsoleError> {
    Ok(failures::retries(state.store(), state.store(), MOST_RETRIED_ROWS).await?.into())
}

/// Dead letters grouped by error class.
pub async fn dead_letters(state: &ConsoleState) -> Result<Vec<DeadLetterGroupView>, ConsoleError> {
    Ok(state.store().dead_letter_groups(DEAD_LETTER_GROUPS).await?.into_iter().map(Into::into).collect())
}
