//! Audit and undo subcommands: `show`, `diff`, `revert`, `restore`,
//! `sessions`, `resume` and `verify`. All of them decrypt in memory only;
//! nothing here writes plaintext to disk.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;

use serde_json::json;

use super::history::rfc3339;
use super::{CliError, On, memory_for, open_vault};
use crate::memory::{MemoryPath, NodeKind, Snapshot, Store};
use crate::vault::{Attribution, CommitMeta, Rev, UndoOutcome, UndoTarget, Vault, VaultError};

fn reader() -> Attribution {
    Attribution {
        session: "audit".into(),
        actor: "memvault".into(),
    }
}

fn usage(message: impl Into<String>) -> CliError {
    CliError {
        message: message.into(),
        code: 2,
    }
}

/// A path argument, as the memory tool resolves it (a secret in a name as
/// written found under its marker).
fn parse_path(vault: &mut Vault, p: &str) -> Result<MemoryPath, CliError> {
    let path = MemoryPath::parse_stored(p).map_err(|e| usage(e.to_string()))?;
    super::stored_path(vault, path)
}

fn not_a_rev(e: VaultError) -> CliError {
    match e {
        VaultError::BadRevision(_) => usage(e.to_string()),
        other => other.into(),
    }
}

#[derive(clap::Args, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShowArgs {
    /// The revision (commit id or prefix from `memvault history`, or HEAD~N)
    pub rev: String,
    /// A file or directory [default: /memories]
    pub path: Option<String>,
    /// Print a file's content as stored, without `view`'s line numbers
    #[arg(long)]
    #[serde(default)]
    pub raw: bool,
}

/// `memvault show REV [PATH]`: the view's refusal (a path that did not
/// exist then, an erased version) is the error (stderr, exit 1; a 422 for
/// the server's `/v1/show`).
pub fn show(on: On<'_>, args: &ShowArgs, out: &mut dyn Write) -> Result<u8, CliError> {
    on.with(
        || Ok(reader()),
        |vault| {
            let rev = vault.resolve_rev(&args.rev).map_err(not_a_rev)?;
            let path = parse_path(vault, args.path.as_deref().unwrap_or("/memories"))?;
            if args.raw {
                let snap = vault.snapshot_at(Some(rev))?;
                match snap.kind(&path).map_err(store_err)? {
                    Some(NodeKind::File) => {
                        let content = snap.read(&path).map_err(store_err)?;
                        out.write_all(&content)?;
                        out.flush()?;
                        return Ok(0);
                    }
                    Some(NodeKind::Dir) => {
                        return Err(CliError::failure(format!(
                            "{} was a directory at {}; --raw prints files only",
                            path.as_str(),
                            rev.short()
                        )));
                    }
                    None => {
                        return Err(CliError::failure(format!(
                            "{} did not exist at {}",
                            path.as_str(),
                            rev.short()
                        )));
                    }
                }
            }
            let memory = memory_for(vault.config())?;
            let mut store = vault.at_revision(Some(rev));
            let result = memory.view_path(&mut store as &mut dyn Store, &path);
            let described;
            let text = match &result.content {
                crate::memory::Content::Text(t) => t.as_str(),
                crate::memory::Content::Image {
                    media_type,
                    data_base64,
                } => {
                    // `view` gave the model the image itself; a person is
                    // told what it is and how to get its bytes.
                    let bytes = data_encoding::BASE64
                        .decode(data_base64.as_bytes())
                        .map_or(0, |b| b.len());
                    described = format!(
                        "{} is an image ({media_type}, {bytes} bytes): `--raw` gives its bytes",
                        path.as_str()
                    );
                    described.as_str()
                }
            };
            // A refusal is a diagnostic: stderr (through the error), exit 1.
            if result.is_error {
                // The tool's "Error: " is the model's; a person reads
                // "memvault: ..." on stderr.
                return Err(CliError::failure(
                    text.strip_prefix("Error: ").unwrap_or(text).to_string(),
                ));
            }
            writeln!(out, "{text}")?;
            // A listing gives sizes for files whose version there was
            // erased since: say which, outside the listing.
            if !result.is_error
                && vault
                    .snapshot_at(Some(rev))?
                    .kind(&path)
                    .map_err(store_err)?
                    == Some(NodeKind::Dir)
            {
                let erased = vault.erased_below(Some(rev), &path)?;
                if !erased.is_empty() {
                    let names: Vec<&str> = erased.iter().map(MemoryPath::as_str).collect();
                    writeln!(
                        out,
                        "(erased since, their keys destroyed: {})",
                        names.join(", ")
                    )?;
                }
            }
            out.flush()?;
            Ok(u8::from(result.is_error))
        },
    )
}

fn store_err(e: crate::memory::StoreError) -> CliError {
    CliError::failure(e.to_string())
}

#[derive(clap::Args, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiffArgs {
    /// The revision to compare (against its parent, or against REV2);
    /// `REV..REV2` gives both
    pub rev: String,
    /// `[REV2] [PATH]`: a second revision, and/or a path (starts with /memories)
    #[arg(num_args = 0..=2)]
    #[serde(default)]
    pub rest: Vec<String>,
    /// The second revision, by name (the server's `/v1/diff` body).
    #[arg(skip)]
    #[serde(default)]
    pub rev2: Option<String>,
    /// The path, by name (the server's `/v1/diff` body).
    #[arg(skip)]
    #[serde(default)]
    pub path: Option<String>,
}

/// `memvault diff REV [REV2] [PATH]`: a unified diff of decrypted content.
pub fn diff(on: On<'_>, args: &DiffArgs, out: &mut dyn Write) -> Result<u8, CliError> {
    on.with(
        || Ok(reader()),
        |vault| {
            let (first, mut rev2) = match args.rev.split_once("..") {
                Some((a, b)) if !a.is_empty() && !b.is_empty() && !b.contains("..") => {
                    (a.to_string(), Some(b.to_string()))
                }
                Some(_) => return Err(usage("give REV..REV2 with both revisions")),
                None => (args.rev.clone(), None),
            };
            if let Some(r2) = &args.rev2 {
                if rev2.is_some() {
                    return Err(usage("give the second revision once"));
                }
                rev2 = Some(r2.clone());
            }
            let mut path = match &args.path {
                Some(p) => Some(parse_path(vault, p)?),
                None => None,
            };
            for r in &args.rest {
                if r.starts_with('/') {
                    if path.is_some() {
                        return Err(usage("give at most one path"));
                    }
                    path = Some(parse_path(vault, r)?);
                } else if rev2.is_none() && path.is_none() {
                    rev2 = Some(r.clone());
                } else {
                    return Err(usage("usage: memvault diff REV [REV2] [PATH]"));
                }
            }
            let rev = vault.resolve_rev(&first).map_err(not_a_rev)?;
            let (old, new) = match rev2 {
                Some(r2) => (Some(rev), Some(vault.resolve_rev(&r2).map_err(not_a_rev)?)),
                None => (vault.parent_of(rev)?, Some(rev)),
            };
            // A path at neither revision is a mistake to say (as `show`
            // says one that was not there), not an empty diff.
            if let Some(p) = &path {
                let there = |r: Option<Rev>| -> Result<bool, CliError> {
                    Ok(vault.snapshot_at(r)?.kind(p).map_err(store_err)?.is_some())
                };
                if !there(old)? && !there(new)? {
                    return Err(CliError::failure(format!(
                        "{} existed at neither revision: nothing to compare",
                        p.as_str()
                    )));
                }
            }
            let text = diff_text(&*vault, old, new, path.as_ref())?;
            out.write_all(text.as_bytes())?;
            out.flush()?;
            Ok(0)
        },
    )
}

/// The unified diff between the trees of two commits (None: empty tree).
pub fn diff_text(
    vault: &Vault,
    old: Option<Rev>,
    new: Option<Rev>,
    under: Option<&MemoryPath>,
) -> Result<String, CliError> {
    let changes = vault.changed_files(old, new, under)?;
    let old_snap = vault.snapshot_at(old)?;
    let new_snap = vault.snapshot_at(new)?;
    let label = |id: Option<Rev>| id.map_or_else(|| "(empty)".to_string(), |r| r.short());
    let mut out = String::new();
    let mut sorted = changes;
    sorted.sort_by(|a, b| a.path.as_str().cmp(b.path.as_str()));
    for c in sorted {
        // An erased version is said outside the content (a file may hold
        // any text, the marker's words too), and diffs as empty.
        let read = |snap: &crate::vault::VaultSnapshot<'_>, exists: bool| {
            if !exists {
                return Ok((None, false));
            }
            match snap.read(&c.path) {
                Ok(v) => Ok((Some(v), false)),
                Err(crate::memory::StoreError::Erased) => {
                    Ok((Some(zeroize::Zeroizing::new(Vec::new())), true))
                }
                Err(e) => Err(store_err(e)),
            }
        };
        let (a, a_erased) = read(&old_snap, c.existed_before())?;
        let (b, b_erased) = read(&new_snap, c.exists_after())?;
        let name =
            |side: &str, v: &Option<zeroize::Zeroizing<Vec<u8>>>, rev, erased| match (v, erased) {
                (None, _) => "/dev/null".to_string(),
                (Some(_), false) => format!("{side}{} ({})", c.path.as_str(), label(rev)),
                (Some(_), true) => {
                    format!("{side}{} ({}, erased)", c.path.as_str(), label(rev))
                }
            };
        let a_name = name("a", &a, old, a_erased);
        let b_name = name("b", &b, new, b_erased);
        let mut notes = String::new();
        if a_erased && b_erased {
            notes.push_str("[both versions were erased: their keys were destroyed]\n");
        } else {
            for (erased, rev) in [(a_erased, old), (b_erased, new)] {
                if erased {
                    notes.push_str(&format!(
                        "[the version at {} was erased: its key was destroyed]\n",
                        label(rev)
                    ));
                }
            }
        }
        let a_text = a.as_ref().map(|v| std::str::from_utf8(v));
        let b_text = b.as_ref().map(|v| std::str::from_utf8(v));
        match (a_text.transpose(), b_text.transpose()) {
            (Ok(a), Ok(b)) => {
                let (a, b) = (a.unwrap_or(""), b.unwrap_or(""));
                if a == b && notes.is_empty() {
                    continue;
                }
                out.push_str(&format!("diff {}\n", c.path.as_str()));
                out.push_str(&notes);
                if a == b {
                    continue;
                }
                let d = similar::TextDiff::from_lines(a, b);
                out.push_str(
                    &d.unified_diff()
                        .context_radius(3)
                        .header(&a_name, &b_name)
                        .to_string(),
                );
                if !out.ends_with('\n') {
                    out.push('\n');
                }
            }
            _ => {
                out.push_str(&format!("diff {}\n", c.path.as_str()));
                out.push_str(&notes);
                out.push_str(&format!("Binary files {a_name} and {b_name} differ\n"));
            }
        }
    }
    Ok(out)
}

#[derive(clap::Args, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RevertArgs {
    /// The revision to undo
    #[arg(required_unless_present = "session", conflicts_with = "session")]
    pub rev: Option<String>,
    /// Undo everything this session did, as one commit
    #[arg(long, value_name = "ID")]
    pub session: Option<String>,
    /// Undo even when later changes touched the same files (they are lost
    /// from the current state, not from history)
    #[arg(long)]
    #[serde(default)]
    pub force: bool,
    /// Who is undoing (stored in the new commit)
    #[arg(long, env = "MEMVAULT_ACTOR", default_value = "operator")]
    #[serde(skip)]
    pub actor: String,
}

#[derive(clap::Args, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestoreArgs {
    /// The file or directory to put back
    pub path: String,
    /// The revision to take it from
    #[arg(long, value_name = "REV")]
    pub at: String,
    /// Restore even when that discards content written after REV (history keeps it)
    #[arg(long)]
    #[serde(default)]
    pub force: bool,
    /// Who is restoring (stored in the new commit)
    #[arg(long, env = "MEMVAULT_ACTOR", default_value = "operator")]
    #[serde(skip)]
    pub actor: String,
}

fn undoer(actor: &str) -> Result<Attribution, CliError> {
    super::operator_attribution(actor)
}

/// `memvault revert REV` / `memvault revert --session ID`.
pub fn revert(on: On<'_>, args: &RevertArgs, out: &mut dyn Write) -> Result<u8, CliError> {
    on.with(
        || undoer(&args.actor),
        |vault| {
            let target = match (&args.rev, &args.session) {
                (Some(rev), None) => UndoTarget::Commit(vault.resolve_rev(rev).map_err(not_a_rev)?),
                // Labels are stored through the secret filter: the filtered
                // form is what matches, and no secret is echoed back.
                (None, Some(s)) => UndoTarget::Session(super::redact_label(s)?),
                _ => return Err(usage("give a revision or --session ID")),
            };
            if let UndoTarget::Commit(c) = target
                && vault.parent_of(c)?.is_none()
            {
                return Err(CliError::failure(
                    "that is the vault's first commit (its creation); there is nothing to revert",
                ));
            }
            let what = match &target {
                UndoTarget::Commit(c) => format!("revision {}", c.short()),
                UndoTarget::Session(s) => format!("session {s}"),
                UndoTarget::Restore { .. } => unreachable!(),
            };
            finish_undo(vault, target, args.force, &what, Verbs::UNDO, out)
        },
    )
}

/// `memvault restore PATH --at REV`.
pub fn restore(on: On<'_>, args: &RestoreArgs, out: &mut dyn Write) -> Result<u8, CliError> {
    on.with(
        || undoer(&args.actor),
        |vault| {
            let path = parse_path(vault, &args.path)?;
            let at = vault.resolve_rev(&args.at).map_err(not_a_rev)?;
            // A path that is neither there now nor at that revision is a
            // mistake (a typo), not "nothing to undo".
            let tip = vault.tip()?;
            let exists = |vault: &mut Vault, rev: Option<Rev>| -> Result<bool, CliError> {
                let snap = vault.snapshot_at(rev)?;
                Ok(snap.kind(&path).map_err(store_err)?.is_some())
            };
            if !exists(vault, Some(at))? && !exists(vault, tip)? {
                return Err(CliError::failure(format!(
                    "there is no file or directory {} at revision {} nor now; nothing was changed (`memvault history DIR` lists what was there)",
                    path.as_str(),
                    at.short()
                )));
            }
            let what = format!("{} as at {}", path.as_str(), at.short());
            finish_undo(
                vault,
                UndoTarget::Restore { path, at },
                args.force,
                &what,
                Verbs::RESTORE,
                out,
            )
        },
    )
}

/// How an undo's outcome is said: done, nothing to do, refused.
struct Verbs {
    done: &'static str,
    nothing: &'static str,
    refused: &'static str,
}

impl Verbs {
    const UNDO: Verbs = Verbs {
        done: "undid",
        nothing: "nothing to undo for",
        refused: "refused to undo",
    };
    const RESTORE: Verbs = Verbs {
        done: "restored",
        nothing: "nothing to restore for",
        refused: "refused to restore",
    };
}

/// Run an undo (a revert or a restore) and say its outcome.
fn finish_undo(
    vault: &mut Vault,
    target: UndoTarget,
    force: bool,
    what: &str,
    verbs: Verbs,
    out: &mut dyn Write,
) -> Result<u8, CliError> {
    let outcome = vault.undo(target, force).map_err(|e| match e {
        VaultError::Refused(m) => CliError::failure(format!("nothing was changed: {m}")),
        other => other.into(),
    })?;
    match outcome {
        UndoOutcome::Done {
            commit,
            changed,
            skipped_erased,
            skipped_blocked,
            kept_in_place,
        } => {
            writeln!(
                out,
                "{} {what} as revision {} ({} file{} changed)",
                verbs.done,
                commit.short(),
                changed.len(),
                if changed.len() == 1 { "" } else { "s" }
            )?;
            for p in changed {
                writeln!(out, "  {}", p.as_str())?;
            }
            for p in skipped_erased {
                writeln!(out, "  skipped {}: that version was erased", p.as_str())?;
            }
            for p in skipped_blocked {
                writeln!(
                    out,
                    "  skipped {}: a file or directory now stands in its way",
                    p.as_str()
                )?;
            }
            for p in kept_in_place {
                writeln!(
                    out,
                    "  kept {} where it is: it cannot go back where it came from (a file or directory stands there, or that version was erased)",
                    p.as_str()
                )?;
            }
            out.flush()?;
            Ok(0)
        }
        // Nothing could be done because what it would bring back was
        // erased or cannot go back: a failure, said as such.
        UndoOutcome::Nothing {
            skipped_erased,
            skipped_blocked,
            kept_in_place,
        } if !skipped_erased.is_empty() || !skipped_blocked.is_empty() => {
            let list =
                |ps: &[MemoryPath]| ps.iter().map(|p| p.as_str()).collect::<Vec<_>>().join(", ");
            let mut msg = format!("nothing was undone for {what}:");
            if !skipped_erased.is_empty() {
                msg.push_str(&format!(
                    " the versions it would bring back were erased (their keys destroyed): {};",
                    list(&skipped_erased)
                ));
            }
            if !skipped_blocked.is_empty() {
                msg.push_str(&format!(
                    " a file or directory now stands where these would go back: {};",
                    list(&skipped_blocked)
                ));
            }
            if !kept_in_place.is_empty() {
                msg.push_str(&format!(
                    " kept where they are (they cannot go back where they came from): {};",
                    list(&kept_in_place)
                ));
            }
            msg.pop();
            Err(CliError::failure(msg))
        }
        UndoOutcome::Nothing { .. } => {
            writeln!(
                out,
                "{} {what}: the files are already as it would leave them",
                verbs.nothing
            )?;
            out.flush()?;
            Ok(0)
        }
        UndoOutcome::Refused {
            conflicts,
            blocked,
            kept_in_place,
        } => {
            let mut msg = format!("{} {what}; nothing was changed.", verbs.refused);
            if !conflicts.is_empty() {
                msg.push_str(
                    "\nLater changes touched the same files (give --force to undo anyway; history keeps them):",
                );
                for c in &conflicts {
                    let op = vault
                        .commit_meta(c.rev)
                        .map(|m| m.op)
                        .unwrap_or_else(|_| "?".into());
                    msg.push_str(&format!("\n  {} {op} {}", c.rev.short(), c.path.as_str()));
                }
            }
            if !blocked.is_empty() {
                msg.push_str(
                    "\nA file or directory now stands where these would go back (--force puts back the rest and leaves what stands there):",
                );
                for p in &blocked {
                    msg.push_str(&format!("\n  {}", p.as_str()));
                }
            }
            if !kept_in_place.is_empty() {
                msg.push_str(
                    "\nWith --force, these would stay where they are (they cannot go back where they came from):",
                );
                for p in &kept_in_place {
                    msg.push_str(&format!("\n  {}", p.as_str()));
                }
            }
            Err(CliError::failure(msg))
        }
    }
}

#[derive(clap::Args, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionsArgs {
    /// One JSON object per line
    #[arg(long)]
    #[serde(skip)]
    pub json: bool,
}

#[derive(Default)]
struct SessionAgg {
    actors: BTreeSet<String>,
    first: u64,
    last: u64,
    changes: usize,
    /// The session's commits' file moves and touches, newest first.
    steps: Vec<Step>,
}

/// What one commit did to files, for counting them.
enum Step {
    /// Files moved: (old path, new path) each.
    Moved(Vec<(String, String)>),
    /// Files written, edited or removed.
    Touched(Vec<String>),
}

impl Step {
    fn of(meta: &CommitMeta) -> Step {
        let files: Vec<String> = if meta.files.is_empty() {
            meta.path.iter().cloned().collect()
        } else {
            meta.files.clone()
        };
        if meta.op == "rename"
            && let (Some(from), Some(to)) = (&meta.path, &meta.new_path)
        {
            return Step::Moved(
                files
                    .into_iter()
                    .map(|f| {
                        let moved = match f.strip_prefix(from.as_str()) {
                            Some(rest) if rest.is_empty() || rest.starts_with('/') => {
                                format!("{to}{rest}")
                            }
                            _ => f.clone(),
                        };
                        (f, moved)
                    })
                    .collect(),
            );
        }
        Step::Touched(files)
    }
}

/// How many distinct files `steps` (newest first) touched: a file keeps
/// its identity across the renames among them, and a folder counts as the
/// files in it.
fn distinct_files(steps: &[Step]) -> usize {
    let mut at: BTreeMap<String, usize> = BTreeMap::new();
    let mut count = 0;
    let mut ident = |path: &str, at: &mut BTreeMap<String, usize>| -> usize {
        at.remove(path).unwrap_or_else(|| {
            count += 1;
            count
        })
    };
    for step in steps.iter().rev() {
        match step {
            Step::Moved(moves) => {
                let ids: Vec<(usize, &String)> = moves
                    .iter()
                    .map(|(old, new)| (ident(old, &mut at), new))
                    .collect();
                for (id, new) in ids {
                    at.insert(new.clone(), id);
                }
            }
            Step::Touched(files) => {
                for f in files {
                    let id = ident(f, &mut at);
                    at.insert(f.clone(), id);
                }
            }
        }
    }
    count
}

/// `memvault sessions`: one line per session, most recent first.
pub fn sessions(on: On<'_>, args: &SessionsArgs, out: &mut dyn Write) -> Result<u8, CliError> {
    on.with(
        || Ok(reader()),
        |vault| {
            let mut agg: BTreeMap<String, SessionAgg> = BTreeMap::new();
            for item in vault.walk()? {
                let (_, meta) = item?;
                let a = agg.entry(meta.session.clone()).or_default();
                if a.changes == 0 {
                    a.last = meta.time_ms;
                }
                a.first = meta.time_ms;
                a.changes += 1;
                a.actors.insert(meta.actor.clone());
                a.steps.push(Step::of(&meta));
            }
            let mut rows: Vec<(String, SessionAgg)> = agg.into_iter().collect();
            rows.sort_by(|a, b| b.1.last.cmp(&a.1.last).then(a.0.cmp(&b.0)));
            for (id, a) in rows {
                let actors: Vec<&str> = a.actors.iter().map(String::as_str).collect();
                let files = distinct_files(&a.steps);
                if args.json {
                    let line = json!({
                        "session": id, "actors": actors, "first": rfc3339(a.first),
                        "last": rfc3339(a.last), "changes": a.changes, "files": files,
                    });
                    writeln!(out, "{line}")?;
                } else {
                    writeln!(
                        out,
                        "{id}  {}  {}  {}  {} change{}  {} file{}",
                        actors.join(","),
                        rfc3339(a.first),
                        rfc3339(a.last),
                        a.changes,
                        if a.changes == 1 { "" } else { "s" },
                        files,
                        if files == 1 { "" } else { "s" }
                    )?;
                }
            }
            out.flush()?;
            Ok(0)
        },
    )
}

#[derive(clap::Args, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResumeArgs {
    /// The session to brief on [default: the most recent agent session]
    #[arg(long, value_name = "ID")]
    pub session: Option<String>,
}

/// `memvault resume`: print the briefing.
pub fn resume(on: On<'_>, args: &ResumeArgs, out: &mut dyn Write) -> Result<u8, CliError> {
    on.with(
        || Ok(reader()),
        |vault| {
            // Matched as stored: a session id holding a secret was stored
            // redacted (and is not echoed back raw).
            let session = args
                .session
                .as_deref()
                .map(super::redact_label)
                .transpose()?;
            let text = briefing(vault, session.as_deref())?;
            out.write_all(text.as_bytes())?;
            out.flush()?;
            Ok(0)
        },
    )
}

fn describe(meta: &CommitMeta) -> String {
    let p = meta.path.as_deref().unwrap_or("?");
    let lines = if meta.lines_added + meta.lines_removed > 0 {
        format!(", +{} -{} lines", meta.lines_added, meta.lines_removed)
    } else {
        String::new()
    };
    match meta.op.as_str() {
        "create" => format!("created {p}{lines}"),
        "overwrite" => format!("overwrote {p}{lines}"),
        "str_replace" => format!("edited {p} (replaced text{lines})"),
        "insert" => format!("edited {p} (inserted text{lines})"),
        "delete" => format!("deleted {p}"),
        "rename" => format!("renamed {p} to {}", meta.new_path.as_deref().unwrap_or("?")),
        "revert" => format!("reverted changes to {}", meta.files.join(", ")),
        "restore" => format!("restored {p} from an earlier revision"),
        // What an operator or memvault itself did in a session of that
        // name (a briefing of `--session` names any session).
        "init" => "created the vault".to_string(),
        "import" => format!("imported {}", files_named(&meta.files)),
        "expire" => format!("expired {}", files_named(&meta.files)),
        "purge" => format!("purged {p} from all of history"),
        "erase" => "finished an interrupted erasure".to_string(),
        "config" => "changed the vault's settings".to_string(),
        "merge" => "merged another machine's changes".to_string(),
        "migrate" => "migrated the vault to a newer format".to_string(),
        other => format!("{other} {p}"),
    }
}

/// `a, b, c and N more` (or `no file`).
fn files_named(files: &[String]) -> String {
    const SHOWN: usize = 3;
    match files.len() {
        0 => "no file".to_string(),
        n if n <= SHOWN => files.join(", "),
        n => format!("{} and {} more", files[..SHOWN].join(", "), n - SHOWN),
    }
}

/// The briefing text for the next session: what the last agent session
/// (or the one named) changed, newest first, then the directory listing.
pub fn briefing(vault: &mut Vault, session: Option<&str>) -> Result<String, CliError> {
    let mut chosen: Option<String> = session.map(str::to_string);
    let mut entries: Vec<CommitMeta> = Vec::new();
    // What later reverts undid (the walk is newest first: an undo comes
    // before what it undoes): said beside each such change. A revert that a
    // later revert undid counts for nothing; a session's revert counts for
    // the changes whose files it changed (it skips what others changed
    // since, and what was erased).
    // Each undone revision, and each session undone by a revert that
    // names no revisions, with the files those reverts changed.
    let mut undone_revs: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut undone_sessions: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut undone: Vec<bool> = Vec::new();
    // The files later restores changed (a restore puts files back as they
    // were at a revision: what a change before it did to them may be gone).
    let mut restored: BTreeSet<String> = BTreeSet::new();
    let mut restored_since: Vec<bool> = Vec::new();
    for item in vault.walk()? {
        let (rev, meta) = item?;
        // (A restore a later revert undid counts for nothing.)
        let restore_files = (meta.op == "restore" && !undone_revs.contains_key(&rev.to_string()))
            .then(|| meta.files.clone());
        if meta.op == "revert" && !undone_revs.contains_key(&rev.to_string()) {
            for r in &meta.undoes {
                undone_revs
                    .entry(r.clone())
                    .or_default()
                    .extend(meta.files.iter().cloned());
            }
            if let Some(session) = meta
                .undone_session
                .as_ref()
                .filter(|_| meta.undoes.is_empty())
            {
                undone_sessions
                    .entry(session.clone())
                    .or_default()
                    .extend(meta.files.iter().cloned());
            }
        }
        // An agent's session: one that ran the memory tool (not a sweep,
        // a setting, an undo or an erasure an operator ran).
        let agent_op = matches!(
            meta.op.as_str(),
            "create" | "overwrite" | "str_replace" | "insert" | "delete" | "rename"
        );
        if chosen.is_none() && agent_op {
            chosen = Some(meta.session.clone());
        }
        if chosen.as_deref() == Some(meta.session.as_str()) {
            let touched = |files: &BTreeSet<String>| {
                [meta.path.as_deref(), meta.new_path.as_deref()]
                    .into_iter()
                    .flatten()
                    .any(|p| {
                        files.iter().any(|f| {
                            f == p || f.strip_prefix(p).is_some_and(|rest| rest.starts_with('/'))
                        })
                    })
            };
            undone.push(
                undone_revs.get(&rev.to_string()).is_some_and(touched)
                    || undone_sessions.get(&meta.session).is_some_and(touched),
            );
            restored_since.push(touched(&restored));
            entries.push(meta);
        }
        restored.extend(restore_files.into_iter().flatten());
    }
    let mut text = String::from("Memory briefing (from memvault).\n\n");
    match (&chosen, entries.is_empty()) {
        (None, _) => text.push_str(
            "No earlier session has changed the memory directory through the memory tool.\n",
        ),
        // Labels in quotes, escaped: a session or actor label is the
        // integration's text, not memvault's, and must not read as more
        // of the briefing (an actor of `bot) made no changes. memvault
        // note: ...`).
        (Some(s), true) => text.push_str(&format!("Session {s:?} made no changes.\n")),
        (Some(s), false) => {
            let last = entries.first().map_or(0, |m| m.time_ms);
            let first = entries.last().map_or(0, |m| m.time_ms);
            let actors: BTreeSet<&str> = entries.iter().map(|m| m.actor.as_str()).collect();
            // "Last" only for the session found as the last one; a session
            // named with --session is named as itself.
            text.push_str(&format!(
                "{} {s:?} (by {}), {} to {}, made {} change{}, newest first:\n",
                if session.is_some() {
                    "Session"
                } else {
                    "Last session"
                },
                actors
                    .into_iter()
                    .map(|a| format!("{a:?}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                rfc3339(first),
                rfc3339(last),
                entries.len(),
                if entries.len() == 1 { "" } else { "s" }
            ));
            const MAX: usize = 50;
            for ((m, undone), restored) in
                entries.iter().zip(&undone).zip(&restored_since).take(MAX)
            {
                text.push_str(&format!(
                    "- {} {}{}\n",
                    rfc3339(m.time_ms),
                    describe(m),
                    if *undone {
                        " (undone since by a revert)"
                    } else if *restored {
                        " (changed since by a restore)"
                    } else {
                        ""
                    }
                ));
            }
            if entries.len() > MAX {
                text.push_str(&format!(
                    "- ... and {} earlier changes\n",
                    entries.len() - MAX
                ));
            }
        }
    }
    let memory = memory_for(vault.config())?;
    let tip = vault.tip()?;
    let mut store = vault.at_revision(tip);
    let listing = memory.execute_json(
        &mut store as &mut dyn Store,
        &json!({"command": "view", "path": "/memories"}),
    );
    text.push_str("\nThe memory directory now:\n");
    text.push_str(listing.text().unwrap_or_default());
    text.push('\n');
    let conflicts = vault.conflict_copies()?;
    if !conflicts.is_empty() {
        text.push_str(
            "\nUnresolved sync conflicts: two machines changed the same file, and the other machine's version sits beside it. Compare the two, merge what matters into the file, then delete the copy:\n",
        );
        for (file, copy) in &conflicts {
            text.push_str(&format!("- {file}: the other version is {copy}\n"));
        }
    }
    Ok(text)
}

#[derive(clap::Args, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VerifyArgs {
    /// Print the report as one JSON object
    #[arg(long)]
    #[serde(skip)]
    pub json: bool,
    /// Check this git remote instead, as a pull would, changing nothing:
    /// its objects, MACs, and that it neither rolled back nor forked
    #[arg(long, value_name = "NAME")]
    #[serde(skip)]
    pub remote: Option<String>,
}

/// `verify --remote NAME`: the remote checked as a pull would check it.
fn verify_remote(
    vault: &mut Vault,
    name: &str,
    json: bool,
    out: &mut dyn Write,
) -> Result<u8, CliError> {
    let state = match vault.verify_remote(name) {
        Ok(s) => s,
        Err(crate::vault::VaultError::Sync(e))
            if !matches!(
                *e,
                crate::vault::SyncError::NoSuchRemote(_)
                    | crate::vault::SyncError::Transport { .. }
                    | crate::vault::SyncError::NoGit
            ) =>
        {
            // Said by the command that found it: not sent to run itself.
            let problem = e
                .to_string()
                .replace(&format!("run `memvault verify --remote {name}`; "), "");
            if json {
                writeln!(
                    out,
                    "{}",
                    json!({"ok": false, "remote": name, "problem": problem})
                )?;
            } else {
                writeln!(out, "PROBLEM  {problem}")?;
            }
            return Ok(1);
        }
        Err(e) => return Err(e.into()),
    };
    if json {
        let mut v = serde_json::to_value(&state)
            .map_err(|_| CliError::failure("the report does not serialise"))?;
        v["ok"] = json!(true);
        writeln!(out, "{v}")?;
    } else if state.empty {
        writeln!(out, "ok: remote {name} holds no vault yet")?;
    } else {
        writeln!(
            out,
            "ok: remote {name} checks out (main {}, key state {}): {} commit(s) this vault has not merged, {} it lacks; nothing rolled back or forked",
            state.main.as_deref().map_or("-", |m| &m[..12]),
            state.key_counter,
            state.new_commits,
            state.behind
        )?;
    }
    Ok(0)
}

/// `memvault verify`: exit 0 only when all is well.
pub fn verify(on: On<'_>, args: &VerifyArgs, out: &mut dyn Write) -> Result<u8, CliError> {
    let mut opened;
    let vault: &mut Vault = match on {
        On::Open(vault) => vault,
        On::Cli(global) => match open_vault(global, reader()) {
            Ok(v) => {
                opened = v;
                &mut opened
            }
            Err(mut e) if e.message.contains("damaged") => {
                // This is the command the hint would send them to.
                e.message = e
                    .message
                    .replace(super::VERIFY_HINT, " (nothing was changed)");
                if args.json {
                    let line = json!({"ok": false, "problems": [{"rev": null, "path": null, "what": e.message}]});
                    writeln!(out, "{line}")?;
                } else {
                    writeln!(out, "PROBLEM  {}", e.message)?;
                    writeln!(out, "1 problem found")?;
                }
                out.flush()?;
                return Ok(1);
            }
            Err(e) => return Err(e),
        },
    };
    if let Some(name) = &args.remote {
        return verify_remote(vault, name, args.json, out);
    }
    let report = vault.verify().map_err(|e| {
        let mut e = CliError::from(e);
        e.message = e
            .message
            .replace(super::VERIFY_HINT, " (nothing was changed)");
        e
    })?;
    if args.json {
        let mut v = serde_json::to_value(&report)
            .map_err(|_| CliError::failure("the report does not serialise"))?;
        v["ok"] = json!(report.ok());
        writeln!(out, "{v}")?;
    } else {
        for p in &report.problems {
            writeln!(
                out,
                "PROBLEM  {}  {}  {}",
                p.rev.as_deref().map_or("-", |r| &r[..12]),
                p.path.as_deref().unwrap_or("-"),
                p.what
            )?;
        }
        if report.ok() {
            writeln!(
                out,
                "ok: {} commits, {} file versions checked, {} erased on purpose",
                report.commits, report.files_checked, report.erased_versions
            )?;
        } else {
            writeln!(
                out,
                "{} problem{} found in {} commits",
                report.problems.len(),
                if report.problems.len() == 1 { "" } else { "s" },
                report.commits
            )?;
        }
        for note in &report.notes {
            writeln!(out, "note: {note}")?;
        }
    }
    out.flush()?;
    Ok(if report.ok() { 0 } else { 1 })
}
