//! Criterion benchmarks of the file storage.

fn main() {}
