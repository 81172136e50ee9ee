//! Logging set-up, done once at start.
//!
//! The filter comes from `RUST_LOG` (default: `info` for our crates, `warn` for libraries).

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Default filter when `RUST_LOG` is unset.
pub const DEFAULT_FILTER: &str = "warn,dedup_console=info,dedup_engine=info,dedup_app=info,tower_http=info";

/// Installs the global subscriber writing to stderr, coloured only when stderr is a terminal.
/// Calling it twice is harmless (the second call is ignored), which keeps tests that build
/// several applications simple.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    // Colours only on a terminal: a log file or a collector gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// The Prometheus recorder's handle, installed on first use (once per process).
///
/// Histogram buckets: handler durations in seconds (1 ms … 30 s), duplicate delays in seconds
/// (0.1 s … 30 days).
pub fn metrics_handle() -> &'static metrics_exporter_prometheus::PrometheusHandle {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    static HANDLE: std::sync::OnceLock<metrics_exporter_prometheus::PrometheusHandle> = std::sync::OnceLock::new();
    HANDLE.get_or_init(|| {
        let builder = PrometheusBuilder::new()
            .set_buckets_for_metric(
                Matcher::Full("dedup_handler_duration_seconds".to_owned()),
                &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0],
            )
            .and_then(|b| {
                b.set_buckets_for_metric(
                    Matcher::Full("dedup_duplicate_delay_seconds".to_owned()),
                    &[0.1, 1.0, 5.0, 30.0, 60.0, 300.0, 1800.0, 3600.0, 21600.0, 86400.0, 604800.0, 2592000.0],
                )
            })
            .expect("static bucket lists are valid");
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        if metrics::set_global_recorder(recorder).is_err() {
            tracing::warn!("a metrics recorder was already installed; /metrics shows only this handle's view");
        }
        handle
    })
}
