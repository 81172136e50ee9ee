//! `dedup-console`: the web console with the embedded idempotent consumer.

use std::process::ExitCode;

use clap::Parser;
use dedup_console::cli;
use dedup_engine::source::rabbitmq::MIN_THREAD_STACK_BYTES;

fn main() -> ExitCode {
    if std::env::var_os("RUST_MIN_STACK").is_none() {
        // SAFETY: no other thread exists yet (the runtime is built below).
        unsafe { std::env::set_var("RUST_MIN_STACK", MIN_THREAD_STACK_BYTES.to_string()) };
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(cli::run(cli::Cli::parse())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
