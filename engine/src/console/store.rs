//! [`ConsoleStore`]: everything the console keeps and reads on one database, as one object.
//! Each role is its own trait (docs/research/store-seam.md 3.7 step 5), implemented on the pool
//! types themselves in `store/<database>/<role>.rs`; a pool implementing them all is a
//! `ConsoleStore`, and a caller that needs one role takes `&dyn ThatRole` (a `&dyn
//! ConsoleStore` coerces to it).

use crate::accounts::AccountBooks;
use crate::actions::RecordBooks;
use crate::actions::bulk::RequeueJobBooks;
use crate::actions::cleanup::CleanupBooks;
use crate::actions::conflicts::ConflictBooks;
use crate::actions::drill::DrillBooks;
use crate::actions::handlers::HandlerBooks;
use crate::audit::AuditLog;
use crate::console::endpoints::EndpointReads;
use crate::console::failures::FailureReads;
use crate::console::overview::OverviewReads;
use crate::console::records::RecordReads;
use crate::console::seed::SeedBooks;
use crate::runtime::EnginePool;

/// The console's roles on one database: accounts, the audit log, the overview's, failure
/// pages', endpoint cards' and records' reads, the handlers' pause rows, the single-record
/// actions, the kept conflicting copies, the duplicate drills, the bulk requeue jobs, and the
/// cleanup schedules and the seeding of synthetic records.
pub trait ConsoleStore:
    AccountBooks
    + AuditLog
    + OverviewReads
    + FailureReads
    + EndpointReads
    + RecordReads
    + HandlerBooks
    + RecordBooks
    + ConflictBooks
    + DrillBooks
    + RequeueJobBooks
    + CleanupBooks
    + SeedBooks
{
}

impl<T> ConsoleStore for T where
    T: AccountBooks
        + AuditLog
        + OverviewReads
        + FailureReads
        + EndpointReads
        + RecordReads
        + HandlerBooks
        + RecordBooks
        + ConflictBooks
        + DrillBooks
        + RequeueJobBooks
        + CleanupBooks
        + SeedBooks
{
}

/// The console's roles on `pool`'s database.
pub fn console_store(pool: &EnginePool) -> &dyn ConsoleStore {
    pool.console_store()
}
