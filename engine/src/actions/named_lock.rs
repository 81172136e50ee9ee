//! A lock held across processes by name, on a database connection of its own: one runner per
//! bulk requeue job ([`super::bulk::RequeueJobBooks::lock_job_runner`]) and one per cleanup
//! schedule ([`super::cleanup::CleanupBooks::lock_schedule`]). PostgreSQL's is a session
//! advisory lock (`store/postgres/named_lock.rs`), MySQL's a `GET_LOCK`
//! (`store/mysql/named_lock.rs`); either ends with its connection, so a crashed holder frees it.

use async_trait::async_trait;

/// A held named lock.
#[async_trait]
pub trait NamedLock: Send {
    /// Whether this process still holds it: `false` once its connection was closed or killed
    /// (an idle timeout such as MySQL's `wait_timeout`, a proxy, `KILL`, a restarted database),
    /// when another process may take it. A holder asks before each step (a batch) and stops when
    /// it is lost, so two holders never overlap.
    async fn held(&mut self) -> bool;

    /// Releases it (closing its connection).
    async fn release(self: Box<Self>);
}
