//! libFuzzer target `sidecar_json`: runs `deermem_reliability::fuzz::sidecar_json` (the same body the
//! reliability tests run on `fuzz/corpus/sidecar_json/`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    deermem_reliability::fuzz::sidecar_json(data);
});
