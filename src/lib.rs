//! memvault: encrypted, git-versioned storage for Claude's memory tool
//! (`memory_20250818`).
//!
//! Claude sends `view`, `create`, `str_replace`, `insert`, `delete` and
//! `rename` commands on a virtual `/memories` directory; memvault runs them
//! on a vault where every mutation is an encrypted blob committed to a bare
//! git repository, after a filter has stripped secrets from the text.
//!
//! Layers, one concern each:
//! - [`memory`]: the six commands as pure semantics over a [`memory::Store`]
//!   (no git, no crypto, no files), with an in-memory store for tests;
//! - [`crypto`]: keys, keyslots, blob and name encryption (the only user of
//!   the AEAD, SIV, KDF crates);
//! - [`vault`]: the encrypted git store (the only user of git2: its API
//!   names commits as [`vault::Rev`] and shows no git2 type);
//! - [`redact`]: the secret filter (the only place that compiles regexes);
//! - [`protocol`] and `cli`: JSON-lines framing and the command line (`cli`
//!   only with the default feature `cli`, which the binary requires).
//!
//! # Using the library
//!
//! ```no_run
//! use memvault::crypto::{KeyFileKey, Unlock};
//! use memvault::vault::{Attribution, Vault};
//!
//! let key = KeyFileKey::from_bytes(&std::fs::read("vault.key")?)?;
//! let who = Attribution { session: "s-1".into(), actor: "my-agent".into() };
//! let mut vault = Vault::open("vault".as_ref(), &Unlock::KeyFile(&key), who)?;
//! let memory = memvault::memory_for_vault(&vault)?;
//! let input = serde_json::json!({"command": "view", "path": "/memories"});
//! let result = memory.execute_json(&mut vault, &input);
//! println!("{}", result.text().unwrap_or_default());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(unsafe_code)]

#[cfg(feature = "cli")]
pub mod cli;
pub mod crypto;
#[allow(unsafe_code)]
pub mod hygiene;
pub mod memory;
pub mod protocol;
pub mod redact;
pub mod vault;

/// A pseudo-random number below `n` from a xorshift64 state: for tests
/// that want varied but repeatable input, without a dependency.
#[cfg(test)]
pub(crate) fn test_rand(state: &mut u64, n: usize) -> usize {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    (*state % n as u64) as usize
}

use memory::{FilterOutcome, Memory, MemoryConfig, TextFilter};
use redact::{Mode, Redactor};
use vault::{Vault, VaultConfig};

/// The redaction filter as the memory layer sees it.
struct RedactFilter(Redactor);

impl TextFilter for RedactFilter {
    fn filter(&self, text: &str) -> FilterOutcome {
        match self.0.mode() {
            Mode::Off => FilterOutcome::Clean,
            mode => {
                let red = self.0.redact(text);
                if red.findings.is_empty() {
                    return FilterOutcome::Clean;
                }
                let kinds = red.kinds();
                if mode == Mode::Reject {
                    FilterOutcome::Rejected { kinds }
                } else {
                    FilterOutcome::Redacted {
                        text: red.text,
                        kinds,
                    }
                }
            }
        }
    }

    /// Masked in `redact` and `reject` mode alike: a refused secret is not
    /// echoed back either.
    fn mask(&self, text: &str) -> Option<String> {
        if self.0.mode() == Mode::Off {
            return None;
        }
        let red = self.0.redact(text);
        (!red.findings.is_empty()).then_some(red.text)
    }
}

/// The command executor for a vault's settings, with its redaction filter.
pub fn memory_for_config(config: &VaultConfig, redactor: Redactor) -> Memory {
    let mem_config = MemoryConfig {
        overwrite_on_create: config.overwrite_on_create,
        max_file_bytes: config.max_file_bytes,
        max_view_chars: config.max_view_chars,
    };
    Memory::new(mem_config, Some(Box::new(RedactFilter(redactor))))
}

/// The command executor for an open vault (its settings and filter).
pub fn memory_for_vault(vault: &Vault) -> Result<Memory, redact::RedactError> {
    let redactor = Redactor::new(&vault.config().redaction)?;
    Ok(memory_for_config(vault.config(), redactor))
}
