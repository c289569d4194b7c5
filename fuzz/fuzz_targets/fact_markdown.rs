//! libFuzzer target `fact_markdown`: runs `deermem_reliability::fuzz::fact_markdown` (the same body the
//! reliability tests run on `fuzz/corpus/fact_markdown/`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    deermem_reliability::fuzz::fact_markdown(data);
});
