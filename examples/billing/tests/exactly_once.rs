//! The billing example end to end: its mail stand-in and its service as processes of their own,
//! 300 invoices published Spring-style with 20 % second copies, the service SIGKILLed while it
//! works and started again; stuck receipts resolved the way an operator does (the mail log says
//! whether the call went out: mark succeeded, else release and requeue). Every invoice must end
//! paid once, booked once and receipted once.

use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dedup_engine::console::actions::RecordActionKind::{MarkSucceeded, Release};
use dedup_engine::console::actions::{Publishers, RecordAction, record_action};
use dedup_engine::testing::{TestBroker, TestDatabase, amqp_url, redis_url};
use dedup_engine::{Backoff, SourceFactory};
use dedup_example_billing::producer::{PublishParams, publish_invoices};
use sqlx::PgPool;
use tokio::process::{Child, Command};

const INVOICES: i64 = 300;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

struct World {
    db: TestDatabase,
    broker: TestBroker,
    mail_port: u16,
    redis_prefix: String,
}

impl World {
    fn billing(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_billing"));
        cmd.args(args)
            .env("DATABASE_URL", &self.db.url)
            .env("AMQP_URL", amqp_url())
            .env("REDIS_URL", redis_url())
            .env("BILLING_EXCHANGE", &self.broker.settings.exchange)
            .env("BILLING_QUEUE", &self.broker.settings.queue)
            .env("BILLING_REDIS_PREFIX", &self.redis_prefix)
            .env("MAIL_URL", format!("http://127.0.0.1:{}", self.mail_port))
            .env("MAIL_LISTEN", format!("127.0.0.1:{}", self.mail_port))
            .env("BILLING_LEASE_MS", "2000")
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .kill_on_drop(true);
        cmd
    }

    /// Starts the service and waits until it consumes from its queue.
    async fn serve(&self) -> Child {
        let before = self.broker.queue_state(&self.broker.settings.queue).await.map_or(0, |s| s.1);
        let child = self
            .billing(&["serve"])
            .env("BILLING_LISTEN", format!("127.0.0.1:{}", free_port()))
            .spawn()
            .expect("billing serve starts");
        let started = Instant::now();
        while self.broker.queue_state(&self.broker.settings.queue).await.is_none_or(|s| s.1 <= before) {
            assert!(started.elapsed() < Duration::from_secs(60), "the service did not subscribe");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        child
    }

    fn pool(&self) -> &PgPool {
        &self.db.pool
    }

    async fn scalar(&self, sql: &str) -> i64 {
        sqlx::query_scalar(sql).fetch_one(self.pool()).await.unwrap()
    }

    /// Polls `sql` until it returns `want` or `within` passes; returns the last value.
    async fn wait_for(&self, within: Duration, sql: &str, want: impl Fn(i64) -> bool) -> i64 {
        let started = Instant::now();
        loop {
            let value = self.scalar(sql).await;
            if want(value) || started.elapsed() >= within {
                return value;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_invoice_is_paid_booked_and_receipted_once_despite_duplicates_and_a_sigkill() {
    let db = TestDatabase::create().await;
    dedup_example_billing::migrate(&db.pool).await.unwrap();
    let world = World {
        db,
        broker: TestBroker::new(&amqp_url(), Backoff::default()),
        mail_port: free_port(),
        redis_prefix: format!("t{}", uuid::Uuid::new_v4().simple()),
    };
    let _mail = world.billing(&["mail-stand-in"]).spawn().expect("mail stand-in starts");
    let mut service = world.serve().await;

    let connector = world.broker.connector();
    let publisher = connector.publisher().await.unwrap();
    let params = PublishParams {
        invoices: INVOICES as u64,
        duplicate_rate: 0.2,
        exchange: world.broker.settings.exchange.clone(),
        seed: 11,
    };
    let producing = {
        let pool = world.pool().clone();
        tokio::spawn(async move { publish_invoices(&pool, &publisher, &params).await.unwrap() })
    };

    // Kill the service once it has booked a third of the invoices, mid-run.
    let booked = world
        .wait_for(Duration::from_secs(60), "SELECT count(*) FROM billing.ledger_entries", |n| n >= INVOICES / 3)
        .await;
    assert!(booked >= INVOICES / 3, "the service books invoices (booked {booked})");
    service.kill().await.unwrap();
    let report = producing.await.unwrap();
    assert!(report.duplicates >= (INVOICES / 5) as u64, "about 20 % second copies were published: {report:?}");
    let at_kill = world.scalar("SELECT count(*) FROM billing.ledger_entries").await;
    assert!(at_kill < INVOICES, "killed mid-run, before the end ({at_kill} of {INVOICES} booked)");
    let _service = world.serve().await;

    let paid = world
        .wait_for(Duration::from_secs(120), "SELECT count(*) FROM billing.invoices WHERE status = 'PAID'", |n| {
            n == INVOICES
        })
        .await;
    assert_eq!(paid, INVOICES, "every invoice is paid");

    // Receipts: succeeded, or stuck (in flight at the kill, `on_lease_expiry = hold`): the
    // operator checks the mail log for each stuck one.
    let settled = "SELECT count(*) FROM dedup.dedup_records WHERE message_type = 'INVOICE.RECEIPT'
                   AND (status = 'succeeded' OR (status = 'processing' AND lease_expires_at < now()))";
    let n = world.wait_for(Duration::from_secs(120), settled, |n| n == INVOICES).await;
    assert_eq!(n, INVOICES, "every receipt has a record that succeeded or is stuck");
    let stuck: Vec<(i64, String, uuid::Uuid)> = sqlx::query_as(
        "SELECT id, message_id, lease_token FROM dedup.dedup_records
         WHERE message_type = 'INVOICE.RECEIPT' AND status = 'processing'",
    )
    .fetch_all(world.pool())
    .await
    .unwrap();
    eprintln!("killed at {at_kill} of {INVOICES} booked; {} receipts stuck after the kill", stuck.len());
    let engine_pool = dedup_engine::console::engine_pool(world.pool(), &world.db.schema, 2);
    let mut publishers = Publishers::default();
    publishers.add(dedup_example_billing::GROUP, connector.clone() as Arc<dyn SourceFactory>);
    for (id, message_id, token) in &stuck {
        let sent: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM billing.mail_calls WHERE idempotency_key = $1)")
                .bind(message_id)
                .fetch_one(world.pool())
                .await
                .unwrap();
        let action = RecordAction {
            record_id: *id,
            lease_token: Some(*token),
            reason: Some(if sent { "the mail log has the call" } else { "the mail log has no call" }),
            ..RecordAction::default()
        };
        if sent {
            record_action(&engine_pool, "test:operator", MarkSucceeded, &action, &Publishers::default()).await.unwrap();
        } else {
            record_action(
                &engine_pool,
                "test:operator",
                Release,
                &RecordAction { requeue: true, ..action },
                &publishers,
            )
            .await
            .unwrap();
        }
    }
    let receipted = world
        .wait_for(
            Duration::from_secs(60),
            "SELECT count(*) FROM dedup.dedup_records WHERE message_type = 'INVOICE.RECEIPT' AND status = 'succeeded'",
            |n| n == INVOICES,
        )
        .await;
    assert_eq!(receipted, INVOICES, "every receipt succeeded ({} were stuck after the kill)", stuck.len());

    let totals: (i64, i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM billing.ledger_entries),
                (SELECT count(DISTINCT invoice_no) FROM billing.ledger_entries),
                (SELECT count(*) FROM billing.mail_calls),
                (SELECT count(DISTINCT invoice_no) FROM billing.mail_calls)",
    )
    .fetch_one(world.pool())
    .await
    .unwrap();
    assert_eq!(totals, (INVOICES, INVOICES, INVOICES, INVOICES), "one ledger entry and one receipt call per invoice");
    let not_succeeded = world.scalar("SELECT count(*) FROM dedup.dedup_records WHERE status <> 'succeeded'").await;
    assert_eq!(not_succeeded, 0, "no record failed, died or stayed stuck");
    let duplicates = world.scalar("SELECT COALESCE(sum(duplicate_count), 0)::bigint FROM dedup.dedup_records").await;
    assert!(duplicates > 0, "second copies reached the consumer and were caught");
    connector.close().await;
}
