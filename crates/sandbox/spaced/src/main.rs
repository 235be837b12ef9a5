//! spaced: the space daemon inside every sandbox (init, process and file service over the private channel).
fn main() {}
