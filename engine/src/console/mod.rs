//! What the dedup console crates need of the engine: `dedup-app` (pages, server functions, REST
//! API) and the `dedup-console` binary (CLI operator commands, accounts). **Not a stable API**: it
//! changes with those crates, not with semantic versioning. A host embedding the engine does
//! not need it; it mounts the console through `dedup-app`.
//!
//! The console's read side lives here: every query the overview, records, stuck, retries,
//! dead-letter and record pages run, shared by the server functions, the REST API (`/api/v1`)
//! and the bench ([`endpoints`], [`failures`], [`filter`], [`overview`], [`records`]). Counts
//! and charts come from the aggregates the engine keeps as it works (`record_counts`,
//! `stats_minute`, `table_samples`, `duplicate_delays`), never from `COUNT(*)` over the dedup
//! table (an HTTP endpoint card counts its newest 5 000 calls at most); lists use
//! keyset pagination on the indexes of the `console_indexes` migration. Times are the
//! database's (`now()`), as everywhere in the engine. Its write side is [`actions`] (operator
//! actions), [`accounts`] and [`audit`].

pub mod endpoints;
pub mod failures;
pub mod filter;
pub mod overview;
pub mod records;
pub mod seed;
mod store;

pub use store::{ConsoleStore, console_store};

/// Why a console query failed.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    /// A filter, cursor or parameter is invalid; the text says which and why (safe to show).
    #[error("{0}")]
    BadFilter(String),
    /// The database failed the query (details are for the log, not the browser).
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
}

pub use crate::consumer::ConsumerStatus;
pub use crate::fastpath::FastPath;
pub use crate::group::HttpEndpoint;
pub use crate::instances::{Instance, InstanceConsumer};
pub use crate::record::{RecordStatus, UnknownStatus};
pub use crate::runtime::RunningGroup;
pub use crate::service::{error_chain, redact_url};
pub use crate::store::DbErrorKind;
pub use crate::store::postgres::engine_pool;

/// Operator accounts: users with a role and an argon2id password hash, per-user API tokens
/// (stored as SHA-256), and the login-failure throttle.
///
/// Roles (least to most): `viewer` reads everything; `operator` also acts on records (release,
/// mark succeeded, requeue, drill); `admin` also manages cleanup schedules, users and settings.
pub mod accounts {
    pub use crate::accounts::{AccountBooks, AccountError, Role, User, UserName};

    /// Password policy, hashing and verification.
    pub mod passwords {
        pub use crate::accounts::passwords::{blocking, hash_password, verify_password};
    }

    /// The login-failure throttle's keys, per account and per client address (the counts are
    /// kept by [`AccountBooks`]).
    pub mod throttle {
        pub use crate::accounts::books::MAX_THROTTLE_WINDOW;
        pub use crate::accounts::throttle::{account_key, address_key};
    }

    /// Per-user API tokens.
    pub mod tokens {
        pub use crate::accounts::tokens::{ApiToken, token_authenticate, token_create};
    }

    /// Users.
    pub mod users {
        pub use crate::accounts::users::UserChange;
    }
}

/// Operator actions (DESIGN.md, "Operator actions"): the only writes the console, the REST API
/// and the CLI make to dedup records, each a guarded compare-and-set written to the audit log.
pub mod actions {
    pub use crate::actions::record::HAND_DEAD_LETTER_CLASS;
    pub use crate::actions::{
        ActionError, ActionOutcome, ErrorKind, LockedRecord, NamedLock, OperatorTx, Publishers, RecordAction,
        RecordActionKind, RecordBooks, RecordChange, RecordTransition, record_action,
    };

    /// Bulk requeue jobs: preview, start, control, and the runner the CLI drives.
    pub mod bulk {
        pub use crate::actions::bulk::{
            DEFAULT_CANARY, DEFAULT_FAILURE_THRESHOLD, DEFAULT_RATE, FrozenJob, FrozenSelection, ItemVerdict,
            JobChange, JobControl, LockedCandidate, NewRequeueJob, PendingItem, RequeueBatch, RequeueJob,
            RequeueJobBooks, RequeueJobParams, RequeuePreview, RunnerView, requeue_job, requeue_job_control,
            requeue_job_start, requeue_jobs, requeue_preview,
        };

        /// Runs a bulk requeue job.
        pub mod runner {
            pub use crate::actions::bulk::runner::run_job;
        }
    }

    /// Copies of deliveries whose message id was a record's while their type or payload was
    /// not: listed, counted, requeued under a new id.
    pub mod conflicts {
        pub use crate::actions::conflicts::{
            ConflictBooks, ConflictChange, LockedConflict, Lossy, PAYLOAD_SHOWN_BYTES, RecordConflict,
            dismiss_conflict, open_conflicts, record_conflicts, requeue_conflict, requeue_conflicts,
        };
    }

    /// Cleanup schedules, their runs, and retention advice.
    pub mod cleanup {
        pub use crate::actions::cleanup::{
            CleanupBooks, CleanupRun, CleanupSchedule, DeleteBatch, RetentionAdvice, RunEnd, ScheduleInput,
            ScheduleRow, cleanup_dry_run, cleanup_runs, cleanup_schedule, cleanup_schedule_save, cleanup_schedules,
            retention_advice,
        };

        /// Late duplicates and deliveries older than the retention (the advice's evidence).
        pub mod late {
            pub use crate::actions::cleanup::late::{
                LateDeliveries, LateDuplicates, WINDOW_DAYS, late_deliveries, late_duplicates,
            };
        }

        /// Running a schedule now, and the scheduler's pass.
        pub mod scheduler {
            pub use crate::actions::cleanup::scheduler::{cleanup_run_now, run_due};
        }
    }

    /// Duplicate drills: republish a record's message and watch the dedup catch it.
    pub mod drill {
        pub use crate::actions::drill::{
            DrillBooks, DrillRecord, DrillReport, DrillRow, DrillTarget, drill_report, drill_start,
        };
    }

    /// Handlers' pause states, and pausing and resuming them by hand.
    pub mod handlers {
        pub use crate::actions::handlers::{
            HandlerBooks, HandlerChange, HandlerControl, HandlerPause, MAX_HANDLERS, handler_control,
        };
        pub use crate::pause::{FRESH_FOR, PauseState};
    }
}

/// The audit log: every action and sign-in.
pub mod audit {
    pub use crate::audit::{AuditEntry, AuditFilter, AuditLog, AuditOutcome, NewAuditEntry};
}
