//! libFuzzer target `manifest_json`: runs `deermem_reliability::fuzz::manifest_json` (the same body the
//! reliability tests run on `fuzz/corpus/manifest_json/`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    deermem_reliability::fuzz::manifest_json(data);
});
