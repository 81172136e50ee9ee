//! PostgreSQL's endpoint-card reads ([`EndpointReads`]).

use async_trait::async_trait;
use sqlx::PgPool;

use crate::console::QueryError;
use crate::console::endpoints::{EndpointCalls, EndpointReads, SAMPLE_CALLS, WINDOW_SECS};

/// Per endpoint, its newest calls of the window, classified and summed in the database. One
/// statement for all endpoints; each endpoint is one backward range of the partial index
/// `record_attempts_endpoint_calls_idx` (group, type, started_at DESC) INCLUDE (answer_status,
/// latency_ms, outcome), read index-only and cut at [`SAMPLE_CALLS`], and summed inside its
/// lateral subquery (an aggregate without `GROUP BY`: one row, zeros without calls), which
/// halved the time against one `GROUP BY` over all endpoints' rows (BENCHMARKS.md).
const ENDPOINT_CALLS_SQL: &str = r#"
SELECT e.consumer_group, e.message_type, s.*
FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS e(consumer_group, message_type, n)
CROSS JOIN LATERAL (
    SELECT count(*) AS calls,
           count(*) FILTER (WHERE c.answer_status BETWEEN 200 AND 299
                                  AND c.outcome IS DISTINCT FROM 'failed' AND c.outcome IS DISTINCT FROM 'dead') AS succeeded,
           count(*) FILTER (WHERE c.answer_status = 409) AS in_progress,
           count(*) FILTER (WHERE c.answer_status = 422) AS conflict,
           count(*) FILTER (WHERE (c.answer_status BETWEEN 400 AND 499
                                   AND c.answer_status NOT IN (408, 409, 422, 425, 429))
                                  OR (c.answer_status BETWEEN 200 AND 299 AND c.outcome = 'dead')) AS refused,
           count(*) FILTER (WHERE c.answer_status IN (408, 425, 429) OR c.answer_status BETWEEN 500 AND 599) AS unavailable,
           count(*) FILTER (WHERE c.answer_status IS NULL) AS transport,
           count(*) FILTER (WHERE c.answer_status NOT BETWEEN 200 AND 599
                                  OR c.answer_status BETWEEN 300 AND 399
                                  OR (c.answer_status BETWEEN 200 AND 299 AND c.outcome = 'failed')) AS other,
           percentile_disc(0.5) WITHIN GROUP (ORDER BY c.latency_ms) AS p50_ms,
           percentile_disc(0.95) WITHIN GROUP (ORDER BY c.latency_ms) AS p95_ms,
           min(c.started_at) AS oldest_at
    FROM (
        SELECT a.answer_status, a.latency_ms, a.outcome, a.started_at FROM record_attempts a
        WHERE a.consumer_group = e.consumer_group AND a.message_type = e.message_type
          AND a.latency_ms IS NOT NULL AND a.started_at > now() - $3 * interval '1 second'
        ORDER BY a.started_at DESC
        LIMIT $4
    ) c
) s
ORDER BY e.n
"#;

#[async_trait]
impl EndpointReads for PgPool {
    async fn endpoint_calls(&self, endpoints: &[(&str, &str)]) -> Result<Vec<EndpointCalls>, QueryError> {
        if endpoints.is_empty() {
            return Ok(Vec::new());
        }
        let (groups, types): (Vec<&str>, Vec<&str>) = endpoints.iter().copied().unzip();
        Ok(sqlx::query_as(ENDPOINT_CALLS_SQL)
            .bind(groups)
            .bind(types)
            .bind(WINDOW_SECS)
            .bind(SAMPLE_CALLS)
            .fetch_all(self)
            .await?)
    }
}
