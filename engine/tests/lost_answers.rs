//! Settling leased calls when a statement commits but its answer is lost (the connection dies
//! after the server ran it): the retry that follows finds the lease token gone, and must neither
//! acknowledge a delivery its record still waits for nor flag a single effect as a double one
//! (DESIGN.md, "Recovery"). A TCP proxy in front of PostgreSQL forwards the first statement whose
//! text holds a marker, lets the server commit it, drops its answer and closes the connection.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use common::service::{Reply, Service};
use common::{Harness, message, settings};
use dedup_engine::console::records::record_detail;
use dedup_engine::handler::{Handler, HandlerError, HandlerInput, HandlerRegistry, LeaseGuard, LeasedHandler};
use dedup_engine::http::{HttpHandler, HttpSettings};
use dedup_engine::message::InboundMessage;
use dedup_engine::pipeline::{AckReason, Disposition, Pipeline, PipelineSettings};
use dedup_engine::record::LeaseExpiryPolicy;
use dedup_engine::retry::Backoff;
use dedup_engine::store::postgres::PgStore;
use serde_json::json;
use sqlx::postgres::PgPoolOptions;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Whether `chunk` (whole frontend messages) holds an Execute (`E`) message.
fn has_execute(chunk: &[u8]) -> bool {
    let mut at = 0;
    while at + 5 <= chunk.len() {
        if chunk[at] == b'E' {
            return true;
        }
        let len = u32::from_be_bytes([chunk[at + 1], chunk[at + 2], chunk[at + 3], chunk[at + 4]]) as usize;
        if len < 4 {
            return false;
        }
        at += 1 + len;
    }
    false
}

/// A proxy to PostgreSQL that loses the answer of the first statement whose text holds
/// `marker` (once, over all its connections); its port.
async fn losing_proxy(marker: &'static [u8], lost: Arc<AtomicBool>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let server = TcpStream::connect("127.0.0.1:5432").await.unwrap();
            let lost = lost.clone();
            tokio::spawn(async move {
                let ((mut client_read, mut client_write), (mut server_read, mut server_write)) =
                    (client.into_split(), server.into_split());
                let cut = Arc::new(AtomicBool::new(false));
                let upstream = tokio::spawn({
                    let cut = cut.clone();
                    async move {
                        let (mut buf, mut armed) = (vec![0u8; 65536], false);
                        while let Ok(n @ 1..) = client_read.read(&mut buf).await {
                            let chunk = &buf[..n];
                            armed |= !lost.load(Ordering::SeqCst) && chunk.windows(marker.len()).any(|w| w == marker);
                            if armed && has_execute(chunk) && !lost.swap(true, Ordering::SeqCst) {
                                cut.store(true, Ordering::SeqCst);
                                let _ = server_write.write_all(chunk).await;
                                // The server runs and commits it; its answer is dropped below.
                                tokio::time::sleep(Duration::from_millis(400)).await;
                                return;
                            }
                            if server_write.write_all(chunk).await.is_err() {
                                return;
                            }
                        }
                    }
                });
                let mut buf = vec![0u8; 65536];
                while let Ok(n @ 1..) = server_read.read(&mut buf).await {
                    if cut.load(Ordering::SeqCst) {
                        let _ = upstream.await;
                        return;
                    }
                    if client_write.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
                upstream.abort();
            });
        }
    });
    port
}

/// A pipeline whose store reaches PostgreSQL through [`losing_proxy`]; and whether the answer
/// was lost.
async fn pipeline_losing(
    h: &Harness,
    marker: &'static [u8],
    handlers: HandlerRegistry,
    settings: PipelineSettings,
) -> (Pipeline, Arc<AtomicBool>) {
    let lost = Arc::new(AtomicBool::new(false));
    let port = losing_proxy(marker, lost.clone()).await;
    let options = h.pool().connect_options().as_ref().clone().host("127.0.0.1").port(port);
    let pool = PgPoolOptions::new().max_connections(8).connect_with(options).await.unwrap();
    let store = PgStore::new(pool, &h.db.schema);
    (Pipeline::new(store, h.fast_path.clone(), h.stats.clone(), handlers, settings), lost)
}

/// An effect that succeeds.
struct Effect;

/// A service that answers 503 (retryable) every time.
struct Unavailable;

#[async_trait]
impl LeasedHandler for Unavailable {
    async fn handle(&self, _: &HandlerInput<'_>, _: &LeaseGuard) -> Result<(), HandlerError> {
        Err(HandlerError::retryable("DOWNSTREAM_DOWN", "503 (test)"))
    }
}

#[async_trait]
impl LeasedHandler for Effect {
    async fn handle(&self, _: &HandlerInput<'_>, _: &LeaseGuard) -> Result<(), HandlerError> {
        Ok(())
    }
}

#[tokio::test]
async fn a_completion_whose_answer_is_lost_is_not_flagged_as_a_double_effect() {
    let h = Harness::new().await;
    let mut handlers = HandlerRegistry::new();
    let handler = Handler::Leased { handler: Arc::new(Effect), on_lease_expiry: LeaseExpiryPolicy::Hold };
    handlers.register("ORDER.NOTIFY", handler);
    let marker = b"status = 'succeeded', version";
    let (pipeline, lost) = pipeline_losing(&h, marker, handlers, settings(5, Duration::from_secs(30))).await;
    let id = "ORDER.NOTIFY.DONE:1";
    let dispositions = pipeline.process("host-a:1:0", &[message(id, json!({"orderNo": 1}))]).await;
    assert!(lost.load(Ordering::SeqCst), "the completion's answer was lost");
    assert_eq!(dispositions, vec![Disposition::Ack(AckReason::LeaseLost)], "completed by the lost try");
    let record: i64 = sqlx::query_scalar("SELECT id FROM dedup_records WHERE message_id = $1 AND status = 'succeeded'")
        .bind(id)
        .fetch_one(h.pool())
        .await
        .unwrap();
    let detail = record_detail(h.pool(), record).await.unwrap().unwrap();
    assert!(!detail.possible_double_effect(), "one effect, not flagged as a possible double effect");
}

#[tokio::test]
async fn held_calls_whose_release_answer_is_lost_are_redelivered_not_acknowledged() {
    let h = Harness::new().await;
    // The service fails; its breaker pauses the handler after 3 failures, so the calls not yet
    // started are held and their claims released.
    let service = Service::start([Reply::status(503).delay(Duration::from_millis(20))]).await;
    let mut http = HttpSettings::new(service.url());
    (http.timeout_ms, http.pause_after, http.probe_interval_ms, http.concurrency) = (2_000, 3, 300, 2);
    let mut handlers = HandlerRegistry::new();
    handlers.http("ORDER.PAID", HttpHandler::new(&http).unwrap());
    let settings =
        PipelineSettings { backoff: Backoff { initial_ms: 100, max_ms: 400 }, ..settings(2, Duration::from_secs(30)) };
    let (pipeline, lost) = pipeline_losing(&h, b"unopened AS", handlers, settings).await;
    let batch: Vec<InboundMessage> =
        (0..40).map(|i| message(&format!("ORDER.PAID.B{i}:1"), json!({"orderNo": i}))).collect();
    let dispositions = pipeline.process("host-a:1:0", &batch).await;
    assert!(lost.load(Ordering::SeqCst), "a release's answer was lost");
    let acked: Vec<&Disposition> = dispositions.iter().filter(|d| matches!(d, Disposition::Ack(_))).collect();
    assert_eq!(acked, Vec::<&Disposition>::new(), "a released record waits for its delivery: none acknowledged");
    assert!(dispositions.contains(&Disposition::Redeliver), "those the lost release gave back are redelivered");
}

#[tokio::test]
async fn failures_whose_answer_is_lost_are_retried_or_dead_lettered_as_recorded() {
    for (max_attempts, expected, status) in [
        (2, Disposition::Retry { delay: Duration::from_secs(1) }, "failed"),
        (1, Disposition::DeadLetter { reason: "DOWNSTREAM_DOWN: 503 (test)".to_owned() }, "dead"),
    ] {
        let h = Harness::new().await;
        let mut handlers = HandlerRegistry::new();
        let handler = Handler::Leased { handler: Arc::new(Unavailable), on_lease_expiry: LeaseExpiryPolicy::Hold };
        handlers.register("ORDER.NOTIFY", handler);
        let marker = b"FROM failed WHERE a.record_id";
        let (pipeline, lost) =
            pipeline_losing(&h, marker, handlers, settings(max_attempts, Duration::from_secs(30))).await;
        let id = "ORDER.NOTIFY.FAILED:1";
        let dispositions = pipeline.process("host-a:1:0", &[message(id, json!({"orderNo": 1}))]).await;
        assert!(lost.load(Ordering::SeqCst), "the failure's answer was lost");
        // Not redelivered: a dead record's redelivery is acknowledged as a duplicate, and its
        // message would reach no dead-letter queue.
        assert_eq!(dispositions, vec![expected], "as the lost try recorded it ({status})");
        let recorded: String = sqlx::query_scalar("SELECT status FROM dedup_records WHERE message_id = $1")
            .bind(id)
            .fetch_one(h.pool())
            .await
            .unwrap();
        assert_eq!(recorded, status);
    }
}
