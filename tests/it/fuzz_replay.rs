//! Replays every committed fuzz input (the seed corpora and the inputs the
//! fuzzers found, `fuzz/corpus/<target>/` and `fuzz/artifacts/<target>/`)
//! through the same checks the fuzz targets run, so a fixed bug stays
//! fixed without libFuzzer or a nightly toolchain.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;

#[path = "../../fuzz/src/checks/mod.rs"]
mod checks;

fn replay(target: &str, check: fn(&[u8])) -> (usize, Vec<String>) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut ran = 0;
    let mut failed = Vec::new();
    for kind in ["corpus", "artifacts"] {
        let Ok(dir) = std::fs::read_dir(root.join(kind).join(target)) else {
            continue;
        };
        let mut files: Vec<_> = dir.map(|e| e.unwrap().path()).collect();
        files.sort();
        for file in files {
            let data = std::fs::read(&file).unwrap();
            ran += 1;
            if catch_unwind(AssertUnwindSafe(|| check(&data))).is_err() {
                failed.push(file.display().to_string());
            }
        }
    }
    (ran, failed)
}

macro_rules! replay_tests {
    ($($target:ident),*) => {$(
        #[test]
        fn $target() {
            let (ran, failed) = replay(stringify!($target), checks::$target::check);
            assert!(ran > 0, "no committed inputs for {}", stringify!($target));
            assert!(failed.is_empty(), "fuzz inputs fail their check: {failed:#?}");
        }
    )*};
}

replay_tests!(
    protocol_line,
    memory_path,
    crypto_open,
    redact,
    differential,
    vault_log,
    pack_merge
);

#[test]
fn every_target_is_replayed() {
    let names: Vec<&str> = checks::TARGETS.iter().map(|(name, _)| *name).collect();
    assert_eq!(
        names,
        [
            "protocol_line",
            "memory_path",
            "crypto_open",
            "redact",
            "differential",
            "vault_log",
            "pack_merge"
        ]
    );
}
