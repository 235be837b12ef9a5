//! The space command: client commands and space server.
fn main() {}
