//! One module per console page: the page component, its private children and its server
//! functions.

pub mod not_built;
pub mod overview;
