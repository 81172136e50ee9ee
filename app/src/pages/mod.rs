//! One module per console page: the page component, its private children and its server
//! functions.

pub mod account;
pub mod audit;
pub mod cleanup;
pub mod dead_letters;
pub mod handlers;
pub mod login;
pub mod overview;
pub mod record;
pub mod records;
pub mod requeue;
pub mod retries;
pub mod stuck;
pub mod users;
