//! memvault's integration tests, one binary with a module per area; each
//! drives the real `memvault` binary on a temporary vault.

mod commands;
mod concurrency;
mod disk;
mod fuzz_replay;
mod paths;
mod protocol;
mod redaction;
mod tamper;
mod unlock;
mod util;
