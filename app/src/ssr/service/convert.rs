//! Engine rows → wire types. Times become RFC 3339 (UTC, seconds); payloads become escaped-safe
//! text (pretty JSON, UTF-8 or hex).

use chrono::{DateTime, SecondsFormat, Utc};
use dedup_engine::console::actions::handlers::HandlerPause;
use dedup_engine::console::endpoints::{self, EndpointCalls};
use dedup_engine::console::failures::{DeadLetterGroup, RetryOverview, StuckList};
use dedup_engine::console::overview::{DelayBucket, GrowthPoint, LiveSnapshot, StatusCount, Traffic};
use dedup_engine::console::records::{MarkerState, RecordDetail, RecordPage, RecordRow};
use dedup_engine::console::{HttpEndpoint, Instance, RecordStatus};

use crate::wire::failures::{
    AttemptsBucketView, DeadLetterGroupView, RetriesView, StuckRecordView, StuckView, TypeRetriesView,
};
use crate::wire::overview::{
    AnswerCountView, DelayBucketView, EndpointView, GrowthPointView, InstanceConsumerView, InstanceView, LiveView,
    StatusTotals, TrafficView,
};
use crate::wire::records::{
    AttemptView, LateDuplicateNote, MarkerView, PayloadView, RecordDetailView, RecordPageView, RecordSummary,
    SourceView,
};

/// RFC 3339, UTC, whole seconds.
pub fn time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

pub fn opt_time(t: Option<DateTime<Utc>>) -> Option<String> {
    t.map(time)
}

/// Sums counts by status (of one group, or all).
pub fn totals<'a>(counts: impl IntoIterator<Item = &'a StatusCount>) -> StatusTotals {
    let mut t = StatusTotals::default();
    for c in counts {
        match c.status {
            RecordStatus::Processing => t.processing += c.count,
            RecordStatus::Succeeded => t.succeeded += c.count,
            RecordStatus::Failed => t.failed += c.count,
            RecordStatus::Dead => t.dead += c.count,
        }
        t.total += c.count;
    }
    t
}

impl From<Traffic> for TrafficView {
    fn from(t: Traffic) -> Self {
        TrafficView {
            deliveries: t.deliveries,
            created: t.created,
            duplicates: t.duplicates_redis + t.duplicates_db,
            duplicate_rate: t.duplicate_rate(),
            redis_hits: t.redis_hits,
            redis_misses: t.redis_misses,
            redis_hit_ratio: t.redis_hit_ratio(),
            redis_fallbacks: t.redis_fallbacks,
            retries: t.retries,
            failed: t.failed,
            dead: t.dead,
        }
    }
}

impl From<LiveSnapshot> for LiveView {
    fn from(s: LiveSnapshot) -> Self {
        LiveView {
            at: time(s.at),
            totals: totals(&s.counts),
            stuck: s.stuck,
            double_effects: s.double_effects,
            late_duplicates: s.late_duplicates,
            conflicts: s.conflicts,
            last_minute: s.last_minute.into(),
        }
    }
}

impl From<GrowthPoint> for GrowthPointView {
    fn from(p: GrowthPoint) -> Self {
        GrowthPointView {
            at: time(p.at),
            created: p.created,
            total_records: p.total_records,
            table_bytes: p.table_bytes,
            index_bytes: p.index_bytes,
        }
    }
}

impl From<Instance> for InstanceView {
    fn from(i: Instance) -> Self {
        InstanceView {
            name: format!("{}:{}", i.host, i.pid),
            instance_id: i.instance_id,
            started_at: time(i.started_at),
            last_seen_at: time(i.last_seen_at),
            gone: i.gone,
            this_process: i.this_process,
            consumers: i
                .consumers
                .into_iter()
                .map(|c| InstanceConsumerView {
                    group: c.group,
                    broker: c.broker,
                    owned: c.owned,
                    workers: c.workers,
                    in_flight: c.in_flight,
                    connected: c.connected,
                })
                .collect(),
        }
    }
}

impl From<DelayBucket> for DelayBucketView {
    fn from(b: DelayBucket) -> Self {
        DelayBucketView {
            le_ms: (b.le_ms != i64::MAX).then_some(b.le_ms),
            count: b.count,
            max_delay_ms: b.max_delay_ms,
        }
    }
}

impl From<RecordRow> for RecordSummary {
    fn from(r: RecordRow) -> Self {
        RecordSummary {
            id: r.id,
            consumer_group: r.consumer_group,
            message_id: r.message_id,
            message_type: r.message_type,
            status: r.status.to_string(),
            handler_mode: r.handler_mode,
            attempts: r.attempts,
            max_attempts: r.max_attempts,
            first_seen_at: time(r.first_seen_at),
            updated_at: time(r.updated_at),
            next_attempt_at: opt_time(r.next_attempt_at),
            error_class: r.error_class,
            duplicate_count: r.duplicate_count,
        }
    }
}

impl From<RecordPage> for RecordPageView {
    fn from(p: RecordPage) -> Self {
        RecordPageView {
            rows: p.rows.into_iter().map(Into::into).collect(),
            next: p.next.map(|c| c.encode()),
            prev: p.prev.map(|c| c.encode()),
            searched_to: p.searched_to,
        }
    }
}

/// Renders a payload for display: pretty JSON when it parses, else UTF-8 text when it decodes
/// and has no control characters but whitespace, else a hex dump (16 bytes a line).
pub fn payload_view(bytes: &[u8]) -> PayloadView {
    let (format, text) = if let Ok(json) = serde_json::from_slice::<serde_json::Value>(bytes) {
        ("json", serde_json::to_string_pretty(&json).unwrap_or_default())
    } else if let Ok(text) = std::str::from_utf8(bytes)
        && !text.chars().any(|c| c.is_control() && !c.is_whitespace())
    {
        ("text", text.to_owned())
    } else {
        let lines: Vec<String> = bytes
            .chunks(16)
            .enumerate()
            .map(|(i, chunk)| {
                let hex: Vec<String> = chunk.iter().map(|b| format!("{b:02x}")).collect();
                format!("{:08x}  {}", i * 16, hex.join(" "))
            })
            .collect();
        ("hex", lines.join("\n"))
    };
    PayloadView { format: format.to_owned(), bytes: bytes.len(), text }
}

impl From<MarkerState> for MarkerView {
    fn from(m: MarkerState) -> Self {
        match m {
            MarkerState::Present { ttl_secs } => MarkerView { state: "present".into(), ttl_secs, error: None },
            MarkerState::Absent => MarkerView { state: "absent".into(), ttl_secs: None, error: None },
            MarkerState::Unknown(why) => MarkerView { state: "unknown".into(), ttl_secs: None, error: Some(why) },
        }
    }
}

/// A record's detail with its marker (looked up separately, in Redis).
pub fn record_detail_view(
    d: RecordDetail,
    late_duplicate: Option<LateDuplicateNote>,
    marker_key: String,
    marker: MarkerState,
) -> RecordDetailView {
    let (takeovers, possible_double_effect, calls) = (d.takeovers(), d.possible_double_effect(), d.calls());
    let id_from = d.id_source().map(|kind| kind.as_str().to_owned());
    RecordDetailView {
        record: d.row.into(),
        reentries: d.reentries,
        lease_owner: d.lease_owner,
        lease_token: d.lease_token.map(|t| t.to_string()),
        lease_expires_at: opt_time(d.lease_expires_at),
        lease_expired: d.lease_expired,
        version: d.version,
        completed_at: opt_time(d.completed_at),
        last_error: d.last_error,
        payload_hash: d.payload_hash,
        payload: d.payload.as_deref().map(payload_view),
        payload_truncated: d.payload_truncated,
        headers: d.headers.map(|h| serde_json::to_string_pretty(&h).unwrap_or_default()),
        content_type: d.content_type,
        source: SourceView {
            broker: d.source_broker,
            exchange: d.source_exchange,
            routing_key: d.source_routing_key,
            queue: d.source_queue,
            id_from,
        },
        last_duplicate_at: opt_time(d.last_duplicate_at),
        last_duplicate_delay_ms: d.last_duplicate_delay_ms,
        payload_conflicts: d.payload_conflicts,
        parked_at: opt_time(d.parked_at),
        attempts: d
            .attempt_history
            .into_iter()
            .map(|a| AttemptView {
                answer_class: a.answer_class().map(str::to_owned),
                attempt: a.attempt,
                worker: a.worker,
                started_at: time(a.started_at),
                ended_at: opt_time(a.ended_at),
                outcome: a.outcome,
                error: a.error,
                taken_over_by: a.taken_over_by,
                late_effect: a.late_effect,
                answer_status: a.answer_status,
                latency_ms: a.latency_ms,
                answer: a.answer,
            })
            .collect(),
        takeovers,
        calls,
        possible_double_effect,
        late_duplicate,
        conflicts: Vec::new(),
        marker_key,
        marker: marker.into(),
    }
}

impl From<StuckList> for StuckView {
    fn from(s: StuckList) -> Self {
        StuckView {
            total: s.total,
            rows: s
                .rows
                .into_iter()
                .map(|r| StuckRecordView {
                    id: r.id,
                    consumer_group: r.consumer_group,
                    message_id: r.message_id,
                    message_type: r.message_type,
                    handler_mode: r.handler_mode,
                    lease_owner: r.lease_owner,
                    lease_token: r.lease_token.to_string(),
                    lease_expires_at: time(r.lease_expires_at),
                    stuck_secs: r.stuck_secs,
                    attempts: r.attempts,
                    max_attempts: r.max_attempts,
                    reentries: r.reentries,
                    crash_loop: r.crash_loop,
                    parked_at: opt_time(r.parked_at),
                })
                .collect(),
        }
    }
}

impl From<RetryOverview> for RetriesView {
    fn from(r: RetryOverview) -> Self {
        RetriesView {
            distribution: r
                .distribution
                .into_iter()
                .map(|b| AttemptsBucketView { attempts: b.attempts, records: b.records })
                .collect(),
            top_types: r
                .top_types
                .into_iter()
                .map(|t| TypeRetriesView {
                    message_type: t.message_type,
                    records: t.records,
                    attempts: t.attempts,
                    max_attempts: t.max_attempts,
                })
                .collect(),
            next_retry_at: opt_time(r.next_retry_at),
            most_retried: r.most_retried.into_iter().map(Into::into).collect(),
        }
    }
}

impl From<DeadLetterGroup> for DeadLetterGroupView {
    fn from(g: DeadLetterGroup) -> Self {
        DeadLetterGroupView {
            answer_class: g.answer_class().map(|c| c.as_str().to_owned()),
            error_class: g.error_class,
            records: g.records,
            first_seen_at: time(g.first_seen_at),
            last_seen_at: time(g.last_seen_at),
            message_types: g.message_types,
        }
    }
}

/// An HTTP endpoint of the engine with its calls and its handler's pause state (`None`: no
/// state recorded yet, running).
pub fn endpoint_view(
    endpoint: &HttpEndpoint,
    group: &str,
    consuming: bool,
    c: EndpointCalls,
    pause: Option<&HandlerPause>,
) -> EndpointView {
    let paused = pause.filter(|p| p.state != "running");
    let answers = [
        ("succeeded", c.succeeded),
        ("in_progress", c.in_progress),
        ("conflict", c.conflict),
        ("refused", c.refused),
        ("unavailable", c.unavailable),
        ("transport", c.transport),
        ("other", c.other),
    ];
    EndpointView {
        group: group.to_owned(),
        message_type: endpoint.message_type.clone(),
        method: endpoint.method.clone(),
        url: endpoint.url.clone(),
        consuming,
        pause_state: pause.map_or_else(|| "running".to_owned(), |p| p.state.clone()),
        pause_reason: paused.and_then(|p| p.reason.clone()),
        paused_since: paused.map(|p| time(p.since)),
        window_secs: endpoints::WINDOW_SECS,
        sample_calls: endpoints::SAMPLE_CALLS,
        calls: c.calls,
        sampled: c.sampled(),
        oldest_at: opt_time(c.oldest_at),
        answers: answers.map(|(class, calls)| AnswerCountView { class: class.to_owned(), calls }).into(),
        success_rate: c.success_rate(),
        p50_ms: c.p50_ms,
        p95_ms: c.p95_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_render_as_json_text_or_hex() {
        let json = payload_view(br#"{"a":"<script>alert(1)</script>"}"#);
        assert_eq!(json.format, "json");
        assert!(json.text.contains("<script>alert(1)</script>"), "kept as text; the page escapes it");
        assert_eq!(payload_view(b"plain <b>text</b>\n").format, "text");
        let hex = payload_view(&[0, 1, 2, 255]);
        assert_eq!((hex.format.as_str(), hex.text.as_str()), ("hex", "00000000  00 01 02 ff"));
    }
}
