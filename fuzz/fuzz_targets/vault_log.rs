//! See `memvault_fuzz::checks::vault_log`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| memvault_fuzz::checks::vault_log::check(data));
