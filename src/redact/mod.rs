//! The secret filter: every text memvault is asked to store passes through
//! here first, and each secret in it is replaced by a marker such as
//! `[REDACTED:aws-access-key-id]`. This module is the only place that
//! compiles regexes.
//!
//! # What it finds
//!
//! Rules follow each format's public structure (fixed prefix, alphabet,
//! length, checksum), and only run where one of their keywords occurs.
//! Every rule has an id and a one-line description ([`Redactor::rules`],
//! `memvault redact --list-rules`):
//!
//! - the vendor formats of gitleaks' default rule set, facts from their
//!   documentation: cloud (AWS, Bedrock, Google, Azure, Entra ID,
//!   Alibaba, DigitalOcean, Cloudflare, Fly.io, Heroku, Vercel, Netlify,
//!   Supabase, PlanetScale, Databricks), infrastructure (HashiCorp Vault,
//!   Terraform Cloud, Pulumi, Doppler, Grafana, New Relic, Dynatrace,
//!   Sentry, 1Password), code hosts and registries (GitHub classic tokens
//!   with their CRC32 checked, GitLab, npm, PyPI, Docker Hub, Hugging Face,
//!   RubyGems, Clojars, Artifactory, Sourcegraph, SonarQube), SaaS (Slack,
//!   Teams, Discord with the bot's user id decoded, Telegram, Twilio,
//!   SendGrid, Brevo, Mailgun, Mailchimp, Atlassian, Linear, Notion,
//!   Airtable, Asana, Postman, Contentful, Intercom, Mapbox, Dropbox,
//!   Shopify, Meta, X), payments (Stripe, Square, Braintree, Adyen), and AI
//!   vendors (Anthropic, OpenAI, OpenRouter, Groq, xAI, Perplexity,
//!   Replicate, LangSmith, Langfuse, NVIDIA, ElevenLabs, Together,
//!   Fireworks, Pinecone, Cerebras, Anyscale, Voyage);
//! - private key blocks of every PEM kind (RSA, EC, DSA, PKCS#8, OpenSSH,
//!   PGP, SSH2), also inside JSON strings and base64-encoded (kubeconfig),
//!   and PuTTY key files, redacted whole; JWTs with their signature; age
//!   secret keys (bech32 checksum verified); password hashes of
//!   `.htpasswd` and shadow lines;
//! - credentials in text: the password of a URL
//!   (`postgres://user:[REDACTED:url-credentials]@host`), the value of
//!   `password`, `api_key`, `secret`, `token`, `Authorization`, session id
//!   and similar assignments in `.env`, YAML, JSON, TOML, XML, ADO.NET and
//!   JDBC connection strings, `.pgpass`, `.netrc` and `my.cnf` lines,
//!   command lines (`--password`, `mysql -p...`, `mongosh -p`, `sshpass
//!   -p`, `redis-cli -a`, `curl -u user:...`) and prose ("the password is
//!   ...", "use ... as the password"); a UUID after a Heroku, HubSpot or
//!   Snyk key name, or one that says secret, token or API key; TOTP seeds (`otpauth://` URIs, base32 after TOTP, 2FA
//!   or MFA);
//! - personal data: card numbers (network prefix and length, Luhn), US
//!   SSNs (valid ranges, with dashes or spaces, or nine bare digits after
//!   `SSN`), IBANs (registered length, mod-97, compact or in groups).
//!
//! # What it promises
//!
//! - The text around a secret is kept; for assignments and URLs only the
//!   value or password is replaced, so the note stays readable.
//! - Left alone: UUIDs, git and content hashes, base64 image data,
//!   documented example keys (`AKIAIOSFODNN7EXAMPLE`), placeholders
//!   (`xxxx`, `<your-key>`, `${VAR}`, `changeme`, `your_api_key_here`),
//!   references (`$VAR`, `os.environ[...]`, `{{ secrets.X }}`), ordinary
//!   words after `password` in prose, values that fail their format's
//!   checksum, and existing `[REDACTED:...]` markers.
//! - Idempotent: redacting redacted text changes nothing.
//! - Linear time: keyword search, windowed regexes (the `regex` crate has
//!   no backtracking) and bounded parsers, so no input can make it hang.
//!   Regexes are compiled at the first hit of one of their keywords.
//! - [`Finding`] holds offsets, never the secret; no error carries scanned
//!   text.
//!
//! # Limitations
//!
//! - A secret with no recognisable structure (a password in a sentence
//!   with no keyword, `admin/admin`, a random string with no prefix or key
//!   name) cannot be told from ordinary text and is not found.
//! - Context rules (an AWS secret key, a password in prose) need their
//!   keyword close by: on the same line, or within a few words.
//! - Keywords are matched in lower case, upper case and title case
//!   (`password`, `PASSWORD`, `Password`, `PassWord`, `dbPassword`,
//!   `apiKey`), not in other mixes (`pAsSwOrD`).
//! - A GitHub classic token or an age key whose checksum does not verify
//!   is a look-alike, even after `token =`.
//! - A value after a secret key name is judged by its shape: a UUID is
//!   left alone even after `api_key =` (so a vendor key that is a bare
//!   UUID is found only after a Heroku, HubSpot, Snyk, Squarespace or
//!   Sendbird key name), a plain word after `password` in prose is left
//!   alone, and code on the right of `password =` (`self.password`,
//!   `get_password()`) is taken for code.
//! - Custom rules are trusted: their regex is linear-time, but how well it
//!   tells secrets from look-alikes is up to its author.

mod assign;
mod blocks;
mod checks;
mod config;
mod digits;
mod engine;
mod notes;
mod rules;

#[cfg(test)]
mod eval;
#[cfg(test)]
mod tests;

use std::borrow::Cow;

pub use config::{CustomRule, Mode, RedactConfig, RedactError};

use engine::Engine;

/// One secret found: where it is, and which rule found it. Holds no text.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Finding {
    /// Rule id, e.g. `aws-access-key-id`.
    pub rule: String,
    /// Byte offset of the secret in the scanned text.
    pub start: usize,
    /// Byte offset just past the secret.
    pub end: usize,
    /// 1-based line of `start`.
    pub line: usize,
    /// 1-based column of `start`, in characters.
    pub column: usize,
}

/// A built-in rule, as `memvault redact --list-rules` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuleInfo {
    /// The id used in markers, settings and reports.
    pub id: &'static str,
    /// What the rule finds, in one line.
    pub description: &'static str,
}

/// A redacted text and what was taken out of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redaction {
    /// The text with each finding replaced by `[REDACTED:<rule>]`.
    pub text: String,
    /// The findings, in input offsets, sorted and non-overlapping.
    pub findings: Vec<Finding>,
}

impl Redaction {
    /// The rule ids found, sorted, with how often each was found.
    pub fn kinds(&self) -> Vec<(String, u32)> {
        kinds_of(&self.findings)
    }
}

/// "1 secret (github-token)", "2 secrets (a, b)": what a filter found.
pub fn secrets_phrase(kinds: &[(String, u32)]) -> String {
    let total: u64 = kinds.iter().map(|(_, n)| u64::from(*n)).sum();
    let names: Vec<&str> = kinds.iter().map(|(k, _)| k.as_str()).collect();
    match total {
        0 => "text the secret filter refused".to_owned(),
        1 => format!("1 secret ({})", names.join(", ")),
        n => format!("{n} secrets ({})", names.join(", ")),
    }
}

/// The rule ids in `findings`, sorted, with how often each was found.
pub fn kinds(findings: &[Finding]) -> Vec<(String, u32)> {
    kinds_of(findings)
}

fn kinds_of(findings: &[Finding]) -> Vec<(String, u32)> {
    let mut out: Vec<(String, u32)> = Vec::new();
    for f in findings {
        match out.iter_mut().find(|(k, _)| *k == f.rule) {
            Some((_, n)) => *n += 1,
            None => out.push((f.rule.clone(), 1)),
        }
    }
    out.sort();
    out
}

/// The compiled filter. Build it once from the settings ([`Redactor::new`])
/// and share it: it is `Send + Sync` and scanning does not mutate it.
pub struct Redactor {
    mode: Mode,
    engine: Engine,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redactor")
            .field("mode", &self.mode)
            .field("rules", &self.engine.ids.len())
            .finish_non_exhaustive()
    }
}

impl Redactor {
    /// Compiles the built-in rules (less the disabled ones) and the custom
    /// rules. Fails on an unknown id in `disabled`, or a custom rule with an
    /// empty, malformed or duplicate id, an invalid regex, a regex that
    /// matches the empty string, or an empty keyword.
    pub fn new(config: &RedactConfig) -> Result<Redactor, RedactError> {
        let engine = Engine::new(&config.disabled, &config.custom_rules)?;
        Ok(Redactor {
            mode: config.mode,
            engine,
        })
    }

    /// Compile every rule now instead of at its first hit: for a filter
    /// that several tenants share, whose first-hit delay would otherwise
    /// tell one tenant which kinds of secret others wrote before.
    pub fn compile_all(&self) {
        self.engine.compile_all();
    }

    /// The configured mode. [`Redactor::scan`] and [`Redactor::redact`]
    /// ignore it; [`Redactor::filter`] applies it.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The secrets in `text`: non-overlapping, sorted by start. Where
    /// matches overlap they are merged into one finding that covers them
    /// all, named after the most specific rule (the longest on a tie).
    pub fn scan(&self, text: &str) -> Vec<Finding> {
        let (found, _) = self.engine.scan(text);
        self.findings(text, &found)
    }

    /// `text` with each finding replaced by `[REDACTED:<rule>]`. With no
    /// finding the text comes back unchanged (one copy, no other work).
    pub fn redact(&self, text: &str) -> Redaction {
        let (found, redacted) = self.engine.scan(text);
        if found.is_empty() {
            return Redaction {
                text: text.to_owned(),
                findings: Vec::new(),
            };
        }
        let redacted = redacted.unwrap_or_else(|| self.engine.apply(text, &found).0);
        Redaction {
            text: redacted,
            findings: self.findings(text, &found),
        }
    }

    /// `text` with each finding replaced by `[REDACTED:<rule>]`, and the
    /// rule ids found with their counts (as [`Redaction::kinds`]), without
    /// positions. Text with no finding is returned as it is, not copied:
    /// for redacting large files.
    pub fn redact_text<'a>(&self, text: &'a str) -> (Cow<'a, str>, Vec<(String, u32)>) {
        let (found, redacted) = self.engine.scan(text);
        if found.is_empty() {
            return (Cow::Borrowed(text), Vec::new());
        }
        let mut kinds: Vec<(String, u32)> = Vec::new();
        let mut counts = vec![0u32; self.engine.ids.len()];
        for f in &found {
            counts[f.rule] += 1;
        }
        for (rule, &n) in counts.iter().enumerate() {
            if n > 0 {
                kinds.push((self.engine.ids[rule].clone(), n));
            }
        }
        kinds.sort();
        let redacted = redacted.unwrap_or_else(|| self.engine.apply(text, &found).0);
        (Cow::Owned(redacted), kinds)
    }

    /// The secrets in `text` as byte ranges with their rule ids: the spans
    /// [`Redactor::scan`] finds, without lines and columns (for callers that
    /// redact a text piece by piece).
    pub fn locate(&self, text: &str) -> Vec<(std::ops::Range<usize>, &str)> {
        let (found, _) = self.engine.scan(text);
        found
            .iter()
            .map(|f| (f.start..f.end, self.engine.ids[f.rule].as_str()))
            .collect()
    }

    /// Applies the mode: `redact` redacts, `reject` refuses text holding a
    /// secret with [`RedactError::Rejected`] (naming the kinds found),
    /// `off` passes the text through.
    pub fn filter(&self, text: &str) -> Result<Redaction, RedactError> {
        match self.mode {
            Mode::Off => Ok(Redaction {
                text: text.to_owned(),
                findings: Vec::new(),
            }),
            Mode::Redact => Ok(self.redact(text)),
            Mode::Reject => {
                let findings = self.scan(text);
                if findings.is_empty() {
                    Ok(Redaction {
                        text: text.to_owned(),
                        findings,
                    })
                } else {
                    Err(RedactError::Rejected {
                        kinds: kinds_of(&findings),
                    })
                }
            }
        }
    }

    /// The built-in rule ids, in a stable order.
    pub fn rule_ids() -> Vec<&'static str> {
        rules::ids()
    }

    /// Every built-in rule: its id and a one-line description of what it
    /// finds, in the order of [`Redactor::rule_ids`].
    pub fn rules() -> Vec<RuleInfo> {
        rules::RULES
            .iter()
            .map(|&(id, description)| RuleInfo { id, description })
            .collect()
    }

    /// The one-line description of a built-in rule.
    pub fn describe(id: &str) -> Option<&'static str> {
        rules::RULES.iter().find(|(i, _)| *i == id).map(|(_, d)| *d)
    }

    /// Findings with rule names, lines and columns (one pass over the text).
    fn findings(&self, text: &str, found: &[engine::Found]) -> Vec<Finding> {
        let b = text.as_bytes();
        let mut out = Vec::with_capacity(found.len());
        let mut line = 1;
        // Column `col` is known at byte `col_at`.
        let (mut col_at, mut col) = (0, 1);
        for f in found {
            let newlines = checks::count_byte(&b[col_at..f.start], b'\n');
            if newlines > 0 {
                line += newlines;
                col_at = f.start
                    - b[col_at..f.start]
                        .iter()
                        .rev()
                        .take_while(|&&c| c != b'\n')
                        .count();
                col = 1;
            }
            // Characters are counted as bytes that do not continue a UTF-8 sequence.
            col += b[col_at..f.start]
                .iter()
                .filter(|&&c| (c as i8) >= -0x40)
                .count();
            col_at = f.start;
            out.push(Finding {
                rule: self.engine.ids[f.rule].clone(),
                start: f.start,
                end: f.end,
                line,
                column: col,
            });
        }
        out
    }
}
