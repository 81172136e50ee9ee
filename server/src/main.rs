//! `dedup-console`: the web console with the embedded idempotent consumer.

use std::process::ExitCode;

use clap::Parser;
use dedup_console::cli;

/// Default stack of threads spawned without an explicit size, in bytes (a virtual reservation:
/// pages are committed only when touched).
///
/// lapin parses each AMQP frame recursively on its own thread (`lapin-io-loop`), spawned with
/// the default 2 MiB stack: a producer's content header of deeply nested header tables (up to
/// RabbitMQ's `frame_max` of 128 KiB, about 18 000 levels) overflowed it and aborted the whole
/// process, again at every restart while the message stayed queued.
const THREAD_STACK_BYTES: usize = 512 << 20;

fn main() -> ExitCode {
    if std::env::var_os("RUST_MIN_STACK").is_none() {
        // SAFETY: no other thread exists yet (the runtime is built below).
        unsafe { std::env::set_var("RUST_MIN_STACK", THREAD_STACK_BYTES.to_string()) };
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
