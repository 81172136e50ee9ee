//! The `dedup-console` server: the console as a router a host application mounts ([`console`]),
//! and the binary around it: configuration, start-up wiring, HTTP routes and the command line.
//! The binary (`main.rs`) only parses the command line and calls [`cli::run`].

pub mod auth;
pub mod cli;
pub mod cli_users;
pub mod config;
pub mod console;
pub mod operator;
pub mod routes;
pub mod startup;
pub mod telemetry;
