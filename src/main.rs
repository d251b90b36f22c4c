//! The `memvault` binary: see `memvault --help`.
#![deny(unsafe_code)]

fn main() -> std::process::ExitCode {
    memvault::cli::main()
}
