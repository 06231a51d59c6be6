//! Helpers shared by the fault tests.

pub mod history;
pub mod load;
