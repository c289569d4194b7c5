//! The `deermem` command-line tool.

fn main() {
    println!("deermem: work in progress");
}
