//! The conformance suite every dedup store passes (issue 25; docs/research/store-seam.md, "One
//! conformance suite"): the cases are `async fn`s generic over a [`Harness`], which gives a fresh
//! migrated store and the [`Fixtures`] the cases read it with, and [`crate::conformance_tests!`]
//! expands one `#[tokio::test]` per case for a harness (`engine/tests/conformance_postgres.rs`,
//! `engine/tests/conformance_mysql.rs`).
//!
//! Every case checks after each operation that `record_counts` sums to what a `GROUP BY status`
//! counts ([`assert_counts`]): no store may let its count deltas drift. Cases of the hot path
//! are in `claims.rs` (claims, duplicates, reused ids, keys, concurrency), `settle.rs`
//! (completions, failures, poison, fast-path duplicates), `leases.rs` (leased claims and
//! [`crate::store::LeaseStore`]) and `roles.rs` (what the pipeline asks of a store beyond those: conflicting
//! copies, fingerprints and late duplicates, handler pauses). `accounts.rs` holds the accounts'
//! cases (users, tokens, the login throttle), `audit.rs` the audit log's, `overview.rs`, `failures.rs`, `endpoints.rs` and
//! `records.rs` the console's reads, `record_actions.rs` the operator actions on one record, one kept
//! copy and a drill, `bulk_requeue.rs` the bulk requeue, `cleanup.rs` the cleanup schedules,
//! `seed.rs` the seeding of synthetic records. Each database's harness is in its store's folder
//! (`store/<database>/conformance.rs`), re-exported here; `store/mysql/conformance_reads.rs`
//! checks that MySQL's console reads read no whole table (a case of its own: PostgreSQL's plans
//! are checked by hand).

mod accounts;
mod audit;
#[cfg(feature = "rabbitmq")]
mod conflict_races;
mod bulk_requeue;
mod claims;
mod cleanup;
mod endpoints;
mod failures;
mod leases;
mod overview;
#[cfg(feature = "rabbitmq")]
mod record_actions;
mod record_pages;
mod records;
mod roles;
mod seed;
mod settle;

use async_trait::async_trait;
use uuid::Uuid;

pub use accounts::*;
pub use audit::*;
#[cfg(feature = "rabbitmq")]
pub use conflict_races::*;
pub use bulk_requeue::*;
pub use claims::*;
pub use cleanup::*;
pub use endpoints::*;
pub use failures::*;
pub use leases::*;
pub use overview::*;
#[cfg(feature = "rabbitmq")]
pub use record_actions::*;
pub use record_pages::*;
pub use records::*;
#[cfg(feature = "mysql")]
pub use crate::store::mysql::conformance::MySqlHarness;
#[cfg(feature = "mysql")]
pub use crate::store::mysql::conformance_reads::*;
pub use crate::store::postgres::conformance::PgHarness;
pub use roles::*;
pub use seed::*;
pub use settle::*;

use chrono::{DateTime, Utc};

use crate::message::InboundMessage;
use crate::runtime::EnginePool;
use crate::store::PipelineStore;

/// A record's row as the cases read it, the same on every database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordRow {
    /// Row id.
    pub id: i64,
    /// `processing`, `succeeded`, `failed` or `dead`.
    pub status: String,
    /// Its message type.
    pub message_type: String,
    /// Attempts made.
    pub attempts: i32,
    /// Attempts allowed.
    pub max_attempts: i32,
    /// Raised by every transition.
    pub version: i64,
    /// Deliveries counted as duplicates.
    pub duplicate_count: i32,
    /// Duplicates whose payload differed.
    pub payload_conflicts: i32,
    /// Claims of it while it was still `processing` (lease takeovers).
    pub reentries: i32,
    /// The lease token, while processing.
    pub lease_token: Option<Uuid>,
    /// All three lease columns are set.
    pub leased: bool,
    /// A payload is stored.
    pub has_payload: bool,
    /// `last_error`.
    pub last_error: Option<String>,
    /// `error_class`.
    pub error_class: Option<String>,
    /// A retry is due (`next_attempt_at` set).
    pub retry_due: bool,
    /// `completed_at` is set.
    pub completed: bool,
    /// `parked_at` is set.
    pub parked: bool,
    /// Where its id came from (`id_source`, one letter).
    pub id_source: Option<String>,
}

/// A copy kept in `record_conflicts`, as the cases read it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ConflictRow {
    /// `type` or `payload`.
    pub kind: String,
    /// The copy's message type.
    pub message_type: String,
    /// The `ids.from` source its id came from.
    pub id_source: String,
    /// Its payload.
    pub payload: Vec<u8>,
    /// Its headers, as JSON text.
    pub headers: Option<String>,
    /// `rabbitmq` or `kafka`.
    pub source_broker: String,
    /// Copies counted on the row.
    pub copies: i32,
    /// Not settled.
    pub open: bool,
}

/// A handler's pause row, as the cases read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PauseRowRead {
    /// `running`, `breaker`, `gone` or `operator`.
    pub state: String,
    /// The kind last registered.
    pub kind: Option<String>,
    /// Raised by every change of state.
    pub version: i64,
    /// Who set the state.
    pub changed_by: Option<String>,
    /// The last failure's class.
    pub error_class: Option<String>,
    /// The last failure's HTTP status.
    pub http_status: Option<i16>,
}

/// What the cases read and change on a store's database directly: what tests do with raw SQL,
/// written once per database.
#[async_trait(?Send)]
pub trait Fixtures {
    /// The record of (`group`, `message_id`), if any.
    async fn record(&self, group: &str, message_id: &str) -> Option<RecordRow>;
    /// Makes the lease of record `id` expire a second ago (database clock).
    async fn expire_lease(&self, id: i64);
    /// `record_counts` summed per group and status, the non-zero sums, sorted.
    async fn counted(&self) -> Vec<(String, String, i64)>;
    /// The records per group and status (`GROUP BY`), sorted.
    async fn actual(&self) -> Vec<(String, String, i64)>;
    /// `message_types`, sorted.
    async fn message_types(&self) -> Vec<String>;
    /// The attempt rows of record `id`: attempt and outcome, in attempt order.
    async fn attempt_rows(&self, id: i64) -> Vec<(i32, Option<String>)>;
    /// The attempts of record `id` flagged as late effects, in order.
    async fn late_effects(&self, id: i64) -> Vec<i32>;
    /// Milliseconds until the lease of record `id` expires (database clock).
    async fn lease_remaining_ms(&self, id: i64) -> f64;
    /// The copies kept of record `id`, sorted.
    async fn conflicts(&self, record_id: i64) -> Vec<ConflictRow>;
    /// Settles the open copies of record `id`, as an operator's requeue or dismissal does.
    async fn settle_conflicts(&self, record_id: i64);
    /// Keeps `fingerprint` (PostgreSQL's `dedup_fingerprint` of a triple, as a signed 64-bit
    /// integer) of a deleted record first seen at `first_seen_at`, as cleanup does; forgotten in
    /// a year.
    async fn keep_fingerprint(&self, fingerprint: i64, first_seen_at: DateTime<Utc>);
    /// `late_duplicates`: record id, delay in ms, held; by record id.
    async fn late_duplicates(&self) -> Vec<(i64, i64, bool)>;
    /// Sets the state of `group`'s handler of `message_type` as an operator's pause or resume
    /// does (`since` now, version raised).
    async fn set_pause_state(&self, group: &str, message_type: &str, state: &str);
    /// The pause row of `group`'s handler of `message_type`.
    async fn pause_row(&self, group: &str, message_type: &str) -> Option<PauseRowRead>;
    /// What `api_tokens` stores of each token, by id.
    async fn token_digests(&self) -> Vec<Vec<u8>>;
    /// Ends the session holding bulk requeue job `job_id`'s runner lock, as an idle timeout, a
    /// proxy or an operator's `KILL` would; returns once the lock is free.
    async fn lose_runner_lock(&self, job_id: i64);
    /// Ends the session holding cleanup schedule `id`'s lock, as [`Self::lose_runner_lock`].
    async fn lose_schedule_lock(&self, id: i64);
    /// Moves record `id`'s first sighting, last change and completion `days` days back.
    async fn age_record(&self, id: i64, days: i32);
    /// Makes cleanup schedule `id`'s next tick due a second ago (database clock).
    async fn make_schedule_due(&self, id: i64);
}

/// A store under test: a fresh, migrated database of its own (dropped with the harness) and its
/// [`Fixtures`].
#[async_trait(?Send)]
pub trait Harness: Fixtures + Sized + 'static {
    /// The store.
    type Store: PipelineStore;
    /// The database's name (`postgres`, `mysql`), for the few cases whose expectations differ
    /// by database, each saying why.
    const NAME: &'static str;
    /// A fresh store. Panics when its database is unreachable: the tests need it.
    async fn fresh() -> Self;
    /// The store.
    fn store(&self) -> &Self::Store;
    /// The store's pool, for the roles kept on it (accounts).
    fn engine_pool(&self) -> EnginePool;
}

/// The consumer group of the cases.
pub const GROUP: &str = "conformance-group";

/// A RabbitMQ delivery of `body` under `id`.
pub fn delivery(id: &str, body: &str) -> InboundMessage {
    crate::testing::rabbitmq_delivery(Some(id), body.as_bytes().to_vec())
}

/// `rows` in Rust's (byte-wise) order, whatever the database's collation sorts by.
pub(crate) fn sorted<T: Ord>(mut rows: Vec<T>) -> Vec<T> {
    rows.sort();
    rows
}

/// Asserts that `record_counts` sums to the records per status.
pub async fn assert_counts<H: Fixtures>(h: &H, after: &str) {
    assert_eq!(h.counted().await, h.actual().await, "record_counts drifted after {after}");
}

/// Expands one `#[tokio::test]` per conformance case for a [`Harness`] type given by its path
/// (`conformance_tests!(<path to>::PgHarness)` in a test crate of the engine).
#[macro_export]
macro_rules! conformance_tests {
    ($harness:ty) => {
        $crate::conformance_tests!(@cases $harness;
            a_new_claim_then_a_duplicate_counted_on_it,
            a_failed_record_is_claimed_again_until_its_attempts_run_out,
            dead_at_max_attempts_and_on_a_permanent_error,
            completion_and_failure_are_fenced_by_the_lease_token,
            claims_straight_into_succeeded,
            a_reused_id_of_another_type_is_neither_claimed_nor_counted,
            a_no_handler_record_is_claimed_by_its_own_message,
            keys_compare_bytes,
            a_duplicate_under_an_expired_lease_is_parked_and_counted,
            eight_concurrent_claims_of_one_id_make_one_claim,
            a_batch_claims_new_and_counts_existing_in_item_order,
            overlapping_batches_claimed_at_once_claim_each_id_once,
            poison_is_recorded_once_then_counted_as_a_duplicate,
            a_message_without_handler_under_another_types_id_is_a_reused_id,
            fast_path_duplicates_are_added_to_their_records,
            a_retry_completed_writes_its_attempt_row,
            a_lease_of_zero_or_less_is_raised_to_the_minimum,
            a_live_lease_is_never_taken_even_with_reclaim_allowed,
            an_expired_lease_is_reclaimed_only_when_allowed_and_the_old_holder_is_fenced_out,
            extending_a_lease_needs_its_token,
            a_failed_leased_record_is_claimable_until_its_attempts_run_out,
            leased_batches_and_their_settlements,
            eight_concurrent_leased_claims_of_one_id_make_one_claim,
            a_batch_of_500,
            conflicting_copies_are_kept_one_open_row_per_record_and_payload,
            eight_copies_kept_at_once_make_one_row_counting_them_all,
            a_fingerprint_matches_its_group_type_and_id_and_its_late_duplicate_is_noted_once,
            a_late_duplicate_held_is_a_parked_record_with_its_message_and_its_note,
            handlers_register_running_and_the_paused_are_read_and_probed_once,
            #[cfg(feature = "http")]
            an_engine_pause_is_stored_and_ended_by_a_probe_never_over_an_operators,
            users_are_unique_ignoring_case_and_passwords_change,
            the_last_enabled_admin_cannot_be_demoted_or_disabled_even_by_two_at_once,
            tokens_authenticate_until_revoked_or_the_owner_is_disabled,
            the_throttle_refuses_after_the_limit_until_cleared_or_the_window_ends,
            audit_entries_are_kept_listed_by_filter_and_found_by_message_id,
            the_overview_reads_what_the_store_and_the_runtime_wrote,
            the_record_counts_fold_waits_for_no_claim_in_flight,
            stuck_failed_and_dead_records_are_read_as_the_store_left_them,
            endpoint_calls_are_summed_by_the_answer_table,
            an_operator_pauses_and_resumes_a_handler_by_compare_and_set_audited,
            #[cfg(feature = "rabbitmq")]
            operators_release_mark_dead_letter_and_requeue_records_by_compare_and_set,
            #[cfg(feature = "rabbitmq")]
            operators_requeue_and_dismiss_kept_copies_once,
            #[cfg(feature = "rabbitmq")]
            a_duplicate_drill_is_recorded_and_judged_by_its_records_counters,
            #[cfg(feature = "rabbitmq")]
            a_bulk_requeue_freezes_its_selection_and_one_runner_requeues_each_record_once,
            #[cfg(feature = "rabbitmq")]
            two_batches_of_one_job_never_share_an_item_and_a_lost_runner_lock_shows,
            a_cleanup_schedule_deletes_old_succeeded_records_in_batches_once_and_keeps_their_fingerprints,
            cleanup_keeps_a_record_whose_conflicting_copy_is_kept_while_its_batch_runs,
            keepers_racing_delete_batches_leave_no_orphan_copy,
            distinct_payload_copies_kept_at_once_stay_within_the_open_limit,
            a_cleanup_run_that_lost_its_schedules_lock_stops_before_its_next_batch,
            the_records_list_filters_orders_and_pages_alike,
            a_time_range_lists_the_records_first_seen_in_it,
            a_filter_without_an_index_searches_a_bounded_window_in_every_order,
            filtered_pages_forwards_and_back_equal_the_whole_list_filtered,
            pages_under_time_ranges_across_the_time_window_equal_the_whole_list_filtered,
            a_window_that_reaches_the_last_record_says_nothing_is_left,
            a_time_range_over_two_seed_runs_lists_every_record_in_it,
            seeded_records_are_counted_with_their_attempts_and_a_second_seed_appends,
        );
    };
    (@cases $harness:ty; $($(#[$attr:meta])* $case:ident),* $(,)?) => {
        $(
            $(#[$attr])*
            #[tokio::test]
            async fn $case() {
                $crate::store::conformance::$case::<$harness>().await;
            }
        )*
    };
}
