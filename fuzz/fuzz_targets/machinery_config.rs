//! The machine configuration decoder, validation and patches
//! (`machinery::config::fuzz_config`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = machinery::config::fuzz_config(data);
});
