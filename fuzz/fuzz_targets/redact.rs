//! See `memvault_fuzz::checks::redact`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| memvault_fuzz::checks::redact::check(data));
