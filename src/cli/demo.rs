//! `memvault demo`: memvault's main job, offline, with nothing set up.
//!
//! On a throwaway vault with a random key it replays the memory tool calls
//! of a customer-service agent (the example of the memory tool
//! documentation), through the same code path as `serve`, printing each
//! `tool_use` and its `tool_result`. It then searches every file under the
//! vault and every decompressed git object for the plaintext it wrote, and
//! fails if any is found.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::json;

use super::{CliError, memory_for};
use crate::crypto::KeyFileKey;
use crate::protocol;
use crate::vault::{Attribution, InitSecret, Vault, VaultConfig};

const GUIDELINES: &str = "<guidelines>\n<addressing_customers>\n- Always address customers by their first name\n- Use empathetic language\n</addressing_customers>\n<escalation>\n- Escalate billing disputes over $500 to a human agent\n</escalation>\n</guidelines>\n";

// A made-up Stripe-format key, so the demo shows redaction at work.
const REFUNDS: &str = "<refund_policies>\n- Refunds within 30 days of delivery, no questions asked\n- Payments API key: sk_live_51HqLyjWDarjtT1zdp7dcXk2mQ9vRb4nZe8aYf3Lw\n</refund_policies>\n";

/// The scripted session: a description and the tool input.
fn script() -> Vec<(&'static str, serde_json::Value)> {
    vec![
        (
            "Claude checks its memory directory before starting (empty store)",
            json!({"command": "view", "path": "/memories"}),
        ),
        (
            "It records the support guidelines it was given",
            json!({"command": "create", "path": "/memories/customer_service_guidelines.xml", "file_text": GUIDELINES}),
        ),
        (
            "It records the refund policy; the pasted API key is redacted before saving",
            json!({"command": "create", "path": "/memories/refund_policies.xml", "file_text": REFUNDS}),
        ),
        (
            "A later turn reads the guidelines back",
            json!({"command": "view", "path": "/memories/customer_service_guidelines.xml"}),
        ),
        (
            "The user corrects a guideline",
            json!({"command": "str_replace", "path": "/memories/customer_service_guidelines.xml",
                   "old_str": "- Use empathetic language", "new_str": "- Use empathetic, plain language; no jargon"}),
        ),
        (
            "It learns a new rule and inserts it after line 4",
            json!({"command": "insert", "path": "/memories/customer_service_guidelines.xml", "insert_line": 4,
                   "insert_text": "- Offer a 10% voucher when an order arrives more than 5 days late\n"}),
        ),
        (
            "It files the guidelines under a folder",
            json!({"command": "rename", "old_path": "/memories/customer_service_guidelines.xml",
                   "new_path": "/memories/support/guidelines.xml"}),
        ),
        (
            "It reads the first lines of the moved file",
            json!({"command": "view", "path": "/memories/support/guidelines.xml", "view_range": [1, 5]}),
        ),
        (
            "A prompt-injected call tries to escape /memories: refused, nothing read",
            json!({"command": "view", "path": "/memories/../../etc/passwd"}),
        ),
        (
            "The refund policy is out of date: it deletes it",
            json!({"command": "delete", "path": "/memories/refund_policies.xml"}),
        ),
        (
            "The memory directory at the end of the session",
            json!({"command": "view", "path": "/memories"}),
        ),
    ]
}

/// Plaintext that must not appear anywhere on disk.
const MARKERS: &[&str] = &[
    "customer_service_guidelines",
    "refund_policies",
    "guidelines.xml",
    "support/",
    "empathetic",
    "first name",
    "Escalate billing",
    "voucher",
    "no questions asked",
    "sk_live_51HqLyjWDarjtT1zdp7dcXk2mQ9vRb4nZe8aYf3Lw",
    "/memories",
];

pub fn run(keep: Option<&Path>, out: &mut dyn Write) -> Result<u8, CliError> {
    let (dir, temp) = match keep {
        Some(d) => (d.to_path_buf(), false),
        None => (
            std::env::temp_dir().join(format!(
                "memvault-demo-{}",
                data_encoding::HEXLOWER.encode(&crate::crypto::random_bytes::<6>())
            )),
            true,
        ),
    };
    let result = run_in(&dir, out);
    if temp {
        let _ = fs::remove_dir_all(&dir);
    }
    result
}

fn run_in(dir: &Path, out: &mut dyn Write) -> Result<u8, CliError> {
    let session = super::new_session_id();
    let attribution = Attribution {
        session: session.clone(),
        actor: "demo-agent".into(),
    };
    let mut vault = Vault::init(
        dir,
        InitSecret::KeyFile(KeyFileKey::generate()),
        VaultConfig::default(),
        attribution,
    )?;
    let memory = memory_for(vault.config())?;
    writeln!(
        out,
        "memvault demo: a customer-service agent's memory session"
    )?;
    writeln!(
        out,
        "vault: {} (random key, thrown away afterwards)",
        dir.display()
    )?;
    writeln!(out, "session: {session}")?;
    for (i, (what, input)) in script().into_iter().enumerate() {
        let tool_use = json!({
            "type": "tool_use",
            "id": format!("toolu_demo_{:02}", i + 1),
            "name": "memory",
            "input": input,
        });
        let line = tool_use.to_string();
        // The same path as `serve`: one JSON line in, one JSON line out.
        let reply = protocol::handle_line(&memory, &mut vault, line.as_bytes());
        writeln!(out)?;
        writeln!(out, "[{}] {what}", i + 1)?;
        writeln!(out, "tool_use    {line}")?;
        writeln!(out, "tool_result {}", reply.to_line())?;
        if let Some(text) = reply.result.text() {
            for l in text.lines() {
                writeln!(out, "    | {l}")?;
            }
        }
    }
    let commits = vault.history()?.len();
    drop(vault);
    writeln!(out)?;
    let scan = scan_for_plaintext(dir, MARKERS)?;
    writeln!(
        out,
        "history: {commits} commits on refs/heads/main (vault creation + one per change), each with encrypted metadata and a MAC"
    )?;
    writeln!(
        out,
        "on disk: searched {} files ({} bytes) and {} decompressed git objects for {} pieces of plaintext from this session",
        scan.files,
        scan.bytes,
        scan.objects,
        MARKERS.len()
    )?;
    if scan.found.is_empty() {
        writeln!(
            out,
            "result: no readable text found: names, content and metadata are all encrypted"
        )?;
        Ok(0)
    } else {
        for f in &scan.found {
            writeln!(out, "FOUND plaintext in {f}")?;
        }
        Err(CliError::failure("plaintext was found on disk"))
    }
}

/// What a plaintext search of a vault found.
pub struct Scan {
    pub files: usize,
    pub bytes: u64,
    pub objects: usize,
    /// Where a marker was found (file path or object id), without the marker.
    pub found: Vec<String>,
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

/// Search every file below `dir` and every object in its git repository
/// (decompressed) for each marker.
pub fn scan_for_plaintext(dir: &Path, markers: &[&str]) -> Result<Scan, CliError> {
    let mut scan = Scan {
        files: 0,
        bytes: 0,
        objects: 0,
        found: Vec::new(),
    };
    let mut stack: Vec<PathBuf> = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        for entry in fs::read_dir(&p)? {
            let entry = entry?;
            let path = entry.path();
            if entry.file_type()?.is_dir() {
                stack.push(path);
            } else {
                let bytes = fs::read(&path)?;
                scan.files += 1;
                scan.bytes += bytes.len() as u64;
                if markers.iter().any(|m| contains(&bytes, m.as_bytes())) {
                    scan.found.push(path.display().to_string());
                }
            }
        }
    }
    let needles: Vec<&[u8]> = markers.iter().map(|m| m.as_bytes()).collect();
    let objects = crate::vault::inspect::objects_containing(dir, &needles)?;
    scan.objects = objects.objects;
    for id in objects.found {
        scan.found.push(format!("git object {id}"));
    }
    Ok(scan)
}
