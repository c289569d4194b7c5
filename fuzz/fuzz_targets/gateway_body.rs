//! libFuzzer target `gateway_body`: runs `deermem_reliability::fuzz::gateway_body` (the same body the
//! reliability tests run on `fuzz/corpus/gateway_body/`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    deermem_reliability::fuzz::gateway_body(data);
});
