//! What the console shows of HTTP handlers, against a real PostgreSQL: the overview's endpoint
//! cards (calls by answer class, success rate, latency percentiles, the window and the sample
//! bound), the dead letters' answer classes, and each attempt's answer on the record page.

use dedup_engine::console::endpoints::{DeadLetterClass, EndpointReads, SAMPLE_CALLS};
use dedup_engine::console::failures::FailureReads;
use dedup_engine::console::records::{ANSWER_CHARS, record_detail};
use dedup_engine::testing::TestDatabase;
use sqlx::PgPool;

/// A leased record of `group`, type `message_type`, in `status` with `error_class`.
async fn record(pool: &PgPool, group: &str, id: &str, status: &str, error_class: Option<&str>) -> i64 {
    let message_type = id.rsplit_once('.').map_or("UNKNOWN", |(t, _)| t);
    sqlx::query_scalar(
        "INSERT INTO dedup_records (consumer_group, message_id, message_type, status, handler_mode, attempts,
             max_attempts, error_class, last_error, payload_hash, source_broker, duplicate_count)
         VALUES ($1, $2, $3, $4, 'leased', 1, 5, $5, $5, '\\x00', 'rabbitmq', 3)
         RETURNING id",
    )
    .bind(group)
    .bind(id)
    .bind(message_type)
    .bind(status)
    .bind(error_class)
    .fetch_one(pool)
    .await
    .expect("insert record")
}

/// A call of the record's endpoint: attempt `n`, started `age_secs` ago, its answer.
struct Call<'a> {
    status: Option<i16>,
    latency_ms: Option<i32>,
    outcome: &'a str,
    error: Option<&'a str>,
    answer: Option<String>,
    age_secs: i64,
}

impl Default for Call<'_> {
    fn default() -> Self {
        Call { status: Some(200), latency_ms: Some(10), outcome: "succeeded", error: None, answer: None, age_secs: 5 }
    }
}

async fn call(pool: &PgPool, record: i64, n: i32, c: Call<'_>) {
    sqlx::query(
        "INSERT INTO record_attempts (record_id, attempt, worker, started_at, ended_at, outcome, error,
             answer_status, latency_ms, answer, consumer_group, message_type)
         SELECT id, $2, 'host:1:0', now() - $3 * interval '1 second', now(), $4, $5, $6, $7, $8, consumer_group,
                message_type
         FROM dedup_records WHERE id = $1",
    )
    .bind(record)
    .bind(n)
    .bind(c.age_secs)
    .bind(c.outcome)
    .bind(c.error)
    .bind(c.status)
    .bind(c.latency_ms)
    .bind(c.answer)
    .execute(pool)
    .await
    .expect("insert attempt");
}

#[tokio::test]
async fn endpoint_cards_count_calls_by_answer_class_with_latency() {
    let db = TestDatabase::create().await;
    let p = &db.pool;
    let paid = record(p, "billing", "ORDER.PAID.1", "succeeded", None).await;
    // Ten 2xx successes, 10 ms to 100 ms.
    for n in 1..=10 {
        call(p, paid, n, Call { latency_ms: Some(n * 10), ..Call::default() }).await;
    }
    let answers = [
        (Some(409), "deferred"),
        (Some(422), "dead"),
        (Some(404), "dead"),
        (Some(410), "dead"),
        (Some(200), "dead"),   // a 2xx answering `dead`: refused
        (Some(429), "failed"), // unavailable
        (Some(503), "failed"),
        (None, "failed"),          // a timeout: transport
        (Some(302), "failed"),     // other
        (Some(200), "failed"),     // a 2xx asking for a retry: other
        (Some(200), "lease_lost"), // a late success after the lease was lost: succeeded
    ];
    for (i, (status, outcome)) in answers.into_iter().enumerate() {
        call(p, paid, 11 + i as i32, Call { status, outcome, latency_ms: Some(1000), ..Call::default() }).await;
    }
    // Not counted: older than the window, another endpoint, an attempt that made no call.
    call(p, paid, 30, Call { age_secs: 16 * 60, ..Call::default() }).await;
    let other = record(p, "billing", "ORDER.SHIPPED.1", "succeeded", None).await;
    call(p, other, 1, Call::default()).await;
    call(p, paid, 31, Call { status: None, latency_ms: None, outcome: "lease_lost", ..Call::default() }).await;

    let cards = p
        .endpoint_calls(&[("billing", "ORDER.PAID"), ("billing", "ORDER.REFUNDED"), ("billing", "ORDER.SHIPPED")])
        .await
        .unwrap();
    let types: Vec<&str> = cards.iter().map(|c| c.message_type.as_str()).collect();
    assert_eq!(types, ["ORDER.PAID", "ORDER.REFUNDED", "ORDER.SHIPPED"], "one row per endpoint, in the order given");
    let c = &cards[0];
    assert_eq!(c.calls, 21);
    let classes = [c.succeeded, c.in_progress, c.conflict, c.refused, c.unavailable, c.transport, c.other];
    assert_eq!(classes, [11, 1, 1, 3, 2, 1, 2]);
    assert_eq!(classes.iter().sum::<i64>(), c.calls, "the classes add up to the calls");
    assert_eq!(c.success_rate(), Some(11.0 / 21.0));
    // 21 latencies: 10, 20, …, 100 and eleven of 1000 ms.
    assert_eq!((c.p50_ms, c.p95_ms), (Some(1000), Some(1000)));
    assert!(!c.sampled());

    let none = &cards[1];
    assert_eq!((none.calls, none.succeeded, none.p50_ms, none.success_rate()), (0, 0, None, None));
    assert_eq!(cards[2].calls, 1);

    // The median of the ten successes alone.
    let quick = record(p, "quick", "ORDER.PAID.2", "succeeded", None).await;
    for n in 1..=10 {
        call(p, quick, n, Call { latency_ms: Some(n * 10), ..Call::default() }).await;
    }
    let q = &p.endpoint_calls(&[("quick", "ORDER.PAID")]).await.unwrap()[0];
    assert_eq!((q.p50_ms, q.p95_ms, q.success_rate()), (Some(50), Some(100), Some(1.0)));
}

#[tokio::test]
async fn endpoint_cards_read_the_newest_calls_only() {
    let db = TestDatabase::create().await;
    let p = &db.pool;
    let id = record(p, "billing", "ORDER.PAID.1", "succeeded", None).await;
    // 5 100 calls, one a tenth of a second apart; the oldest 100 are slow failures.
    sqlx::query(
        "INSERT INTO record_attempts (record_id, attempt, worker, started_at, ended_at, outcome, answer_status,
             latency_ms, consumer_group, message_type)
         SELECT $1, n, 'host:1:0', now() - n * interval '100 milliseconds', now(),
                CASE WHEN n > 5000 THEN 'failed' ELSE 'succeeded' END,
                CASE WHEN n > 5000 THEN 503 ELSE 200 END, CASE WHEN n > 5000 THEN 9000 ELSE 5 END,
                'billing', 'ORDER.PAID'
         FROM generate_series(1, 5100) AS n",
    )
    .bind(id)
    .execute(p)
    .await
    .unwrap();
    let c = &p.endpoint_calls(&[("billing", "ORDER.PAID")]).await.unwrap()[0];
    assert_eq!(c.calls, SAMPLE_CALLS);
    assert!(c.sampled());
    assert_eq!((c.succeeded, c.unavailable, c.p95_ms), (SAMPLE_CALLS, 0, Some(5)), "the oldest 100 are not read");
    let newest_read: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT started_at FROM record_attempts WHERE attempt = 5000").fetch_one(p).await.unwrap();
    assert_eq!(c.oldest_at, Some(newest_read));
}

#[tokio::test]
async fn http_dead_letters_come_first_with_their_answer_class() {
    let db = TestDatabase::create().await;
    let p = &db.pool;
    // Large groups of a Rust handler's classes, small ones of an HTTP handler's.
    for (class, n) in [("MEMBER_NOT_FOUND", 5), ("LOYALTY_API: status # from #", 4), ("NO_HANDLER", 3)] {
        for i in 0..n {
            record(p, "g", &format!("ORDER.PAY.{class}{i}"), "dead", Some(class)).await;
        }
    }
    for class in ["HTTP_CONFLICT", "HTTP_REFUSED", "HTTP_GONE", "HTTP_UNAVAILABLE", "HTTP_TIMEOUT", "HTTP_CONNECT"] {
        record(p, "g", &format!("ORDER.PAID.{class}"), "dead", Some(class)).await;
    }
    record(p, "g", "ORDER.PAID.failed", "failed", Some("HTTP_CONFLICT")).await;

    // A limit below the number of groups keeps every HTTP class.
    let groups = p.dead_letter_groups(7).await.unwrap();
    let shown: Vec<(Option<&str>, Option<DeadLetterClass>, i64)> =
        groups.iter().map(|g| (g.error_class.as_deref(), g.answer_class(), g.records)).collect();
    use DeadLetterClass::*;
    assert_eq!(
        shown,
        [
            (Some("HTTP_CONFLICT"), Some(Conflict), 1),
            (Some("HTTP_CONNECT"), Some(Transport), 1),
            (Some("HTTP_GONE"), Some(Refused), 1),
            (Some("HTTP_REFUSED"), Some(Refused), 1),
            (Some("HTTP_TIMEOUT"), Some(Transport), 1),
            (Some("HTTP_UNAVAILABLE"), Some(Exhausted), 1),
            (Some("MEMBER_NOT_FOUND"), None, 5),
        ]
    );
}

#[tokio::test]
async fn record_detail_shows_each_calls_answer_and_counts_calls() {
    let db = TestDatabase::create().await;
    let p = &db.pool;
    let id = record(p, "billing", "ORDER.PAID.1", "dead", Some("HTTP_CONFLICT")).await;
    let long = "<b>x</b>".repeat(1000);
    call(
        p,
        id,
        1,
        Call {
            status: None,
            latency_ms: Some(2000),
            outcome: "failed",
            error: Some("HTTP_TIMEOUT: no answer within 2000 ms"),
            answer: Some("no answer within 2000 ms".into()),
            ..Call::default()
        },
    )
    .await;
    call(
        p,
        id,
        2,
        Call {
            status: Some(409),
            outcome: "deferred",
            error: Some("HTTP_IN_PROGRESS: HTTP 409 Conflict: the service is still working on this key"),
            ..Call::default()
        },
    )
    .await;
    // A lease lost before the effect: no call.
    call(
        p,
        id,
        2,
        Call {
            status: None,
            latency_ms: None,
            outcome: "lease_lost",
            error: Some("the lease expired; taken over by host:2:0"),
            ..Call::default()
        },
    )
    .await;
    call(
        p,
        id,
        2,
        Call {
            status: Some(422),
            outcome: "dead",
            error: Some("HTTP_CONFLICT: HTTP 422 Unprocessable Entity: the service refused the key"),
            answer: Some(long),
            ..Call::default()
        },
    )
    .await;
    let detail = record_detail(p, id).await.unwrap().unwrap();
    let rows: Vec<(Option<i16>, Option<&str>, Option<&str>)> =
        detail.attempt_history.iter().map(|a| (a.answer_status, a.answer_class(), a.outcome.as_deref())).collect();
    assert_eq!(
        rows,
        [
            (None, Some("HTTP_TIMEOUT"), Some("failed")),
            (Some(409), Some("HTTP_IN_PROGRESS"), Some("deferred")),
            (None, None, Some("lease_lost")),
            (Some(422), Some("HTTP_CONFLICT"), Some("dead")),
        ]
    );
    assert_eq!(detail.calls(), 3, "the lease lost before the effect made no call");
    assert_eq!(detail.row.duplicate_count, 3);
    let excerpt = detail.attempt_history[3].answer.as_deref().unwrap();
    assert_eq!(excerpt.chars().count(), ANSWER_CHARS as usize, "the excerpt is bounded");
}
