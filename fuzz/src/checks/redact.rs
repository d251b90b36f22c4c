//! The redaction filter (default settings): never panics, keeps every byte
//! outside its findings, is idempotent, and its output has the exact length
//! its findings imply.
//!
//! Length bound, from `Engine::apply`: each finding `[start, end)` becomes
//! `[REDACTED:<rule>]`, `rule.len() + 11` bytes, and findings are
//! non-empty and disjoint, so
//! `out.len() == in.len() - Σ(end - start) + Σ(rule.len() + 11)`
//! `        <= in.len() + Σ(rule.len() + 10)`.
//!
//! Input: the text (UTF-8, lossy).

use std::sync::OnceLock;

use memvault::redact::{RedactConfig, Redactor};

fn redactor() -> &'static Redactor {
    static REDACTOR: OnceLock<Redactor> = OnceLock::new();
    REDACTOR.get_or_init(|| Redactor::new(&RedactConfig::default()).expect("default filter builds"))
}

pub fn check(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let redactor = redactor();
    let red = redactor.redact(&text);

    // Findings: sorted, disjoint, non-empty, on character boundaries.
    let mut last = 0;
    let mut expected = String::new();
    let mut bound = text.len();
    for f in &red.findings {
        assert!(
            last <= f.start && f.start < f.end && f.end <= text.len(),
            "{f:?}"
        );
        assert!(text.is_char_boundary(f.start) && text.is_char_boundary(f.end));
        let before = &text[..f.start];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
        assert_eq!((f.line, f.column), (line, column), "{f:?}");
        expected.push_str(&text[last..f.start]);
        expected.push_str(&format!("[REDACTED:{}]", f.rule));
        bound += f.rule.len() + 10;
        last = f.end;
    }
    expected.push_str(&text[last..]);
    // Everything outside a finding is kept; each finding is one marker.
    assert_eq!(red.text, expected);
    assert!(red.text.len() <= bound);
    let counted: u32 = red.kinds().iter().map(|(_, n)| n).sum();
    assert_eq!(counted as usize, red.findings.len());
    assert_eq!(redactor.scan(&text), red.findings);
    // The lean forms (used by `memvault redact`) agree.
    let (lean, kinds) = redactor.redact_text(&text);
    assert_eq!(lean, red.text);
    assert_eq!(kinds, red.kinds());
    let spans: Vec<(usize, usize, &str)> = redactor
        .locate(&text)
        .into_iter()
        .map(|(r, rule)| (r.start, r.end, rule))
        .collect();
    let expected_spans: Vec<(usize, usize, &str)> = red
        .findings
        .iter()
        .map(|f| (f.start, f.end, f.rule.as_str()))
        .collect();
    assert_eq!(spans, expected_spans);

    // Idempotent: the redacted text holds nothing more to redact.
    let again = redactor.redact(&red.text);
    assert!(
        again.findings.is_empty() && again.text == red.text,
        "not idempotent: {:?} -> {:?} found {:?}",
        red.text,
        again.text,
        again.findings
    );
}
