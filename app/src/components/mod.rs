//! Widgets shared by several pages.

pub mod chart;
pub mod format;
pub mod live;
pub mod records_table;
pub mod session;
pub mod shell;
