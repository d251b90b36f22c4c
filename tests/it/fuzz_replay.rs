//! Replays every committed fuzz input (the seed corpora and the inputs the
//! fuzzers found, `fuzz/corpus/<target>/` and `fuzz/artifacts/<target>/`)
//! through the same checks the fuzz targets run, so a fixed bug stays
//! fixed without libFuzzer or a nightly toolchain.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;

#[path = "../../fuzz/src/checks/mod.rs"]
pub(crate) mod checks;

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
    ($($target:ident),*) => {
        /// The targets replayed by a test of their own below.
        const REPLAYED: &[&str] = &[$(stringify!($target)),*];
        $(
            #[test]
            fn $target() {
                let (ran, failed) = replay(stringify!($target), checks::$target::check);
                assert!(ran > 0, "no committed inputs for {}", stringify!($target));
                assert!(failed.is_empty(), "fuzz inputs fail their check: {failed:#?}");
            }
        )*
    };
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

/// The fuzz targets: the names of `fuzz/fuzz_targets/*.rs`, sorted.
fn fuzz_targets() -> Vec<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/fuzz_targets");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "rs"))
        .map(|p| p.file_stem().unwrap().to_str().unwrap().to_string())
        .collect();
    names.sort();
    names
}

fn sorted(names: impl IntoIterator<Item = impl ToString>) -> Vec<String> {
    let mut v: Vec<String> = names.into_iter().map(|n| n.to_string()).collect();
    v.sort();
    v
}

/// Every file in `fuzz/fuzz_targets/` has a replay test here, a check in
/// `checks::TARGETS`, a `[[bin]]` in `fuzz/Cargo.toml` and committed
/// inputs in `fuzz/corpus/<target>/`: a new target that is never replayed
/// fails this test.
#[test]
fn every_target_is_replayed() {
    let targets = fuzz_targets();
    assert!(!targets.is_empty(), "no fuzz targets found");
    assert_eq!(
        sorted(REPLAYED.iter()),
        targets,
        "replay_tests! must name every file in fuzz/fuzz_targets/"
    );
    assert_eq!(
        sorted(checks::TARGETS.iter().map(|(name, _)| *name)),
        targets,
        "checks::TARGETS must name every file in fuzz/fuzz_targets/"
    );
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    for t in &targets {
        assert!(
            manifest.contains(&format!("path = \"fuzz_targets/{t}.rs\"")),
            "fuzz/Cargo.toml has no [[bin]] for fuzz_targets/{t}.rs"
        );
        let corpus = root.join("corpus").join(t);
        let seeds = std::fs::read_dir(&corpus)
            .unwrap_or_else(|e| panic!("{}: {e}", corpus.display()))
            .count();
        assert!(seeds > 0, "{} holds no seed", corpus.display());
    }
}
