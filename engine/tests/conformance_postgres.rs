//! The store conformance suite (`dedup_engine::store::conformance`) on PostgreSQL.

dedup_engine::conformance_tests!(dedup_engine::store::conformance::PgHarness);
