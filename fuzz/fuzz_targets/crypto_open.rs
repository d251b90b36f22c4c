//! See `memvault_fuzz::checks::crypto_open`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| memvault_fuzz::checks::crypto_open::check(data));
