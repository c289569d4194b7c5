//! libFuzzer target `llm_response`: runs `deermem_reliability::fuzz::llm_response` (the same body the
//! reliability tests run on `fuzz/corpus/llm_response/`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    deermem_reliability::fuzz::llm_response(data);
});
