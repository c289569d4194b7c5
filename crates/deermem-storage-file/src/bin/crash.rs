//! Crash-test helper (built only with the `fault-injection` feature).

fn main() {}
