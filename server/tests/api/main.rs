//! Server integration tests: each test spawns the application on a free port with a fresh
//! database (dropped afterwards) and talks HTTP to it.

mod actions;
mod auth;
mod conflicts;
mod console;
mod database_waits;
mod faults;
mod handlers;
mod health;
mod helpers;
mod instances;
mod late_duplicates;
mod mounting;
mod pages;
mod upgrade;
