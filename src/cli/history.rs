//! `memvault history`: the audit log, newest first, decrypted.
//!
//! This first version lists every change with its revision, time, session,
//! actor, operation, path(s), size, line counts and redaction kinds, with
//! filters on path (exact or below), session, actor and operation, a limit,
//! and `--json` (one object per line). Following a path across renames and
//! time filters come with the audit issue.

use std::io::Write;

use serde_json::json;

use super::{CliError, Global, open_vault};
use crate::vault::{Attribution, CommitMeta};

/// Filters of `memvault history`.
#[derive(clap::Args, Debug)]
pub struct HistoryArgs {
    /// Only changes to this path or below it
    pub path: Option<String>,
    /// Only changes made in this session
    #[arg(long)]
    pub session: Option<String>,
    /// Only changes made by this actor
    #[arg(long)]
    pub actor: Option<String>,
    /// Only this operation (create, overwrite, str_replace, insert, delete, rename, init)
    #[arg(long)]
    pub op: Option<String>,
    /// At most this many lines
    #[arg(long)]
    pub limit: Option<usize>,
    /// One JSON object per line
    #[arg(long)]
    pub json: bool,
}

fn touches(meta: &CommitMeta, path: &str) -> bool {
    let under = |p: &str| p == path || p.strip_prefix(path).is_some_and(|r| r.starts_with('/'));
    meta.path.as_deref().is_some_and(under)
        || meta.new_path.as_deref().is_some_and(under)
        || meta.files.iter().any(|f| under(f))
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

pub fn run(global: &Global, args: &HistoryArgs) -> Result<u8, CliError> {
    let who = Attribution {
        session: "history".into(),
        actor: "memvault".into(),
    };
    let mut vault = open_vault(global, who)?;
    let path = match &args.path {
        Some(p) => Some(
            crate::memory::MemoryPath::parse(p)
                .map_err(|e| CliError {
                    message: e.to_string(),
                    code: 2,
                })?
                .as_str()
                .to_string(),
        ),
        None => None,
    };
    let mut out = std::io::stdout().lock();
    let mut shown = 0usize;
    for (id, meta) in vault.log()? {
        if args.limit.is_some_and(|l| shown >= l) {
            break;
        }
        if path.as_deref().is_some_and(|p| !touches(&meta, p))
            || args.session.as_deref().is_some_and(|s| s != meta.session)
            || args.actor.as_deref().is_some_and(|a| a != meta.actor)
            || args.op.as_deref().is_some_and(|o| o != meta.op)
        {
            continue;
        }
        shown += 1;
        let rev = id.to_string();
        if args.json {
            let line = json!({
                "rev": rev, "time": rfc3339(meta.time_ms), "session": meta.session,
                "actor": meta.actor, "op": meta.op, "path": meta.path, "new_path": meta.new_path,
                "size": meta.size, "lines_added": meta.lines_added, "lines_removed": meta.lines_removed,
                "redactions": meta.redactions.iter().map(|(k, n)| json!({"kind": k, "count": n})).collect::<Vec<_>>(),
            });
            writeln!(out, "{line}")?;
            continue;
        }
        let mut line = format!(
            "{}  {}  {}  {}  {}",
            &rev[..12],
            rfc3339(meta.time_ms),
            meta.session,
            meta.actor,
            meta.op
        );
        if let Some(p) = &meta.path {
            line.push_str(&format!("  {p}"));
        }
        if let Some(n) = &meta.new_path {
            line.push_str(&format!(" -> {n}"));
        }
        if let Some(s) = meta.size {
            line.push_str(&format!("  {s}B"));
        }
        if meta.lines_added + meta.lines_removed > 0 {
            line.push_str(&format!("  +{} -{}", meta.lines_added, meta.lines_removed));
        }
        if !meta.redactions.is_empty() {
            let kinds: Vec<String> = meta
                .redactions
                .iter()
                .map(|(k, n)| format!("{k} x{n}"))
                .collect();
            line.push_str(&format!("  redacted: {}", kinds.join(", ")));
        }
        writeln!(out, "{line}")?;
    }
    out.flush()?;
    Ok(0)
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
}
