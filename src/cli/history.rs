//! `memvault history`: the audit log, newest first, decrypted.
//!
//! One line per change: revision, time, session, actor, operation, path(s),
//! size, line counts, redaction kinds, and what an undo undid. Filters on
//! path (exact or below, followed back across renames), session, actor,
//! operation (or a group: `edit`, `undo`), time (`--since`, `--until`), a
//! limit, and `--json` (one object per line). History is read lazily, so
//! the first lines come without walking all of it.

use std::io::Write;

use serde_json::json;

use super::{CliError, On};
use crate::vault::{Attribution, CommitMeta};

/// Filters of `memvault history`.
#[derive(clap::Args, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistoryArgs {
    /// Only changes to this path or below it
    pub path: Option<String>,
    /// Only changes made in this session
    #[arg(long)]
    pub session: Option<String>,
    /// Only changes made by this actor
    #[arg(long)]
    pub actor: Option<String>,
    /// Only changes made with this `memvault server` token (its name)
    #[arg(long)]
    pub principal: Option<String>,
    /// Only this operation: create, overwrite, str_replace, insert, delete,
    /// rename, revert, restore, expire, purge, erase, config, import,
    /// merge, migrate, init, keyslot, passwd, rekey; or a group: edit
    /// (overwrite, str_replace, insert), undo (revert, restore)
    #[arg(long)]
    pub op: Option<String>,
    /// Only changes at or after this time: 2026-11-30, 2026-11-30T12:00:00Z,
    /// or an age such as 90m, 12h, 7d
    #[arg(long, value_name = "TIME")]
    pub since: Option<String>,
    /// Only changes at or before this time (same forms as --since)
    #[arg(long, value_name = "TIME")]
    pub until: Option<String>,
    /// At most this many lines
    #[arg(long)]
    pub limit: Option<usize>,
    /// One JSON object per line
    #[arg(long)]
    #[serde(skip)]
    pub json: bool,
}

fn under(p: &str, path: &str) -> bool {
    p == path || p.strip_prefix(path).is_some_and(|r| r.starts_with('/'))
}

/// Where a change moved a file or folder from and to: a rename, or the
/// revert of one, which moved it back (a revert keeps the paths of the
/// change it undoes).
fn moved(meta: &CommitMeta) -> Option<(&str, &str)> {
    match (meta.op.as_str(), &meta.path, &meta.new_path) {
        ("rename", Some(from), Some(to)) => Some((from, to)),
        ("revert", Some(to), Some(from)) => Some((from, to)),
        _ => None,
    }
}

/// Whether a change touched `path` or anything below it: its own path or
/// destination there, a file it changed there, or a file a folder's
/// rename moved there. A folder's rename or deletion touches the files it
/// moved or removed, not a path below the folder that held no file then
/// (a record without its file list, from an older memvault, is taken to
/// touch everything below its paths).
fn touches(meta: &CommitMeta, path: &str) -> bool {
    let at = |p: &str| under(p, path);
    if meta.path.as_deref().is_some_and(at)
        || meta.new_path.as_deref().is_some_and(at)
        || meta.files.iter().any(|f| at(f))
    {
        return true;
    }
    if let Some((from, to)) = moved(meta)
        && meta.files.iter().any(|f| {
            f.strip_prefix(from)
                .is_some_and(|rest| at(&format!("{to}{rest}")))
        })
    {
        return true;
    }
    meta.files.is_empty()
        && [&meta.path, &meta.new_path]
            .into_iter()
            .flatten()
            .any(|p| under(path, p))
}

/// The operations a commit records (what `--op` takes, besides the
/// groups `edit` and `undo`).
const OPS: [&str; 19] = [
    "create",
    "overwrite",
    "str_replace",
    "insert",
    "delete",
    "rename",
    "revert",
    "restore",
    "expire",
    "purge",
    "erase",
    "config",
    "import",
    "merge",
    "migrate",
    "init",
    "keyslot",
    "passwd",
    "rekey",
];

/// Whether an operation matches `--op` (a name or a group).
pub fn op_matches(filter: &str, op: &str) -> bool {
    match filter {
        "edit" => matches!(op, "overwrite" | "str_replace" | "insert"),
        "undo" => matches!(op, "revert" | "restore"),
        f => f == op,
    }
}

/// Milliseconds since the epoch for `2026-11-30`, `2026-11-30T12:00:00Z`
/// or an age (`90s`, `90m`, `12h`, `7d`) before `now_ms`.
pub fn parse_time(s: &str, now_ms: u64) -> Option<u64> {
    let s = s.trim();
    if let Some(unit) = s.chars().last().filter(|c| "smhdw".contains(*c)) {
        let n: u64 = s[..s.len() - 1].parse().ok()?;
        let secs = match unit {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86_400,
            _ => 604_800,
        };
        return Some(now_ms.saturating_sub(n.checked_mul(secs * 1000)?));
    }
    let (date, time) = match s.split_once('T') {
        Some((d, t)) => (d, Some(t.strip_suffix('Z')?)),
        None => (s, None),
    };
    let mut d = date.splitn(3, '-').map(|x| x.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let leap = y % 4 == 0 && (y % 100 != 0 || y % 400 == 0);
    let days_in_month = match m {
        2 if leap => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    };
    if !(1..=12).contains(&m) || !(1..=days_in_month).contains(&day) || !(1970..=9999).contains(&y)
    {
        return None;
    }
    let secs_of_day = match time {
        None => 0,
        Some(t) => {
            let mut p = t.splitn(3, ':').map(|x| x.parse::<i64>().ok());
            let (h, mi, se) = (p.next()??, p.next()??, p.next().unwrap_or(Some(0))?);
            if !(0..24).contains(&h) || !(0..60).contains(&mi) || !(0..61).contains(&se) {
                return None;
            }
            h * 3600 + mi * 60 + se
        }
    };
    // Days from civil (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    u64::try_from(days * 86_400 + secs_of_day)
        .ok()
        .map(|s| s * 1000)
}

/// `YYYY-MM-DDTHH:MM:SSZ` for milliseconds since the epoch (UTC).
pub fn rfc3339(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

pub fn run(on: On<'_>, args: &HistoryArgs, out: &mut dyn Write) -> Result<u8, CliError> {
    let who = Attribution {
        session: "history".into(),
        actor: "memvault".into(),
    };
    on.with(|| Ok(who), |vault| {
    let path = match &args.path {
        Some(p) => Some(
            super::stored_path(
                vault,
                crate::memory::MemoryPath::parse_stored(p).map_err(|e| CliError {
                    message: e.to_string(),
                    code: 2,
                })?,
            )?
            .as_str()
            .to_string(),
        ),
        None => None,
    };
    if let Some(op) = args.op.as_deref()
        && !OPS.contains(&op)
        && !matches!(op, "edit" | "undo")
    {
        return Err(CliError {
            message: format!(
                "--op {op:?} names no operation: give one of {}, or edit (overwrite, str_replace, insert) or undo (revert, restore)",
                OPS.join(", ")
            ),
            code: 2,
        });
    }
    // Labels are stored through the secret filter: compare that form.
    let session = args
        .session
        .as_deref()
        .map(super::redact_label)
        .transpose()?;
    let actor = args.actor.as_deref().map(super::redact_label).transpose()?;
    let now = crate::vault::now_ms();
    let time = |t: &Option<String>| -> Result<Option<u64>, CliError> {
        t.as_deref()
            .map(|s| {
                parse_time(s, now).ok_or_else(|| CliError {
                    message: format!(
                        "{s:?} is not a time: give a date from 1970-01-01 to 9999-12-31 (2026-11-30, 2026-11-30T12:00:00Z) or an age like 7d"
                    ),
                    code: 2,
                })
            })
            .transpose()
    };
    let since = time(&args.since)?;
    let until = time(&args.until)?.map(|u| {
        // A bare date means the whole day.
        if args.until.as_deref().is_some_and(|s| s.len() == 10) {
            u + 86_399_999
        } else {
            u
        }
    });
    // The names the path had, followed back across renames.
    let mut names: Vec<String> = path.into_iter().collect();
    let filtering_path = !names.is_empty();
    let mut shown = 0usize;
    for item in vault.walk()? {
        let (id, meta) = item?;
        if args.limit.is_some_and(|l| shown >= l) {
            break;
        }
        if since.is_some_and(|s| meta.time_ms < s) {
            // Main is in commit order; times can only go back so far
            // (clock changes), so keep walking rather than stop.
            continue;
        }
        let hit = names.iter().any(|p| touches(&meta, p));
        if hit && let Some((from, to)) = moved(&meta) {
            let earlier: Vec<String> = names
                .iter()
                .filter(|n| under(n, to))
                .map(|n| format!("{from}{}", &n[to.len()..]))
                .collect();
            for e in earlier {
                if !names.contains(&e) {
                    names.push(e);
                }
            }
        }
        if (filtering_path && !hit)
            || until.is_some_and(|u| meta.time_ms > u)
            || session.as_deref().is_some_and(|s| s != meta.session)
            || actor.as_deref().is_some_and(|a| a != meta.actor)
            || args
                .principal
                .as_deref()
                .is_some_and(|p| Some(p) != meta.principal.as_deref())
            || args.op.as_deref().is_some_and(|o| !op_matches(o, &meta.op))
        {
            continue;
        }
        shown += 1;
        let rev = id.to_string();
        if args.json {
            // Where it moved a file or folder from and to (a rename, or a
            // revert that moved one back), whatever `path` and `new_path`
            // hold (a revert keeps those of the change it undid).
            let (moved_from, moved_to) = moved(&meta).unzip();
            let line = json!({
                "rev": rev, "time": rfc3339(meta.time_ms), "session": meta.session,
                "actor": meta.actor, "principal": meta.principal, "op": meta.op, "path": meta.path, "new_path": meta.new_path,
                "size": meta.size, "lines_added": meta.lines_added, "lines_removed": meta.lines_removed,
                "redactions": meta.redactions.iter().map(|(k, n)| json!({"kind": k, "count": n})).collect::<Vec<_>>(),
                "files": meta.files, "undoes": meta.undoes, "undone_session": meta.undone_session,
                "at": meta.at, "details": meta.details, "machine": meta.machine,
                "merged": meta.merged, "moved_from": moved_from, "moved_to": moved_to,
            });
            writeln!(out, "{line}")?;
            continue;
        }
        let mut line = format!(
            "{}  {}  {}  {}  {}",
            id.short(),
            rfc3339(meta.time_ms),
            meta.session,
            meta.actor,
            meta.op
        );
        if let Some((from, to)) = moved(&meta) {
            line.push_str(&format!("  {from} -> {to}"));
        } else if let Some(p) = &meta.path {
            line.push_str(&format!("  {p}"));
        } else if !meta.files.is_empty() && meta.op != "merge" {
            // An import or a sweep names no one path: its files (the
            // first few, and how many in all).
            const SHOWN: usize = 5;
            let first: Vec<&str> = meta.files.iter().take(SHOWN).map(String::as_str).collect();
            line.push_str(&format!("  {}", first.join(", ")));
            if meta.files.len() > SHOWN {
                line.push_str(&format!(" and {} more", meta.files.len() - SHOWN));
            }
        }
        if let (Some(n), None) = (&meta.new_path, moved(&meta)) {
            line.push_str(&format!(" -> {n}"));
        }
        if let Some(s) = meta.size {
            line.push_str(&format!("  {s}B"));
        }
        if meta.lines_added + meta.lines_removed > 0 {
            line.push_str(&format!("  +{} -{}", meta.lines_added, meta.lines_removed));
        }
        if let Some(s) = &meta.undone_session {
            line.push_str(&format!("  undoes session {s}"));
        } else if !meta.undoes.is_empty() {
            let revs: Vec<&str> = meta.undoes.iter().map(|r| &r[..r.len().min(12)]).collect();
            line.push_str(&format!("  undoes {}", revs.join(",")));
        }
        if let Some(at) = &meta.at {
            line.push_str(&format!("  as at {}", &at[..at.len().min(12)]));
        }
        if !meta.details.is_empty() {
            line.push_str(&format!("  {}", meta.details.join("; ")));
        }
        if let Some(m) = &meta.machine {
            line.push_str(&format!("  on {m}"));
        }
        if !meta.redactions.is_empty() {
            let kinds: Vec<String> = meta
                .redactions
                .iter()
                .map(|(k, n)| format!("{k} x{n}"))
                .collect();
            line.push_str(&format!("  redacted: {}", kinds.join(", ")));
        }
        if let Some(p) = &meta.principal {
            line.push_str(&format!("  principal: {p}"));
        }
        writeln!(out, "{line}")?;
    }
    out.flush()?;
    Ok(0)
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn rfc3339_formats_known_instants() {
        assert_eq!(super::rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(super::rfc3339(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(
            super::rfc3339(1_796_083_200_000 + 3_661_000),
            "2026-12-01T01:01:01Z"
        );
    }

    #[test]
    fn parse_time_round_trips_and_refuses_nonsense() {
        let now = 1_796_083_200_000;
        assert_eq!(super::parse_time("2026-12-01", now), Some(now));
        assert_eq!(
            super::parse_time("2026-12-01T01:01:01Z", now),
            Some(now + 3_661_000)
        );
        assert_eq!(super::parse_time("2000-02-29", 0), Some(951_782_400_000));
        assert_eq!(super::parse_time("7d", now), Some(now - 7 * 86_400_000));
        assert_eq!(super::parse_time("90m", now), Some(now - 90 * 60_000));
        for bad in [
            "",
            "yesterday",
            "2026-13-01",
            "2026-12-01T25:00:00Z",
            "d",
            "1.5h",
        ] {
            assert_eq!(super::parse_time(bad, now), None, "{bad}");
        }
    }

    #[test]
    fn op_groups() {
        assert!(super::op_matches("edit", "insert"));
        assert!(super::op_matches("edit", "str_replace"));
        assert!(!super::op_matches("edit", "create"));
        assert!(super::op_matches("undo", "restore"));
        assert!(super::op_matches("delete", "delete"));
    }
}
