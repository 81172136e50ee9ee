//! The store conformance suite (`dedup_engine::store::conformance`) on MySQL/MariaDB
//! (`DEDUP_TEST_MYSQL_URL`, default the local MariaDB; scripts/test runs it in the stage "MySQL
//! store tests (MariaDB)").

dedup_engine::conformance_tests!(dedup_engine::store::conformance::MySqlHarness);

/// MySQL's console reads touch a bounded share of 100 000 seeded records (no full-table count).
#[tokio::test]
async fn console_reads_on_mysql_touch_no_whole_table() {
    dedup_engine::store::conformance::console_reads_on_mysql_touch_no_whole_table().await;
}
