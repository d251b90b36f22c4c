//! `memvault config get|set`: the vault's settings, which live in the key
//! state (sealed and MAC'd with the vault key, so nobody without the key
//! can weaken them), changed only here, each change a `config` commit on
//! main that history shows.

use std::io::Write;

use serde_json::Value;

use super::{CliError, Global, new_session_id, open_vault};
use crate::redact::Redactor;
use crate::vault::{Attribution, VaultConfig};

#[derive(clap::Subcommand, Debug)]
pub enum ConfigCommand {
    /// Print the settings as JSON, or one setting's value (KEY: a name such
    /// as `max_files`, or a dotted path such as `redaction.mode`)
    Get { key: Option<String> },
    /// Change one setting: VALUE is JSON (`true`, `20000`, `"reject"`,
    /// `["rule-id"]`), or a plain word taken as a string (`reject`)
    Set {
        key: String,
        value: String,
        /// Who is changing it (stored in the commit)
        #[arg(long, env = "MEMVAULT_ACTOR", default_value = "operator")]
        actor: String,
    },
}

fn usage(message: impl Into<String>) -> CliError {
    CliError {
        message: message.into(),
        code: 2,
    }
}

/// The JSON pointer of a dotted key, refused unless it names a setting.
fn pointer(current: &Value, key: &str) -> Result<String, CliError> {
    let ptr = format!("/{}", key.replace('.', "/"));
    if key.is_empty() || current.pointer(&ptr).is_none() {
        let names: Vec<&String> = current
            .as_object()
            .map(|o| o.keys().collect())
            .unwrap_or_default();
        return Err(usage(format!(
            "{key:?} is not a vault setting; the settings are {} (and redaction.mode, redaction.custom_rules, redaction.disabled)",
            names
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    Ok(ptr)
}

pub fn run(
    global: &Global,
    cmd: &ConfigCommand,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<u8, CliError> {
    match cmd {
        ConfigCommand::Get { key } => get(global, key.as_deref(), out),
        ConfigCommand::Set { key, value, actor } => set(global, key, value, actor, err),
    }
}

fn as_json(config: &VaultConfig) -> Value {
    serde_json::to_value(config).expect("settings serialise")
}

fn get(global: &Global, key: Option<&str>, out: &mut dyn Write) -> Result<u8, CliError> {
    let who = Attribution {
        session: new_session_id(),
        actor: "operator".into(),
    };
    let vault = open_vault(global, who)?;
    let all = as_json(vault.config());
    let shown = match key {
        None => all,
        Some(k) => all
            .pointer(&pointer(&all, k)?)
            .cloned()
            .unwrap_or(Value::Null),
    };
    let text = serde_json::to_string_pretty(&shown).expect("JSON serialises");
    writeln!(out, "{text}")?;
    out.flush()?;
    Ok(0)
}

fn set(
    global: &Global,
    key: &str,
    value: &str,
    actor: &str,
    err: &mut dyn Write,
) -> Result<u8, CliError> {
    let who = super::operator_attribution(actor)?;
    let mut vault = open_vault(global, who)?;
    let ptr = pointer(&as_json(vault.config()), key)?;
    let parsed: Value =
        serde_json::from_str(value).unwrap_or_else(|_| Value::String(value.to_string()));
    // Made from the settings as they are under the writer lock, so a
    // change another process made meanwhile (another setting) is kept.
    let mut shown_change = None;
    let changed = vault.update_config(|current| -> Result<_, CliError> {
        let mut all = as_json(current);
        let Some(slot) = all.pointer_mut(&ptr) else {
            return Err(CliError::failure(format!(
                "setting {key} refused: it is no longer there (another process changed the settings meanwhile); nothing was changed"
            )));
        };
        *slot = parsed;
        let config: VaultConfig = serde_json::from_value(all).map_err(|e| {
            CliError::failure(format!("setting {key} refused: {e}; nothing was changed"))
        })?;
        config.validate_change().map_err(|e| {
            CliError::failure(format!("setting {key} refused: {e}; nothing was changed"))
        })?;
        // The filter must build with the new rules (custom regexes, ids).
        let new_filter = Redactor::new(&config.redaction).map_err(|e| {
            CliError::failure(format!("setting {key} refused: {e}; nothing was changed"))
        })?;
        if &config == current {
            return Ok(None);
        }
        // History says what changed, from what to what: custom rules'
        // regexes left out (below), the rest through the built-in filter
        // and the vault's own rules before and after the change (a token
        // a custom rule was written for, anywhere else in the value),
        // then cut if long (a rule list).
        let old_filter = Redactor::new(&current.redaction).ok();
        let shown = |v: &Value| -> Result<String, CliError> {
            // A custom rule's regex is not recorded (only its length): it
            // may be a leaked token written with escapes (`\.`, `\+`),
            // which no filter finds in the regex's own text.
            let text = v.pointer(&ptr).map_or("null".to_string(), |v| {
                let mut v = v.clone();
                hide_regexes(&mut v);
                v.to_string()
            });
            let (mut text, _) = super::redacted_label(&text)?;
            for filter in std::iter::once(&new_filter).chain(old_filter.as_ref()) {
                text = filter.redact(&text).text;
            }
            Ok(if text.chars().count() > 200 {
                text.chars().take(200).collect::<String>() + "…"
            } else {
                text
            })
        };
        let before = shown(&as_json(current))?;
        let after = shown(&as_json(&config))?;
        let details = vec![format!("setting {key}: {before} -> {after}")];
        shown_change = Some((before, after));
        Ok(Some((config, details)))
    })?;
    let Some((before, after)) = shown_change.filter(|_| changed) else {
        writeln!(
            err,
            "memvault: {key} already has that value; nothing was changed"
        )?;
        return Ok(0);
    };
    writeln!(
        err,
        "memvault: set {key} from {before} to {after} (a `config` commit in history); running `serve`/`mcp`/`server` processes use it from their next request{}",
        if key == "max_line_bytes" {
            " (an `mcp` process keeps its request size limit until it restarts)"
        } else {
            ""
        }
    )?;
    Ok(0)
}

/// Each `"regex"` string in a settings value, replaced by its length.
fn hide_regexes(v: &mut Value) {
    match v {
        Value::Object(map) => {
            for (k, item) in map.iter_mut() {
                match item {
                    Value::String(r) if k == "regex" => {
                        *item = Value::String(format!(
                            "(a regex of {} characters, not recorded)",
                            r.chars().count()
                        ));
                    }
                    other => hide_regexes(other),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(hide_regexes),
        _ => {}
    }
}
