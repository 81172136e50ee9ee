//! The `dedup-console` server: configuration, start-up wiring, HTTP routes and the command line.
//! The binary (`main.rs`) only parses the command line and calls [`cli::run`].

pub mod auth;
pub mod cli;
pub mod cli_users;
pub mod config;
pub mod operator;
pub mod routes;
pub mod startup;
pub mod telemetry;
