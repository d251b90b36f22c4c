//! See `memvault_fuzz::checks::differential`.
#![no_main]

libfuzzer_sys::fuzz_target!(
    init: {
        // Each input makes a fresh vault; fsync would only slow it down.
        memvault::vault::fsync::set_for_benchmark(false);
    },
    |data: &[u8]| memvault_fuzz::checks::differential::check(data)
);
