//! `memvault/machine`: this copy of the vault's stable id (random, made at
//! its first commit) and a name the user may set (the host name until
//! then). Every commit's sealed metadata names it, so `history` says which
//! machine each change came from. Not secret and not authenticated: whoever
//! can write the vault directory can relabel later commits, nothing more.

use std::path::Path;

use crate::vault::{VaultError, fsx, write_durable};

const FILE: &str = "memvault/machine";
const VERSION: &str = "v1";

/// This machine as `memvault machine` shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Machine {
    pub id: String,
    pub name: String,
}

impl Machine {
    /// As commits name it.
    pub fn label(&self) -> String {
        format!("{} ({})", self.name, self.id)
    }
}

fn valid_name(name: &str) -> bool {
    // A plain label has no space at either end.
    (1..=64).contains(&name.chars().count()) && crate::memory::path::is_plain_label(name)
}

fn read(dir: &Path) -> Option<Machine> {
    let text = fsx::read_to_string(&dir.join(FILE), fsx::SMALL).ok()?;
    let line = text.strip_suffix('\n').unwrap_or(&text);
    let mut parts = line.splitn(3, ' ');
    let (Some(VERSION), Some(id), Some(name)) = (parts.next(), parts.next(), parts.next()) else {
        return None;
    };
    let ok_id = id.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit());
    (ok_id && valid_name(name)).then(|| Machine {
        id: id.to_string(),
        name: name.to_string(),
    })
}

fn write(dir: &Path, m: &Machine) -> Result<(), VaultError> {
    let _ = std::fs::remove_file(dir.join(FILE).with_extension("tmp"));
    write_durable(
        &dir.join(FILE),
        format!("{VERSION} {} {}\n", m.id, m.name).as_bytes(),
    )?;
    Ok(())
}

fn host_name() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| {
            h.trim()
                .chars()
                .filter(|c| crate::memory::path::is_plain_char(*c))
                .take(64)
                .collect::<String>()
        })
        .unwrap_or_default();
    if valid_name(&name) {
        name
    } else {
        "machine".into()
    }
}

/// This machine, made now if the vault has none yet.
pub fn machine_info(dir: &Path) -> Result<Machine, VaultError> {
    if let Some(m) = read(dir) {
        return Ok(m);
    }
    let m = Machine {
        id: data_encoding::HEXLOWER.encode(&crate::crypto::random_bytes::<8>()),
        name: host_name(),
    };
    write(dir, &m)?;
    Ok(m)
}

/// The label commits carry (None if the file can be neither read nor
/// made: the commit then names no machine).
pub(crate) fn machine_label(dir: &Path) -> Option<String> {
    machine_info(dir).ok().map(|m| m.label())
}

/// Name this machine (its id stays).
pub fn set_machine_name(dir: &Path, name: &str) -> Result<Machine, VaultError> {
    // Two spaces in a row only from now on: a name stored before is read
    // as it is (`read`), not replaced by a new machine.
    if !valid_name(name) || !crate::memory::path::is_new_label(name) {
        return Err(VaultError::Refused(
            "a machine name is 1 to 64 printable characters, without leading or trailing spaces or two spaces in a row"
                .into(),
        ));
    }
    let mut m = machine_info(dir)?;
    m.name = name.to_string();
    write(dir, &m)?;
    Ok(m)
}
