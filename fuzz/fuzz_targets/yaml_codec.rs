//! libFuzzer target `yaml_codec`: runs `deermem_reliability::fuzz::yaml_codec` (the same body the
//! reliability tests run on `fuzz/corpus/yaml_codec/`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    deermem_reliability::fuzz::yaml_codec(data);
});
