//! The filter's settings (part of the vault settings) and its errors.
//!
//! Error policy: a bad setting is refused when the filter is built, never
//! replaced by a default, and the message names the setting and says how
//! to fix it. No error ever carries text that was scanned: a refused write
//! names the kinds of secret found and how many, not the secrets.

use serde::{Deserialize, Serialize};

/// What the filter does with a write that holds secrets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Replace each secret with `[REDACTED:<rule-id>]` and store the rest.
    #[default]
    Redact,
    /// Refuse the write with [`RedactError::Rejected`]; nothing is stored.
    Reject,
    /// Store text as given.
    Off,
}

/// A rule added in the settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CustomRule {
    /// Lowercase kebab-case id, used in markers (`[REDACTED:<id>]`); must
    /// not repeat a built-in or another custom id.
    pub id: String,
    /// A Rust `regex` pattern (linear time). If it has a group named
    /// `secret`, only that group is redacted; otherwise the whole match.
    /// It may not match the empty string.
    pub regex: String,
    /// Literal keywords, matched ASCII case-insensitively. When given, the
    /// regex only runs on lines holding one of them (a match must lie
    /// within such a line); when empty, it runs on the whole text.
    #[serde(default)]
    pub keywords: Vec<String>,
}

/// The filter's settings.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RedactConfig {
    /// `redact` (default), `reject` or `off`.
    pub mode: Mode,
    /// Rules added to the built-in ones.
    pub custom_rules: Vec<CustomRule>,
    /// Built-in rule ids to turn off (see [`super::Redactor::rule_ids`]).
    pub disabled: Vec<String>,
}

/// Why the filter could not be built, or why a write was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RedactError {
    /// `disabled` names a rule that does not exist.
    #[error(
        "redaction setting `disabled`: unknown rule id `{id}`; use one of the built-in ids ({})",
        super::rules::ids().join(", ")
    )]
    UnknownDisabledRule { id: String },
    /// A custom rule without an id.
    #[error(
        "redaction setting `custom_rules[{index}].id` is empty; give the rule a lowercase kebab-case id such as `internal-token`"
    )]
    EmptyRuleId { index: usize },
    /// A custom rule id that is not lowercase kebab-case.
    #[error(
        "redaction setting `custom_rules[{index}].id`: `{id}` is not lowercase kebab-case; use letters a-z, digits and single dashes, at most 64 bytes (e.g. `internal-token`)"
    )]
    InvalidRuleId { index: usize, id: String },
    /// A custom rule id already in use.
    #[error(
        "redaction setting `custom_rules[{index}].id`: `{id}` is already used by {}; choose another id",
        if *builtin { "a built-in rule" } else { "an earlier custom rule" }
    )]
    DuplicateRuleId {
        index: usize,
        id: String,
        builtin: bool,
    },
    /// A custom regex that does not compile.
    #[error(
        "redaction setting `custom_rules[{index}].regex` (rule `{id}`) is not a valid regex: {message}"
    )]
    InvalidRegex {
        index: usize,
        id: String,
        message: String,
    },
    /// A custom regex that matches the empty string.
    #[error(
        "redaction setting `custom_rules[{index}].regex` (rule `{id}`) matches the empty string; make it match at least one character"
    )]
    MatchesEmpty { index: usize, id: String },
    /// An empty keyword.
    #[error(
        "redaction setting `custom_rules[{index}].keywords` (rule `{id}`) holds an empty keyword; remove it"
    )]
    EmptyKeyword { index: usize, id: String },
    /// Reject mode found secrets. Holds rule ids and counts only.
    #[error(
        "write refused: the text contains secrets: {}; remove the secrets and retry (or set the redaction mode to `redact` to store them as [REDACTED:...] markers)",
        summary(.kinds)
    )]
    Rejected { kinds: Vec<(String, u32)> },
    /// A built-in rule failed to compile (a bug in memvault).
    #[error("internal error in the redaction filter: {message}")]
    Internal { message: String },
}

fn summary(kinds: &[(String, u32)]) -> String {
    kinds
        .iter()
        .map(|(k, n)| format!("{k} ({n})"))
        .collect::<Vec<_>>()
        .join(", ")
}
