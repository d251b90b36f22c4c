//! memvault's integration tests, one binary with a module per area; each
//! drives the real `memvault` binary on a temporary vault.

mod audit;
mod commands;
mod concurrency;
mod crash;
mod disk;
mod expiry;
mod fixtures;
mod fuzz_replay;
mod hostile_disk;
mod hostile_input;
mod hostile_objects;
mod hostile_vault;
mod keys;
mod limits;
mod maintenance;
mod mcp;
mod paths;
mod protocol;
mod redaction;
mod server;
mod server_sync;
mod sync;
mod sync_faults;
mod sync_net;
mod tamper;
mod transfer;
mod unlock;
mod util;
