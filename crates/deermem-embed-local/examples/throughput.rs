//! Sentences per second of the local model, batches of 32 (the `embed_local` figure):
//! `cargo run --release -p deermem-embed-local --example throughput [MODEL_DIR] [SENTENCES]`.
//! MODEL_DIR defaults to the cache `cargo xtask model fetch` fills.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::Instant;

use deermem_core::ports::Embedder;
use deermem_embed_local::LocalEmbedder;

const SUBJECTS: [&str; 8] = [
    "The user",
    "Her manager",
    "My brother",
    "The team lead",
    "Our landlord",
    "The new intern",
    "His doctor",
    "The neighbour",
];
const VERBS: [&str; 8] = [
    "prefers",
    "recently started",
    "often talks about",
    "wants to avoid",
    "is learning",
    "booked",
    "recommended",
    "forgot about",
];
const OBJECTS: [&str; 8] = [
    "oolong tea before the morning stand-up",
    "a weekend trip to the mountains with friends",
    "the quarterly budget review for the robotics project",
    "Spanish lessons on Tuesday evenings",
    "a vegetarian diet because of a cholesterol warning",
    "running a half marathon in October",
    "the broken dishwasher in the shared kitchen",
    "moving to a flat closer to the office",
];

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = args.next().map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/models/all-MiniLM-L6-v2"),
        PathBuf::from,
    );
    let n: usize = args
        .next()
        .map_or(2048, |s| s.parse().expect("SENTENCES is a number"));
    let texts: Vec<String> = (0..n)
        .map(|i| {
            format!(
                "{} {} {}.",
                SUBJECTS[i % 8],
                VERBS[(i / 8) % 8],
                OBJECTS[(i / 64) % 8]
            )
        })
        .collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let started = Instant::now();
    let embedder = LocalEmbedder::load(&dir, 32).unwrap_or_else(|e| panic!("{e}"));
    let load = started.elapsed();
    runtime.block_on(async {
        // Warm-up batch, not timed.
        embedder.embed(&texts[..32.min(n)]).await.unwrap();
        let started = Instant::now();
        let vectors = embedder.embed(&texts).await.unwrap();
        let secs = started.elapsed().as_secs_f64();
        assert_eq!(vectors.len(), n);
        let one = Instant::now();
        embedder.embed(&texts[..1]).await.unwrap();
        let single = one.elapsed();
        println!(
            "embed_local: {n} sentences in batches of 32: {secs:.2} s, {:.0} sentences/s; \
             one sentence alone {:.1} ms; model load {:.2} s ({})",
            n as f64 / secs,
            single.as_secs_f64() * 1e3,
            load.as_secs_f64(),
            embedder.model_id()
        );
    });
}
