//! `memvault clone`, `remote`, `push`, `pull` and `sync`: one vault on
//! several machines through a git remote (see `vault::sync`).

use std::io::Write;

use super::{CliError, Global, Secret, no_core_dumps, open_vault, source, vault_dir};
use crate::crypto::Unlock;
use crate::vault::{Attribution, PullReport, PushReport, SyncReport, Vault, clone_vault};

#[derive(clap::Args, Debug)]
pub struct CloneArgs {
    /// The remote: a path, file://, ssh://, user@host:path or https:// URL
    pub url: String,
    /// Print what was received as JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Subcommand, Debug)]
pub enum RemoteCommand {
    /// Add a remote (stored in the vault, authenticated; no secret in it)
    Add {
        name: String,
        /// A path, file://, ssh://, user@host:path or https:// URL
        url: String,
    },
    /// List the remotes: name, URL
    List {
        /// As JSON (with what this vault last saw of each)
        #[arg(long)]
        json: bool,
    },
    /// Remove a remote (nothing on the remote changes)
    Remove { name: String },
}

#[derive(clap::Args, Debug)]
pub struct SyncArgs {
    /// The remote's name
    #[arg(default_value = "origin")]
    pub remote: String,
    /// Print the report as JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args, Debug)]
pub struct MachineArgs {
    /// A new name for this machine (its id stays)
    #[arg(long)]
    pub name: Option<String>,
    /// Print as JSON
    #[arg(long)]
    pub json: bool,
}

/// `memvault machine [--name NAME]`.
pub fn machine(global: &Global, args: &MachineArgs, out: &mut dyn Write) -> Result<u8, CliError> {
    // Opened (and unlocked) so that only a key holder names the machine.
    let vault = open(global)?;
    let m = match &args.name {
        Some(name) => {
            // Every commit names the machine, and `history` prints it on
            // each line: a name holding a secret is refused.
            let (_, kinds) = super::redacted_label(name)?;
            if !kinds.is_empty() {
                return Err(CliError::failure(format!(
                    "a machine name must not hold a secret (the filter found {} in it); nothing was changed: choose another name",
                    super::kinds_named(&kinds)
                )));
            }
            crate::vault::set_machine_name(vault.dir(), name)?
        }
        None => crate::vault::machine_info(vault.dir())?,
    };
    if args.json {
        writeln!(out, "{}", json(&m))?;
    } else {
        writeln!(out, "{}\t{}", m.id, m.name)?;
    }
    Ok(0)
}

pub(crate) fn sync_attribution() -> Attribution {
    Attribution {
        session: "sync".into(),
        actor: "memvault".into(),
    }
}

pub fn clone(global: &Global, args: &CloneArgs, out: &mut dyn Write) -> Result<u8, CliError> {
    let dir = vault_dir(global)?;
    no_core_dumps();
    let secret = source(global).resolve()?;
    let unlock = match &secret {
        Secret::KeyFile(k) => Unlock::KeyFile(k),
        Secret::Passphrase(p) => Unlock::Passphrase(p),
    };
    let (_vault, report) = clone_vault(&args.url, &dir, &unlock, sync_attribution())?;
    if args.json {
        writeln!(out, "{}", json(&report))?;
    } else {
        writeln!(
            out,
            "cloned {} into {} ({}, {}); its remote is origin",
            args.url,
            dir.display(),
            super::count(report.commits as u64, "commit"),
            super::count(report.objects as u64, "object"),
        )?;
    }
    Ok(0)
}

pub fn remote(global: &Global, cmd: &RemoteCommand, out: &mut dyn Write) -> Result<u8, CliError> {
    let vault = open_vault(global, sync_attribution())?;
    match cmd {
        RemoteCommand::Add { name, url } => {
            let stored = vault.add_remote(name, url)?;
            writeln!(out, "added remote {name}: {stored}")?;
        }
        RemoteCommand::List { json: true } => {
            writeln!(out, "{}", json(&vault.remotes()?))?;
        }
        RemoteCommand::List { json: false } => {
            for r in vault.remotes()? {
                writeln!(out, "{}\t{}", r.name, r.url)?;
            }
        }
        RemoteCommand::Remove { name } => {
            vault.remove_remote(name)?;
            writeln!(out, "removed remote {name}")?;
        }
    }
    Ok(0)
}

fn open(global: &Global) -> Result<Vault, CliError> {
    open_vault(global, sync_attribution())
}

pub fn push(global: &Global, args: &SyncArgs, out: &mut dyn Write) -> Result<u8, CliError> {
    let report = open(global)?.push(&args.remote)?;
    if args.json {
        writeln!(out, "{}", json(&report))?;
    } else {
        writeln!(out, "{}", push_line(&report))?;
    }
    Ok(0)
}

pub fn pull(global: &Global, args: &SyncArgs, out: &mut dyn Write) -> Result<u8, CliError> {
    let report = open(global)?.pull(&args.remote)?;
    if args.json {
        writeln!(out, "{}", json(&report))?;
    } else {
        write_pull(out, &report)?;
    }
    Ok(0)
}

pub fn sync(global: &Global, args: &SyncArgs, out: &mut dyn Write) -> Result<u8, CliError> {
    let report: SyncReport = open(global)?.sync(&args.remote)?;
    write_sync(out, &report, args.json)?;
    Ok(0)
}

/// What a sync did, as `memvault sync` prints it (`--json`: one line).
pub(crate) fn write_sync(
    out: &mut dyn Write,
    report: &SyncReport,
    as_json: bool,
) -> Result<(), CliError> {
    if as_json {
        writeln!(out, "{}", json(report))?;
    } else {
        for p in &report.pulls {
            write_pull(out, p)?;
        }
        writeln!(out, "{}", push_line(&report.push))?;
    }
    Ok(())
}

fn push_line(r: &PushReport) -> String {
    let mut line = if r.pushed && r.commits == 0 {
        // Main did not move (it would count at least one commit): only
        // the key state did (a keyslot change, a rekey, keys folded).
        format!(
            "pushed this vault's key state to {} (no new commit)",
            r.remote
        )
    } else if r.pushed {
        format!(
            "pushed {} to {}",
            super::count(r.commits as u64, "commit"),
            r.remote
        )
    } else if r.sent_views {
        format!(
            "{} already had every commit; sent the record of views made here",
            r.remote
        )
    } else {
        format!("{} already has everything; nothing pushed", r.remote)
    };
    if r.pruned {
        line.push_str(&format!(
            "\npruned {}: the key states it replaced are deleted there",
            r.remote
        ));
    }
    if let Some(why) = &r.prune_failed {
        // The push landed; the remote still holds the replaced states.
        eprintln!(
            "memvault: warning: pushed, but pruning {} failed ({why}); it still holds the replaced key states: the next push or sync tries again",
            r.remote
        );
    }
    line
}

fn write_pull(out: &mut dyn Write, r: &PullReport) -> Result<(), CliError> {
    match r.outcome.as_str() {
        "empty remote" => writeln!(out, "{} holds no vault yet; nothing pulled", r.remote)?,
        "up to date" => writeln!(out, "up to date with {}", r.remote)?,
        what => writeln!(
            out,
            "{what}: {} from {} ({}), {} changed here",
            super::count(r.commits as u64, "new commit"),
            r.remote,
            super::count(r.objects as u64, "object"),
            super::count(r.merged_files.len() as u64, "file"),
        )?,
    }
    for (file, copy) in &r.conflicts {
        writeln!(
            out,
            "conflict: {file} keeps this machine's version; the other side's is at {copy}"
        )?;
    }
    for file in &r.under_erased {
        writeln!(
            out,
            "warning: {file} is new from {} where this machine purged or expired (written there before it heard); it was kept: purge it again if it must go",
            r.remote
        )?;
    }
    if let Some(slot) = &r.own_slot_removed {
        writeln!(
            out,
            "warning: keyslot {slot}, which this machine unlocked the vault with, was removed on another machine: the passphrase or key file used here no longer opens the vault (ask someone whose secret does to add a keyslot for this machine)"
        )?;
    }
    for (file, kinds) in &r.redacted {
        writeln!(
            out,
            "redacted: the merged text of {file} (the two machines' edits together) held {}; it was redacted before saving",
            crate::redact::secrets_phrase(kinds)
        )?;
    }
    for file in &r.kept_over_expiry {
        writeln!(
            out,
            "kept: {file} was edited on one machine after the other expired it; the edit stays, under a new key (the expired key is destroyed)"
        )?;
    }
    if r.erased > 0 {
        writeln!(
            out,
            "erased here too: {} file key{} the other side destroyed",
            r.erased,
            if r.erased == 1 { "" } else { "s" }
        )?;
    }
    Ok(())
}

fn json(v: &impl serde::Serialize) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| "{}".into())
}

/// `serve --sync REMOTE --sync-every AGE`: a handle of its own on the
/// vault syncs once before the first request is read (so an agent starts
/// from what other machines wrote; waited for at most
/// [`FIRST_SYNC_WAIT`], and a failure is said on stderr, serving going on
/// either way), then every period on a thread, and once more when serving
/// ends ([`Syncer::finish`]: what the last period wrote is pushed; each
/// sync is bounded by the remote timeout). The
/// serving handle catches up with what a merge wrote as it would with
/// another process's writes. Reports go to stderr as counts (never paths
/// or content); git may not prompt for credentials in the background.
pub fn start_syncer(vault: &Vault, remote: &str, every: &str) -> Result<Syncer, CliError> {
    let every_ms = crate::vault::erase::parse_duration_ms(every).ok_or_else(|| CliError {
        message: format!("--sync-every {every:?}: give a period such as 30s, 5m or 1h"),
        code: 2,
    })?;
    // The remote must exist now: a typo is a usage error, not a log line.
    if !vault.remotes()?.iter().any(|r| r.name == remote) {
        return Err(CliError {
            message: format!(
                "--sync {remote:?}: no such remote (add one with `memvault remote add {remote} URL`)"
            ),
            code: 2,
        });
    }
    crate::vault::sync_without_prompts();
    let mut syncer = vault.reopen(sync_attribution())?;
    let remote = remote.to_string();
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    let (first_done, first) = std::sync::mpsc::channel::<()>();
    let name = remote.clone();
    let thread = std::thread::spawn(move || {
        background_sync(&mut syncer, &remote);
        drop(first_done);
        // Until `finish` sends or drops its end.
        while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
            stopped.recv_timeout(std::time::Duration::from_millis(every_ms))
        {
            background_sync(&mut syncer, &remote);
        }
        (syncer, remote)
    });
    // The first sync, waited for a while: a remote that stalls does not
    // hold the agent's start for the whole remote timeout.
    if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = first.recv_timeout(FIRST_SYNC_WAIT) {
        eprintln!(
            "memvault: the first sync with {name} is taking long; serving meanwhile (it goes on in the background)"
        );
    }
    Ok(Syncer { stop, thread })
}

/// How long `serve --sync` waits for its first sync before it serves.
const FIRST_SYNC_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The periodic sync of `serve --sync` (see [`start_syncer`]).
pub struct Syncer {
    stop: std::sync::mpsc::Sender<()>,
    thread: std::thread::JoinHandle<(Vault, String)>,
}

impl Syncer {
    /// Stop the periodic syncs (a sync under way ends first), then sync
    /// once more.
    pub fn finish(self) {
        let _ = self.stop.send(());
        if let Ok((mut syncer, remote)) = self.thread.join() {
            background_sync(&mut syncer, &remote);
        }
    }
}

/// One sync of `serve --sync`, its outcome said on stderr as counts.
fn background_sync(syncer: &mut Vault, remote: &str) {
    match syncer.sync(remote) {
        Ok(r) => {
            let received: usize = r.pulls.iter().map(|p| p.commits).sum();
            let conflicts: usize = r.pulls.iter().map(|p| p.conflicts.len()).sum();
            if received > 0 || r.push.pushed || conflicts > 0 {
                eprintln!(
                    "memvault: synced with {remote}: {received} commit(s) received, {} sent, {conflicts} conflict(s)",
                    r.push.commits
                );
            }
        }
        Err(e) => eprintln!("memvault: sync with {remote} failed: {e}"),
    }
}
