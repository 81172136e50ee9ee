//! Widgets shared by several pages.

pub mod shell;
