//! The `dedup-console` server: configuration, start-up wiring (the engine with the order
//! example's groups, the console of `dedup_app::ssr::console_router` around it) and the command
//! line. The binary (`main.rs`) only parses the command line and calls [`cli::run`].

pub mod cli;
pub mod cli_cleanup;
pub mod cli_users;
pub mod config;
pub mod example_database;
pub mod hints;
pub mod operator;
pub mod publish;
pub mod startup;
pub mod telemetry;
