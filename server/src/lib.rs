//! The `dedup-console` server: configuration, start-up wiring, HTTP routes and the command line.
//! The binary (`main.rs`) only parses the command line and calls [`cli::run`].

pub mod cli;
pub mod config;
pub mod operator;
pub mod routes;
pub mod startup;
pub mod telemetry;
