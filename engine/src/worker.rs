//! Naming of workers: `<host>:<pid>:<n>` is written as the lease owner, so an operator can tell
//! which process held a stuck record.

/// This machine's host name (`unknown-host` when it cannot be read).
pub fn hostname() -> String {
    gethostname::gethostname().into_string().unwrap_or_else(|_| "unknown-host".to_owned())
}

/// The name of worker `n` of this process.
pub fn worker_name(n: usize) -> String {
    format!("{}:{}:{n}", hostname(), std::process::id())
}
