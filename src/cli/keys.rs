//! Key management commands: `passwd`, `key add|list|remove`, `rekey`.
//!
//! The unlocking secret comes from the global options as for every command
//! (`--key-file`, `--passphrase-file`, `MEMVAULT_PASSPHRASE`, prompt). A
//! *new* secret has its own names so the two never mix:
//! `--new-passphrase-file FILE`, `MEMVAULT_NEW_PASSPHRASE`, a double prompt,
//! or `--new-key-file FILE` for `key add`. No secret is ever printed.

use std::fs;
use std::io::Write;
use std::path::PathBuf;

use clap::{Args, Subcommand};
use zeroize::Zeroizing;

use super::{CliError, Global, Secret, source, vault_dir};
use crate::crypto::{KdfParams, KeyFileKey, Passphrase, SlotKind, Unlock};
use crate::vault::{Attribution, NewSlot, Vault, VaultError};

#[derive(Args, Debug, Clone)]
pub struct KdfArgs {
    /// Argon2id memory in KiB for the new passphrase slot [default: 65536;
    /// for passwd, the replaced slot's]
    #[arg(long, value_name = "KIB")]
    pub argon2_memory: Option<u32>,
    /// Argon2id passes [default: 3; for passwd, the replaced slot's]
    #[arg(long, value_name = "N")]
    pub argon2_passes: Option<u32>,
    /// Argon2id lanes [default: 1; for passwd, the replaced slot's]
    #[arg(long, value_name = "N")]
    pub argon2_lanes: Option<u32>,
}

impl KdfArgs {
    /// The parameters given, each one not given taken from `base`.
    fn params_or(&self, base: KdfParams) -> Result<KdfParams, CliError> {
        let params = KdfParams {
            m_kib: self.argon2_memory.unwrap_or(base.m_kib),
            t: self.argon2_passes.unwrap_or(base.t),
            p: self.argon2_lanes.unwrap_or(base.p),
        };
        params.validate().map_err(|e| CliError {
            message: format!("Argon2 parameters refused: {e}"),
            code: 2,
        })?;
        Ok(params)
    }

    fn params(&self) -> Result<KdfParams, CliError> {
        self.params_or(KdfParams::DEFAULT)
    }
}

#[derive(Args, Debug)]
pub struct PasswdArgs {
    /// A file holding the new passphrase (one trailing newline ignored) (else MEMVAULT_NEW_PASSPHRASE, else a double prompt)
    #[arg(long, value_name = "FILE")]
    pub new_passphrase_file: Option<PathBuf>,
    /// The passphrase slot to replace [default: the one unlocked with, else the only one]
    #[arg(long, value_name = "ID")]
    pub slot: Option<String>,
    #[command(flatten)]
    pub kdf: KdfArgs,
}

#[derive(Subcommand, Debug)]
pub enum KeyCommand {
    /// Add a keyslot: a key file (--new-key-file) or a passphrase
    Add(KeyAddArgs),
    /// List the keyslots: id, kind, KDF parameters (no secrets)
    List,
    /// Remove a keyslot (never the last one)
    Remove {
        /// The slot id, as `memvault key list` prints it
        id: String,
        /// Also remove the slot this command was unlocked with
        #[arg(long)]
        force: bool,
    },
}

#[derive(Args, Debug)]
pub struct KeyAddArgs {
    /// Add a slot for this raw 32-byte key file (written with a new random key if it does not exist)
    #[arg(long, value_name = "FILE", conflicts_with = "new_passphrase_file")]
    pub new_key_file: Option<PathBuf>,
    /// Add a passphrase slot read from this file (one trailing newline ignored)
    /// (without either option: MEMVAULT_NEW_PASSPHRASE, else a double prompt)
    #[arg(long, value_name = "FILE")]
    pub new_passphrase_file: Option<PathBuf>,
    #[command(flatten)]
    pub kdf: KdfArgs,
}

#[derive(Args, Debug)]
pub struct RekeyArgs {
    /// Remove every keyslot other than the one unlocked with (rekey cannot
    /// rewrap them without their secrets)
    #[arg(long)]
    pub drop_other_slots: bool,
}

fn attribution() -> Attribution {
    Attribution {
        session: "keys".into(),
        actor: "memvault".into(),
    }
}

/// Open the vault and keep the secret (rekey rewraps its slot).
fn open(global: &Global) -> Result<(Vault, Secret), CliError> {
    let dir = vault_dir(global)?;
    if !dir.exists() {
        return Err(VaultError::NotFound(dir).into());
    }
    super::no_core_dumps();
    let secret = source(global).resolve()?;
    let vault = {
        let unlock = unlock_of(&secret);
        Vault::open(&dir, &unlock, attribution())?
    };
    Ok((vault, secret))
}

fn unlock_of(secret: &Secret) -> Unlock<'_> {
    match secret {
        Secret::KeyFile(k) => Unlock::KeyFile(k),
        Secret::Passphrase(p) => Unlock::Passphrase(p),
    }
}

/// The new passphrase: `file`, else MEMVAULT_NEW_PASSPHRASE, else asked
/// twice on the terminal.
fn new_passphrase(file: Option<&PathBuf>) -> Result<Passphrase, CliError> {
    let text = if let Some(path) = file {
        super::unlock::read_passphrase_file(path, "new passphrase file")?
    } else if let Some(p) = std::env::var("MEMVAULT_NEW_PASSPHRASE")
        .ok()
        .filter(|p| !p.is_empty())
    {
        p
    } else {
        if fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/tty")
            .is_err()
        {
            return Err(CliError::failure(
                "no new passphrase: give --new-passphrase-file FILE or MEMVAULT_NEW_PASSPHRASE; there is no terminal to ask for one",
            ));
        }
        let first = rpassword::prompt_password("new passphrase: ")
            .map_err(|e| CliError::failure(format!("cannot read the passphrase: {e}")))?;
        let second = Zeroizing::new(
            rpassword::prompt_password("repeat the new passphrase: ")
                .map_err(|e| CliError::failure(format!("cannot read the passphrase: {e}")))?,
        );
        if first != *second {
            return Err(CliError::failure(
                "the two new passphrases differ; nothing was changed",
            ));
        }
        first
    };
    let pass = Passphrase::new(text);
    if pass.expose_secret().is_empty() {
        return Err(CliError::failure(
            "the new passphrase is empty; nothing was changed",
        ));
    }
    Ok(pass)
}

pub fn passwd(global: &Global, args: &PasswdArgs, err: &mut dyn Write) -> Result<u8, CliError> {
    // Parameters not given are the replaced slot's: a passphrase changed
    // keeps the work its owner chose (it took the defaults, weakening a
    // slot made stronger; round 40d).
    let (mut vault, _secret) = open(global)?;
    let replaced = vault
        .slots()?
        .into_iter()
        .find(|e| match &args.slot {
            Some(id) => e.id == id.to_ascii_lowercase(),
            None => e.unlocked_with,
        })
        .and_then(|e| match e.kind {
            SlotKind::Passphrase(p) => Some(p),
            SlotKind::KeyFile => None,
        });
    let params = args.kdf.params_or(replaced.unwrap_or(KdfParams::DEFAULT))?;
    let new = new_passphrase(args.new_passphrase_file.as_ref())?;
    let id = vault.change_passphrase(args.slot.as_deref(), &new, params)?;
    writeln!(
        err,
        "memvault: passphrase changed; the old passphrase no longer opens this vault (new slot {id}). Old key-state objects stay on disk until `memvault gc`."
    )?;
    Ok(0)
}

pub fn key(
    global: &Global,
    cmd: &KeyCommand,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<u8, CliError> {
    match cmd {
        KeyCommand::Add(args) => add(global, args, err),
        KeyCommand::List => list(global, out),
        KeyCommand::Remove { id, force } => {
            let (mut vault, secret) = open(global)?;
            let own = vault
                .slots()?
                .iter()
                .any(|e| e.unlocked_with && e.id == id.to_ascii_lowercase());
            vault.remove_slot(id, *force)?;
            // The secret of the slot removed is known here only when it is
            // the one this command was unlocked with: then whether it still
            // opens another slot (merged from another machine) can be said.
            let still = if own {
                vault.slots_opened_by(&unlock_of(&secret))
            } else {
                Vec::new()
            };
            if !still.is_empty() {
                writeln!(
                    err,
                    "memvault: removed keyslot {id}; warning: the secret you unlocked with still opens this vault through keyslot {} (another slot for the same secret, added on another machine and merged by a sync): remove it too to revoke that secret",
                    still.join(", ")
                )?;
                return Ok(1);
            }
            writeln!(
                err,
                "memvault: removed keyslot {id}; the secret it held no longer opens this vault through it (the replaced key state stays on disk until `memvault gc`, and in any copy made before; `memvault key list` on a machine holding that secret shows any other slot it opens)"
            )?;
            Ok(0)
        }
    }
}

fn add(global: &Global, args: &KeyAddArgs, err: &mut dyn Write) -> Result<u8, CliError> {
    let (mut vault, _secret) = open(global)?;
    let id = if let Some(path) = &args.new_key_file {
        // No file there yet: a new random key is written to it (as
        // `keygen` does, 0600, never over a file), and removed again if
        // the slot cannot be added.
        if std::fs::symlink_metadata(path).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound)
        {
            let key = KeyFileKey::generate();
            super::write_new_key_file(path, &key)?;
            match vault.add_slot(&NewSlot::KeyFile(&key)) {
                Ok(id) => {
                    writeln!(err, "memvault: wrote a new key file to {}", path.display())?;
                    id
                }
                Err(e) => {
                    let _ = std::fs::remove_file(path);
                    return Err(e.into());
                }
            }
        } else {
            let probe = super::SecretSource {
                key_file: Some(path.clone()),
                passphrase_file: None,
            };
            let Secret::KeyFile(key) = probe.resolve_new()? else {
                unreachable!("a key-file source resolves to a key file")
            };
            vault.add_slot(&NewSlot::KeyFile(&key))?
        }
    } else {
        let params = args.kdf.params()?;
        let pass = new_passphrase(args.new_passphrase_file.as_ref())?;
        vault.add_slot(&NewSlot::Passphrase(&pass, params))?
    };
    writeln!(err, "memvault: added keyslot {id}")?;
    Ok(0)
}

fn list(global: &Global, out: &mut dyn Write) -> Result<u8, CliError> {
    let (vault, secret) = open(global)?;
    let opened = vault.slots_opened_by(&unlock_of(&secret));
    for slot in vault.slots()? {
        let kind = match slot.kind {
            SlotKind::KeyFile => "key-file".to_string(),
            SlotKind::Passphrase(p) => {
                format!("passphrase argon2id m={}KiB t={} p={}", p.m_kib, p.t, p.p)
            }
        };
        let mark = if slot.unlocked_with {
            " (unlocked with)"
        } else if opened.contains(&slot.id) {
            // Two slots for one secret (a sync merged two machines' `key
            // add`): removing one revokes nothing.
            " (also opened by the secret you unlocked with: remove one of the two)"
        } else {
            ""
        };
        writeln!(out, "{} {kind}{mark}", slot.id)?;
    }
    writeln!(out, "key epoch {}", vault.keys().current_epoch())?;
    out.flush()?;
    Ok(0)
}

pub fn rekey(global: &Global, args: &RekeyArgs, err: &mut dyn Write) -> Result<u8, CliError> {
    let (mut vault, secret) = open(global)?;
    let report = vault.rekey(&unlock_of(&secret), args.drop_other_slots)?;
    if !report.dropped.is_empty() {
        writeln!(
            err,
            "memvault: removed keyslot(s) {}",
            report.dropped.join(", ")
        )?;
    }
    writeln!(
        err,
        "memvault: new writes use key epoch {} (slot {}). Older history was not re-encrypted and stays readable to anyone holding an older key; run `memvault gc` to drop the old key state from disk.",
        report.epoch, report.slot
    )?;
    Ok(0)
}
