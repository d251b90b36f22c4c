//! The vault settings. They hold no secret and no path. From vault
//! format 2 they live in the key state, sealed and MAC'd with the vault
//! key (so whoever can write the vault directory but lacks the key cannot
//! turn redaction off or loosen a limit), and change only through
//! `memvault config set`, each change a `config` commit on main. Format 1
//! kept them in a plain `memvault/config.json`, read once by the
//! migration to format 2.

use serde::{Deserialize, Serialize};

use crate::redact::RedactConfig;

/// Settings of one vault. Unknown keys are an error, not a silent default.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct VaultConfig {
    /// `create` on an existing file overwrites it instead of failing (the old
    /// content stays in history).
    pub overwrite_on_create: bool,
    /// Largest file a command may write, in bytes.
    pub max_file_bytes: usize,
    /// Longest `view` output, in characters, before the middle is left out.
    pub max_view_chars: usize,
    /// Longest protocol line `serve` accepts, in bytes.
    pub max_line_bytes: usize,
    /// Most files the vault may hold.
    pub max_files: usize,
    /// `memvault expire` removes files neither viewed nor written for this
    /// many days (unless given `--older-than`).
    pub expire_after_days: u32,
    /// The secret filter.
    pub redaction: RedactConfig,
}

impl Default for VaultConfig {
    fn default() -> Self {
        VaultConfig {
            overwrite_on_create: false,
            max_file_bytes: 1 << 20,
            max_view_chars: 16_000,
            max_line_bytes: 8 << 20,
            max_files: 100_000,
            expire_after_days: 30,
            redaction: RedactConfig::default(),
        }
    }
}

impl VaultConfig {
    /// Check the values make sense; the message names the setting.
    pub fn validate(&self) -> Result<(), &'static str> {
        if self.max_file_bytes == 0 {
            return Err("max_file_bytes must be at least 1");
        }
        if self.max_view_chars < 1_000 {
            return Err("max_view_chars must be at least 1000");
        }
        if self.max_line_bytes < 1_024 {
            return Err("max_line_bytes must be at least 1024");
        }
        if self.expire_after_days == 0 {
            return Err("expire_after_days must be at least 1");
        }
        if self.max_files == 0 {
            return Err("max_files must be at least 1");
        }
        Ok(())
    }

    /// [`validate`](Self::validate), and the upper bounds a new value must
    /// keep to (a setting stored before they existed still loads): a file
    /// and a request must fit one log record (1 GiB) with room, and a
    /// view, a vault and a retention period stay within what memvault is
    /// built and tested for.
    pub fn validate_change(&self) -> Result<(), &'static str> {
        self.validate()?;
        if self.max_file_bytes > 256 << 20 {
            return Err("max_file_bytes may be at most 268435456 (256 MiB)");
        }
        if self.max_line_bytes > 512 << 20 {
            return Err("max_line_bytes may be at most 536870912 (512 MiB)");
        }
        if self.max_view_chars > 10_000_000 {
            return Err("max_view_chars may be at most 10000000");
        }
        if self.max_files > 10_000_000 {
            return Err("max_files may be at most 10000000");
        }
        if self.expire_after_days > 36_500 {
            return Err("expire_after_days may be at most 36500 (100 years)");
        }
        Ok(())
    }
}
