//! `dedup-console`: the web console with the embedded idempotent consumer.

use std::process::ExitCode;

use clap::Parser;
use dedup_console::cli;

fn main() -> ExitCode {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a tokio runtime");
    let result = runtime.block_on(cli::run(cli::Cli::parse()));
    // What a stop cut at its bound (`shutdown_timeout_ms`) may still hold a blocking thread:
    // dropping the runtime would wait for it without end.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", dedup_engine::console::error_chain(&e));
            ExitCode::FAILURE
        }
    }
}
