//! File operations inside the guest, run on blocking threads as the acting user.

pub mod ops;
pub mod paths;
