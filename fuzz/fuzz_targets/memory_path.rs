//! See `memvault_fuzz::checks::memory_path`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| memvault_fuzz::checks::memory_path::check(data));
