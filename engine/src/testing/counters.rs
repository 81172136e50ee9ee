//! Counters of the engine's metrics as tests read them: [`deadlock_reruns`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// `dedup_store_retries_total{reason="deadlock"}`, summed over the test binary's groups.
static DEADLOCK_RERUNS: OnceLock<Arc<AtomicU64>> = OnceLock::new();

/// The transactions run again after a deadlock so far, in this test binary:
/// `dedup_store_retries_total{reason="deadlock"}` over every group. Its first call installs
/// the binary's global `metrics` recorder, which counts that and drops every other metric; call
/// it before the test's work, and read the difference after.
///
/// Panics when the binary installed another recorder.
pub fn deadlock_reruns() -> u64 {
    DEADLOCK_RERUNS
        .get_or_init(|| {
            let count = Arc::new(AtomicU64::new(0));
            metrics::set_global_recorder(DeadlockReruns(count.clone())).expect("the only recorder of this test binary");
            count
        })
        .load(Ordering::SeqCst)
}

/// Counts the deadlock reruns (every other metric is dropped).
struct DeadlockReruns(Arc<AtomicU64>);

impl metrics::Recorder for DeadlockReruns {
    fn describe_counter(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
    fn describe_gauge(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
    fn describe_histogram(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}

    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        let deadlock = key.labels().any(|l| l.key() == "reason" && l.value() == "deadlock");
        if key.name() == "dedup_store_retries_total" && deadlock {
            metrics::Counter::from_arc(self.0.clone())
        } else {
            metrics::Counter::noop()
        }
    }

    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
    }

    fn register_histogram(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Histogram {
        metrics::Histogram::noop()
    }
}
