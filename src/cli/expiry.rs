//! `memvault expire` and `memvault purge`: deletion that really deletes
//! (crypto-erasure; see `vault::erase`).

use std::io::Write;

use serde_json::json;

use super::history::rfc3339;
use super::{CliError, On};
use crate::memory::MemoryPath;
use crate::vault::erase::parse_duration_ms;
use crate::vault::{Attribution, Vault, VaultError};

fn usage(message: impl Into<String>) -> CliError {
    CliError {
        message: message.into(),
        code: 2,
    }
}

fn refused(e: VaultError) -> CliError {
    match e {
        VaultError::Refused(m) => CliError::failure(format!("nothing was changed: {m}")),
        other => other.into(),
    }
}

fn sweeper(actor: &str) -> Result<Attribution, CliError> {
    super::operator_attribution(actor)
}

#[derive(clap::Args, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpireArgs {
    /// Remove files neither viewed nor written for this long: 90m, 12h, 30d,
    /// 2w [default: the vault's expire_after_days]
    #[arg(long, value_name = "AGE")]
    pub older_than: Option<String>,
    /// List what would be removed, with each file's last use; change nothing
    #[arg(long)]
    #[serde(default)]
    pub dry_run: bool,
    /// One JSON object per line
    #[arg(long)]
    #[serde(skip)]
    pub json: bool,
}

/// Why `s` is no expiry period (a zero one included: everything would go).
fn period_error(s: &str) -> CliError {
    let zero = s
        .trim()
        .trim_end_matches(|c: char| c.is_ascii_alphabetic())
        .parse::<u64>()
        .is_ok_and(|n| n == 0);
    let digits = s.trim().trim_end_matches(['s', 'm', 'h', 'd', 'w']);
    let unit_len = s.trim().len() - digits.len();
    let too_long =
        unit_len == 1 && !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit());
    if zero {
        usage(format!(
            "{s:?} is a period of zero: it would expire every file; give more than 0, such as 90m, 12h, 30d or 2w"
        ))
    } else if too_long {
        usage(format!(
            "{s:?} is a longer period than memvault counts (at most about 584 million years, 2^64 milliseconds); give a shorter one, such as 3650d"
        ))
    } else {
        usage(format!(
            "{s:?} is not a period: give a number and a unit, such as 90m, 12h, 30d or 2w"
        ))
    }
}

/// The expiry period: `--older-than`, else the vault's setting.
pub fn period_ms(vault: &Vault, older_than: Option<&str>) -> Result<u64, CliError> {
    match older_than {
        Some(s) => parse_duration_ms(s).ok_or_else(|| period_error(s)),
        None => Ok(u64::from(vault.config().expire_after_days) * 86_400_000),
    }
}

/// `memvault expire`.
pub fn expire(on: On<'_>, args: &ExpireArgs, out: &mut dyn Write) -> Result<u8, CliError> {
    if let Some(s) = &args.older_than {
        parse_duration_ms(s).ok_or_else(|| period_error(s))?;
    }
    on.with(
        || sweeper("expiry"),
        |vault| {
            let period = period_ms(&*vault, args.older_than.as_deref())?;
            let report = vault.expire(period, args.dry_run).map_err(refused)?;
            let when = |t: Option<u64>| t.map(rfc3339);
            if args.json {
                for e in &report.expired {
                    let line = json!({
                        "path": e.path.as_str(), "last_viewed": when(e.access.viewed_ms),
                        "last_written": when(e.access.written_ms),
                        "action": if args.dry_run { "would expire" } else { "expired" },
                    });
                    writeln!(out, "{line}")?;
                }
                let summary = json!({
                    "dry_run": args.dry_run, "expired": report.expired.len(), "kept": report.kept,
                    "unrecorded": report.unrecorded.len(), "erased_keys": report.erased_keys,
                    "rekeyed": report.rekeyed.iter().map(MemoryPath::as_str).collect::<Vec<_>>(),
                    "revision": report.commit.map(|c| c.to_string()),
                    "unfinished": report.unfinished,
                });
                writeln!(out, "{summary}")?;
            } else {
                let verb = if args.dry_run {
                    "would expire"
                } else {
                    "expired"
                };
                for e in &report.expired {
                    writeln!(
                        out,
                        "{verb}  {}  last viewed {}  last written {}",
                        e.path.as_str(),
                        when(e.access.viewed_ms).unwrap_or_else(|| "never".into()),
                        when(e.access.written_ms).unwrap_or_else(|| "unknown".into()),
                    )?;
                }
                for p in &report.rekeyed {
                    writeln!(
                        out,
                        "re-encrypted  {} (it shared a destroyed key)",
                        p.as_str()
                    )?;
                }
                match report.commit {
                    Some(c) => writeln!(
                        out,
                        "{} file{} expired as revision {}, {} key{} destroyed; {} kept",
                        report.expired.len(),
                        if report.expired.len() == 1 { "" } else { "s" },
                        c.short(),
                        report.erased_keys,
                        if report.erased_keys == 1 { "" } else { "s" },
                        report.kept
                    )?,
                    None => writeln!(
                        out,
                        "{} file{} {verb}; {} kept{}",
                        report.expired.len(),
                        if report.expired.len() == 1 { "" } else { "s" },
                        report.kept,
                        if report.unrecorded.is_empty() {
                            String::new()
                        } else {
                            format!(
                                " ({} with no access record yet, counted from now)",
                                report.unrecorded.len()
                            )
                        }
                    )?,
                }
            }
            out.flush()?;
            Ok(unfinished(
                out,
                "expiry",
                report.commit,
                report.unfinished.as_deref(),
                args.json,
            )?)
        },
    )
}

/// An erasure committed whose prune failed: said on stdout (what the
/// server's answer carries) and stderr, and a failure (exit 1), since the
/// destroyed keys are still on the disk until the next writer prunes.
fn unfinished(
    out: &mut dyn Write,
    what: &str,
    commit: Option<crate::vault::Rev>,
    why: Option<&str>,
    json: bool,
) -> std::io::Result<u8> {
    let Some(why) = why else { return Ok(0) };
    let line = format!(
        "not finished: the {what} is committed{} and its files are gone, but the replaced key states that still hold the destroyed keys could not be deleted from the disk ({why}); the next command that writes to this vault deletes them (free space first if the disk is full; `memvault gc` will do)",
        commit
            .map(|c| format!(" (revision {})", c.short()))
            .unwrap_or_default()
    );
    if !json {
        writeln!(out, "{line}")?;
    }
    out.flush()?;
    eprintln!("memvault: {line}");
    Ok(1)
}

#[derive(clap::Args, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PurgeArgs {
    /// The file or directory to erase from all of history
    pub path: String,
    /// Keep the present content (re-encrypted under a new key); erase only
    /// the past versions
    #[arg(long)]
    #[serde(default)]
    pub keep_current: bool,
    /// Who is purging (stored in the tombstone commit)
    #[arg(long, env = "MEMVAULT_ACTOR", default_value = "operator")]
    #[serde(skip)]
    pub actor: String,
}

/// `memvault purge PATH`.
pub fn purge(on: On<'_>, args: &PurgeArgs, out: &mut dyn Write) -> Result<u8, CliError> {
    let path = MemoryPath::parse_stored(&args.path).map_err(|e| usage(e.to_string()))?;
    on.with(
        || sweeper(&args.actor),
        |vault| {
            // The name as the model wrote it finds the file stored under
            // its secret's marker, as the memory tool finds it: the path
            // as given first (a file stored under it before the filter
            // was on), then its redacted form.
            let (path, report) = match vault.purge(&path, args.keep_current) {
                Err(VaultError::Refused(m)) => match super::redacted_path(vault, &path) {
                    Some(redacted) => match vault.purge(&redacted, args.keep_current) {
                        Ok(report) => (redacted, report),
                        Err(VaultError::Refused(_)) => return Err(refused(VaultError::Refused(m))),
                        Err(e) => return Err(refused(e)),
                    },
                    None => return Err(refused(VaultError::Refused(m))),
                },
                other => (path, other.map_err(refused)?),
            };
            for p in &report.removed {
                writeln!(out, "removed  {}", p.as_str())?;
            }
            for p in &report.rekeyed {
                writeln!(out, "kept, re-encrypted under a new key  {}", p.as_str())?;
            }
            writeln!(
                out,
                "erased {} key{}: every past version of {} is unreadable{}",
                report.erased_keys,
                if report.erased_keys == 1 { "" } else { "s" },
                path.as_str(),
                report
                    .commit
                    .map(|c| format!(" (tombstone revision {})", c.short()))
                    .unwrap_or_default()
            )?;
            // A file key follows its file across renames: a file renamed
            // away from the path (or onto it) lost the versions it wrote
            // under its other name too, which its line above does not say.
            let elsewhere: Vec<&str> = report
                .rekeyed
                .iter()
                .filter(|p| !p.starts_with(&path))
                .map(|p| p.as_str())
                .collect();
            if !elsewhere.is_empty() {
                writeln!(
                    out,
                    "note: {} shared a file key with what was purged (a file keeps its key across renames): every earlier version of {} is unreadable too; {} kept as {} now",
                    elsewhere.join(", "),
                    if elsewhere.len() == 1 { "it" } else { "them" },
                    if elsewhere.len() == 1 { "it is" } else { "they are" },
                    if elsewhere.len() == 1 { "it is" } else { "they are" },
                )?;
            }
            out.flush()?;
            Ok(unfinished(
                out,
                "purge",
                report.commit,
                report.unfinished.as_deref(),
                false,
            )?)
        },
    )
}
