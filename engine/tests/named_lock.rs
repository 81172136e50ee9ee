//! `EnginePool::while_locked` on PostgreSQL and MariaDB: contention, release after an error, a
//! panic and a cancelled caller, connection leaks, the engine pool's statement timeout against
//! the documented wait, and a MySQL pool that selects no database.

use std::time::{Duration, Instant};

use dedup_engine::EnginePool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

fn pg_url() -> String {
    std::env::var("NAMED_LOCK_PG_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

#[cfg(feature = "mysql")]
fn my_url() -> String {
    std::env::var("NAMED_LOCK_MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/mysql".to_owned())
}

async fn pg_pool(statement_timeout_ms: Option<u64>) -> EnginePool {
    let mut options: PgConnectOptions = pg_url().parse().unwrap();
    if let Some(ms) = statement_timeout_ms {
        options = options.options([("statement_timeout", ms.to_string())]);
    }
    EnginePool::from(PgPoolOptions::new().max_connections(4).connect_with(options).await.unwrap())
}

#[cfg(feature = "mysql")]
async fn my_pool() -> EnginePool {
    EnginePool::from(sqlx::mysql::MySqlPoolOptions::new().max_connections(4).connect(&my_url()).await.unwrap())
}

fn name(what: &str) -> String {
    format!("named_lock_test.{what}.{}", std::process::id())
}

/// Server-side sessions of this database.
async fn sessions(pool: &EnginePool) -> i64 {
    if let Some(p) = pool.postgres() {
        return sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
            .fetch_one(p)
            .await
            .unwrap();
    }
    #[cfg(feature = "mysql")]
    if let Some(p) = pool.mysql() {
        return sqlx::query_scalar("SELECT COUNT(*) FROM information_schema.PROCESSLIST").fetch_one(p).await.unwrap();
    }
    unreachable!("{}", pool.database())
}

/// How long until `name` can be taken again (polling with short waits), at most `within`.
async fn free_after(pool: &EnginePool, name: &str, within: Duration) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < within {
        if let Ok(Some(())) = pool.while_locked(name, Duration::from_millis(50), async {}).await {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

type Locked = Result<Option<()>, sqlx::Error>;

/// `holder` holds `name` (for at most 5 s) while, 200 ms in, `contender` tries it with `wait`:
/// the holder's answer, the contender's, and how long the contender waited.
async fn contend(
    holder: &EnginePool,
    contender: &EnginePool,
    name: &str,
    wait: Duration,
) -> (Locked, Locked, Duration) {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let held = holder.while_locked(name, Duration::from_secs(5), async move {
        let _ = rx.await;
    });
    let contended = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let start = Instant::now();
        let r = contender.while_locked(name, wait, async {}).await;
        let _ = tx.send(());
        (r, start.elapsed())
    };
    let (held, (contended, waited)) = tokio::join!(held, contended);
    (held, contended, waited)
}

async fn contention_error_panic_cancel_and_leaks(pool: EnginePool, other: EnginePool, db: &str) {
    let mut report = Vec::new();
    // 1. Contention: a second caller gives up after its wait with None.
    let n = name("contention");
    let (held, contended, waited) = contend(&pool, &other, &n, Duration::from_millis(300)).await;
    assert!(matches!(held, Ok(Some(()))), "{db}: holder {held:?}");
    eprintln!("[{db}] contender: {contended:?} after {waited:?} (wait 300 ms)");
    if !matches!(contended, Ok(None)) {
        report.push(format!("contender got {contended:?}, expected Ok(None)"));
    }

    // 2. Work returning an error: released at once.
    let n = name("error");
    let r: Result<Option<Result<(), &str>>, _> =
        pool.while_locked(&n, Duration::from_secs(1), async { Err("boom") }).await;
    assert!(matches!(r, Ok(Some(Err("boom")))));
    let again = free_after(&other, &n, Duration::from_secs(5)).await;
    eprintln!("[{db}] after an erroring work, free after {again:?}");
    if again.is_none_or(|d| d > Duration::from_millis(500)) {
        report.push(format!("lock not free after erroring work: {again:?}"));
    }

    // 3. A panicking work (spawned task): the lock's connection is dropped, not released.
    let n = name("panic");
    let p = pool.clone();
    let n2 = n.clone();
    let joined =
        tokio::spawn(
            async move { p.while_locked(&n2, Duration::from_secs(1), async { panic!("work panicked") }).await },
        )
        .await;
    assert!(joined.is_err(), "the task panicked");
    let again = free_after(&other, &n, Duration::from_secs(10)).await;
    eprintln!("[{db}] after a panicking work, free after {again:?}");
    if again.is_none_or(|d| d > Duration::from_secs(2)) {
        report.push(format!("lock not free after a panicking work: {again:?}"));
    }

    // 4. A cancelled caller (timeout around while_locked, work pending forever).
    let n = name("cancel");
    let cancelled = tokio::time::timeout(
        Duration::from_millis(300),
        pool.while_locked(&n, Duration::from_secs(1), futures::future::pending::<()>()),
    )
    .await;
    assert!(cancelled.is_err(), "cancelled");
    let again = free_after(&other, &n, Duration::from_secs(10)).await;
    eprintln!("[{db}] after a cancelled caller, free after {again:?}");
    if again.is_none_or(|d| d > Duration::from_secs(2)) {
        report.push(format!("lock not free after a cancelled caller: {again:?}"));
    }

    // 5. Leaks: 20 cancelled callers and 20 contended ones leave no server session behind.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = sessions(&other).await;
    for i in 0..20 {
        let n = name(&format!("leak{i}"));
        let _ = tokio::time::timeout(
            Duration::from_millis(100),
            pool.while_locked(&n, Duration::from_secs(1), futures::future::pending::<()>()),
        )
        .await;
    }
    let n = name("leak-contended");
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let holder = pool.while_locked(&n, Duration::from_secs(1), async move {
        let _ = rx.await;
    });
    let contenders = async {
        for _ in 0..20 {
            let _ = other.while_locked(&n, Duration::from_millis(10), async {}).await;
        }
        let _ = tx.send(());
    };
    let _ = tokio::join!(holder, contenders);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = sessions(&other).await;
    eprintln!("[{db}] sessions before {before}, after {after}");
    if after > before + 1 {
        report.push(format!("server sessions grew from {before} to {after}"));
    }
    assert!(report.is_empty(), "[{db}] {}", report.join("; "));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_locked_postgres() {
    contention_error_panic_cancel_and_leaks(pg_pool(None).await, pg_pool(None).await, "postgres").await;
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_locked_mariadb() {
    contention_error_panic_cancel_and_leaks(my_pool().await, my_pool().await, "mariadb").await;
}

/// The server's engine pool runs with `statement_timeout` (`db_statement_timeout_ms`, 30 s by
/// default) and the console's session table creation waits `while_locked` up to 300 s. On
/// PostgreSQL the advisory lock's wait is a statement: the statement timeout cancels it first,
/// and the caller gets an error (57014), not `Ok(None)` after its wait. Here: a 1 s statement
/// timeout against a 3 s wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_locked_postgres_wait_longer_than_statement_timeout() {
    let holder_pool = pg_pool(None).await;
    let bounded = pg_pool(Some(1000)).await;
    let (_, r, waited) = contend(&holder_pool, &bounded, &name("stmt-timeout"), Duration::from_secs(3)).await;
    eprintln!("contender with wait 3 s on a pool with statement_timeout 1 s: {r:?} after {waited:?}");
    assert!(matches!(r, Ok(None)) && waited >= Duration::from_millis(2900), "{r:?} after {waited:?}");
}

/// `EnginePool::while_locked` on a MySQL pool whose connections select no database (a team's
/// pool may; the engine refuses only its own database as the team's): the lock's name is built
/// from `DATABASE()`, which is NULL there, so `GET_LOCK(NULL, …)` returns NULL and every call
/// answers `Ok(None)` ("another process held the lock all of `wait`") at once, with no holder.
#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_locked_mariadb_pool_without_a_database() {
    let url = my_url();
    let base = url.rsplit_once('/').map(|(b, _)| b.to_owned()).unwrap();
    let pool = EnginePool::from(sqlx::mysql::MySqlPoolOptions::new().max_connections(2).connect(&base).await.unwrap());
    let start = Instant::now();
    let r = pool.while_locked(&name("no-database"), Duration::from_secs(2), async {}).await;
    eprintln!("no default database: {r:?} after {:?}", start.elapsed());
    assert!(matches!(r, Ok(Some(()))), "{r:?} after {:?}", start.elapsed());
}
