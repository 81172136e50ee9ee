//! `dedup-console`: the web console with the embedded idempotent consumer.

use std::process::ExitCode;

use clap::Parser;
use dedup_console::cli;

#[tokio::main]
async fn main() -> ExitCode {
    match cli::run(cli::Cli::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
