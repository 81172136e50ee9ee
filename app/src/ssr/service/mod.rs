//! The service layer: everything the console's server functions and REST handlers call, each a
//! thin `verb_noun` over the engine that returns [`crate::wire`] views. Nothing here knows HTTP,
//! routes or sessions (that is [`super::web`]), nor the pages that show the views.
//!
//! Where things go: a new read or action for a page or the API is a function here, in the file
//! of its subject — [`console`] (overview, records, failures: reads), [`operations`] (bulk
//! requeue, cleanup, drills, audit), [`handlers`] (pause states), [`accounts`] (users, tokens), [`actions`] (single-record
//! actions) — taking a [`ConsoleState`] (and the [`auth::RequestAuth`] when it acts for
//! someone). Conversions from engine types to wire types go in `convert`.
//!
//! Imports run downward only: this layer uses the engine, [`crate::wire`], [`crate::error`]
//! and [`crate::format`]; never [`super::web`], the pages or the components (the app's
//! `tests/layers.rs` checks).

pub mod accounts;
pub mod actions;
pub mod auth;
pub mod console;
mod convert;
pub mod handlers;
pub mod operations;
mod state;

pub(crate) use state::console_pool;
pub use state::{CONSOLE_APPLICATION_NAME, ConsoleState, console_state};
