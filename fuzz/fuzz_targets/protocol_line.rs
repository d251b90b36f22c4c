//! See `memvault_fuzz::checks::protocol_line`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| memvault_fuzz::checks::protocol_line::check(data));
