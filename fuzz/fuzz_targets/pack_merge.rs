//! See `memvault_fuzz::checks::pack_merge`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| memvault_fuzz::checks::pack_merge::check(data));
