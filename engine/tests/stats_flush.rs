//! The aggregates' flush: what a failed flush committed before it failed is not counted again.

mod common;

use common::*;
use dedup_engine::stats::Event;
use dedup_engine::store::postgres::PgStore;

#[tokio::test]
async fn a_flush_failing_after_the_aggregates_committed_counts_them_once() {
    let h = Harness::new().await;
    let store = PgStore::new(h.pool().clone(), &h.db.schema);
    h.stats.count("g", Event::Delivery, 3);
    // PostgreSQL refuses a NUL in text: the fast path's duplicate counts fail, after the
    // aggregates' transaction committed.
    h.stats.fast_path_duplicate("g", "ORDER.PAY.1:\0");
    h.stats.flush(h.pool().clone(), &store).await.expect_err("the duplicate counts fail");
    h.stats.flush(h.pool().clone(), &store).await.expect_err("kept for the next flush, they fail again");
    let deliveries: i64 =
        sqlx::query_scalar("SELECT sum(deliveries)::bigint FROM stats_minute").fetch_one(h.pool()).await.unwrap();
    assert_eq!(deliveries, 3, "the committed aggregates, once");
}
