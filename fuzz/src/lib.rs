//! The checks the fuzz targets run, shared with the main crate's replay
//! test (`tests/it/fuzz_replay.rs` includes `src/checks/` by path), so a
//! committed input is checked the same way on every `cargo test`.
pub mod checks;
