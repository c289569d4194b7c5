//! Project automation: `cargo xtask ci`, `cargo xtask tidy`, `cargo xtask bench`.

fn main() {}
