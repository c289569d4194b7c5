//! libFuzzer target `fts_query`: runs `deermem_reliability::fuzz::fts_query` (the same body the
//! reliability tests run on `fuzz/corpus/fts_query/`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    deermem_reliability::fuzz::fts_query(data);
});
