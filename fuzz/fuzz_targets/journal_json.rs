//! libFuzzer target `journal_json`: runs `deermem_reliability::fuzz::journal_json` (the same body the
//! reliability tests run on `fuzz/corpus/journal_json/`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    deermem_reliability::fuzz::journal_json(data);
});
