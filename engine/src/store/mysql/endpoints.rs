//! MySQL's endpoint-card reads ([`EndpointReads`]): each endpoint's newest calls of the window
//! read backwards on `record_attempts_endpoint_calls_idx` (group, type, started_at; migration
//! `20261205000008`), at most [`SAMPLE_CALLS`] rows, and summed here ([`tally`]): MySQL has
//! neither `FILTER` nor `percentile_disc`, and MariaDB no `LATERAL`. The endpoints are read
//! one statement each, at once.

use async_trait::async_trait;
use chrono::NaiveDateTime;
use sqlx::mysql::MySqlPool;

use crate::console::QueryError;
use crate::console::endpoints::{Call, EndpointCalls, EndpointReads, SAMPLE_CALLS, WINDOW_SECS, tally};

#[async_trait]
impl EndpointReads for MySqlPool {
    async fn endpoint_calls(&self, endpoints: &[(&str, &str)]) -> Result<Vec<EndpointCalls>, QueryError> {
        let reads = endpoints.iter().map(|&(group, message_type)| async move {
            let rows: Vec<(Option<i16>, i32, Option<String>, NaiveDateTime)> = sqlx::query_as(
                "SELECT answer_status, latency_ms, CAST(outcome AS CHAR), started_at FROM record_attempts
                 WHERE consumer_group = ? AND message_type = ? AND latency_ms IS NOT NULL
                   AND started_at > UTC_TIMESTAMP(6) - INTERVAL ? SECOND
                 ORDER BY started_at DESC LIMIT ?",
            )
            .bind(group.as_bytes())
            .bind(message_type.as_bytes())
            .bind(WINDOW_SECS)
            .bind(SAMPLE_CALLS)
            .fetch_all(self)
            .await?;
            let calls: Vec<Call> = rows
                .into_iter()
                .map(|(status, latency_ms, outcome, started_at)| Call {
                    status,
                    latency_ms,
                    outcome,
                    started_at: started_at.and_utc(),
                })
                .collect();
            Ok::<_, QueryError>(tally(group, message_type, &calls))
        });
        futures::future::try_join_all(reads).await
    }
}
