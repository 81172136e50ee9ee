//! Widgets shared by several pages.

pub mod badge;
pub mod bulk_requeue;
pub mod chart;
pub mod confirm;
pub mod conflicts;
pub mod drill;
pub mod live;
pub mod record_actions;
pub mod records_table;
pub mod session;
pub mod shell;
pub mod ticker;
