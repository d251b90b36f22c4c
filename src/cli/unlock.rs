//! Where the secret that unlocks a vault comes from, in order:
//! `--key-file` or `--passphrase-file` (not both), `MEMVAULT_KEY_FILE`,
//! `MEMVAULT_PASSPHRASE`, then a hidden prompt on the terminal. With none of
//! them and no terminal, a clear error instead of a hang.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use zeroize::Zeroizing;

use super::CliError;
use crate::crypto::{KeyFileKey, Passphrase};

/// Where the secret comes from, as given on the command line.
#[derive(Debug, Clone, Default)]
pub struct SecretSource {
    pub key_file: Option<PathBuf>,
    pub passphrase_file: Option<PathBuf>,
}

/// The secret itself.
pub enum Secret {
    KeyFile(KeyFileKey),
    Passphrase(Passphrase),
}

/// Refuse what is not a regular file (after links) before opening it: a
/// FIFO would block the open for ever, a device would be read without end.
fn regular_file(path: &Path, what: &str) -> Result<(), CliError> {
    match fs::metadata(path) {
        Ok(m) if !m.is_file() => Err(CliError::failure(format!(
            "the {what} {} is not a regular file",
            path.display()
        ))),
        _ => Ok(()),
    }
}

/// The passphrase in the file at `path` (`what` names it in errors): its
/// one line, without the line's end. A file of several lines is refused,
/// not guessed at.
pub(crate) fn read_passphrase_file(path: &Path, what: &str) -> Result<String, CliError> {
    regular_file(path, what)?;
    let text = fs::read_to_string(path).map_err(|e| {
        CliError::failure(format!("cannot read the {what} {}: {e}", path.display()))
    })?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(meta) = fs::metadata(path)
            && meta.permissions().mode() & 0o077 != 0
        {
            eprintln!(
                "memvault: warning: the {what} {} is readable by other users; run `chmod 600` on it",
                path.display()
            );
        }
    }
    let text = strip_newline(text);
    if text.contains('\n') {
        return Err(CliError::failure(format!(
            "the {what} {} holds more than one line: put the passphrase alone on its first and only line (or give it in the environment)",
            path.display()
        )));
    }
    Ok(text)
}

pub(crate) fn read_key_file(path: &Path) -> Result<KeyFileKey, CliError> {
    regular_file(path, "key file")?;
    let mut f = fs::File::open(path).map_err(|e| {
        CliError::failure(format!("cannot read the key file {}: {e}", path.display()))
    })?;
    let mut bytes = Zeroizing::new(Vec::with_capacity(33));
    f.by_ref().take(4096).read_to_end(&mut bytes).map_err(|e| {
        CliError::failure(format!("cannot read the key file {}: {e}", path.display()))
    })?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(meta) = f.metadata()
            && meta.permissions().mode() & 0o077 != 0
        {
            eprintln!(
                "memvault: warning: the key file {} is readable by other users; run `chmod 600` on it",
                path.display()
            );
        }
    }
    KeyFileKey::from_bytes(&bytes).map_err(|_| {
        CliError::failure(format!(
            "{} is not a memvault key file: a key file holds exactly 32 random bytes (make one with `memvault keygen FILE`)",
            path.display()
        ))
    })
}

/// A key file about to get a slot of its own (`init`, `key add`) must
/// look like what `memvault keygen` makes: 32 random bytes. A key file is
/// used as it is, with no stretching, so 32 typed characters (a password
/// saved without a line end) or a file of one repeated byte would be a
/// weak key: refused. (Opening a vault takes any 32-byte key file, so
/// existing slots keep working.)
pub(crate) fn check_new_key_file(key: &KeyFileKey, path: &Path) -> Result<(), CliError> {
    let bytes = key.expose_secret();
    // Text in any script: 32 random bytes are valid UTF-8 about once in
    // ten million, and then almost never without a control character.
    let typed = std::str::from_utf8(bytes).is_ok_and(|t| !t.chars().any(char::is_control));
    let mut distinct = [false; 256];
    for b in bytes.iter() {
        distinct[usize::from(*b)] = true;
    }
    // A few values repeated, or a run (00 01 02 ..., steps of one size).
    let step = bytes[1].wrapping_sub(bytes[0]);
    let run = bytes.windows(2).all(|w| w[1].wrapping_sub(w[0]) == step);
    let few = distinct.iter().filter(|d| **d).count() < 12 || run;
    if typed || few {
        return Err(CliError::failure(format!(
            "{} does not look like a key file: its 32 bytes are {}, where a key file holds 32 random bytes (make one with `memvault keygen FILE`; for a password, use --passphrase-file); nothing was changed",
            path.display(),
            if typed {
                "typed characters"
            } else {
                "a few values repeated"
            }
        )));
    }
    Ok(())
}

fn strip_newline(mut s: String) -> String {
    if s.ends_with('\n') {
        s.pop();
        if s.ends_with('\r') {
            s.pop();
        }
    }
    s
}

fn tty_available() -> bool {
    fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/tty")
        .is_ok()
}

impl SecretSource {
    /// Resolve the secret for unlocking an existing vault.
    pub fn resolve(&self) -> Result<Secret, CliError> {
        self.resolve_inner(false)
    }

    /// Resolve the secret for a new vault (a prompted passphrase is asked
    /// twice).
    pub fn resolve_new(&self) -> Result<Secret, CliError> {
        self.resolve_inner(true)
    }

    fn resolve_inner(&self, confirm: bool) -> Result<Secret, CliError> {
        let key_file = |path: &Path| -> Result<Secret, CliError> {
            let key = read_key_file(path)?;
            if confirm {
                check_new_key_file(&key, path)?;
            }
            Ok(Secret::KeyFile(key))
        };
        if let Some(path) = &self.key_file {
            return key_file(path);
        }
        // A flag given beats the environment.
        if let Some(path) = &self.passphrase_file {
            return passphrase(read_passphrase_file(path, "passphrase file")?);
        }
        if let Some(path) = std::env::var_os("MEMVAULT_KEY_FILE").filter(|v| !v.is_empty()) {
            return key_file(Path::new(&path));
        }
        if let Ok(p) = std::env::var("MEMVAULT_PASSPHRASE")
            && !p.is_empty()
        {
            return passphrase(p);
        }
        if !tty_available() {
            return Err(CliError::failure(
                "no secret to unlock the vault: give --key-file FILE (or MEMVAULT_KEY_FILE), --passphrase-file FILE, or MEMVAULT_PASSPHRASE; there is no terminal to ask for a passphrase".to_string(),
            ));
        }
        let first = rpassword::prompt_password("memvault passphrase: ").map_err(|e| {
            CliError::failure(format!("cannot read the passphrase from the terminal: {e}"))
        })?;
        if confirm {
            let second = Zeroizing::new(
                rpassword::prompt_password("repeat the passphrase: ")
                    .map_err(|e| CliError::failure(format!("cannot read the passphrase: {e}")))?,
            );
            if first != *second {
                return Err(CliError::failure(
                    "the two passphrases differ; nothing was created".to_string(),
                ));
            }
        }
        passphrase(first)
    }
}

fn passphrase(p: String) -> Result<Secret, CliError> {
    if p.is_empty() {
        return Err(CliError::failure("the passphrase is empty".to_string()));
    }
    Ok(Secret::Passphrase(Passphrase::new(p)))
}
