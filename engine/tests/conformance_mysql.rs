//! The store conformance suite (`dedup_engine::store::conformance`) on MySQL/MariaDB
//! (`DEDUP_TEST_MYSQL_URL`, default the local MariaDB; scripts/test runs it in the stage "MySQL
//! store tests (MariaDB)").

dedup_engine::conformance_tests!(dedup_engine::store::conformance::MySqlHarness);
