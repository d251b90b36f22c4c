//! A complete tool-use loop against the Messages API, with every memory
//! `tool_use` executed by memvault through the library (the same path as
//! `memvault serve`: `memory_for_vault` + `protocol::handle_value`).
//!
//! ```sh
//! memvault keygen agent.key && memvault --vault agent-vault --key-file agent.key init
//! ANTHROPIC_API_KEY=sk-ant-... cargo run --example agent -- \
//!     --vault agent-vault --key-file agent.key --session ticket-4711 \
//!     "Remember that Acme Corp prefers email follow-ups."
//! ```
//!
//! Settings: `--vault DIR` (else `MEMVAULT_DIR`), `--key-file F` (else
//! `MEMVAULT_KEY_FILE`) or `--passphrase-file F`, `--session ID` (else a
//! new random one), `--actor NAME` (default `example-agent`), `--model M`
//! (else `ANTHROPIC_MODEL`, else `claude-sonnet-4-5`), `--max-turns N`
//! (default 20). The API key comes from `ANTHROPIC_API_KEY`, the base URL
//! from `ANTHROPIC_BASE_URL` (default `https://api.anthropic.com`); an
//! `ANTHROPIC_BETA` value is sent as the `anthropic-beta` header (the
//! memory tool itself needs none).
//!
//! stdout gets Claude's final text; stderr gets one line per memory call
//! (command name and outcome only: never paths, content or keys).

use std::error::Error;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use memvault::crypto::{KeyFileKey, Passphrase, Unlock};
use memvault::protocol;
use memvault::vault::{Attribution, Vault};
use serde_json::{Value, json};
use zeroize::Zeroizing;

const MEMORY_TOOL: &str = "memory";
const COMMANDS: [&str; 6] = [
    "view",
    "create",
    "str_replace",
    "insert",
    "delete",
    "rename",
];

struct Args {
    vault: PathBuf,
    key_file: Option<PathBuf>,
    passphrase_file: Option<PathBuf>,
    session: String,
    actor: String,
    model: String,
    max_turns: u32,
    prompt: String,
}

const USAGE: &str = "usage: agent [--vault DIR] [--key-file F | --passphrase-file F] [--session ID] \
                     [--actor NAME] [--model M] [--max-turns N] PROMPT...";

fn parse_args() -> Result<Args, String> {
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    let mut vault = env("MEMVAULT_DIR").map(PathBuf::from);
    let mut key_file = env("MEMVAULT_KEY_FILE").map(PathBuf::from);
    let mut passphrase_file = None;
    let mut session = None;
    let mut actor = "example-agent".to_string();
    let mut model = std::env::var("ANTHROPIC_MODEL").unwrap_or_else(|_| "claude-sonnet-4-5".into());
    let mut max_turns = 20;
    let mut prompt = Vec::new();
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value\n{USAGE}"));
        match arg.as_str() {
            "--vault" => vault = Some(value("--vault")?.into()),
            "--key-file" => key_file = Some(value("--key-file")?.into()),
            "--passphrase-file" => passphrase_file = Some(value("--passphrase-file")?.into()),
            "--session" => session = Some(value("--session")?),
            "--actor" => actor = value("--actor")?,
            "--model" => model = value("--model")?,
            "--max-turns" => {
                max_turns = value("--max-turns")?
                    .parse()
                    .map_err(|_| format!("--max-turns takes a number\n{USAGE}"))?
            }
            "-h" | "--help" => return Err(USAGE.into()),
            s if s.starts_with("--") => return Err(format!("unknown option {s}\n{USAGE}")),
            _ => prompt.push(arg),
        }
    }
    if prompt.is_empty() {
        return Err(format!("no prompt given\n{USAGE}"));
    }
    Ok(Args {
        vault: vault.ok_or(format!(
            "no vault: give --vault DIR or set MEMVAULT_DIR\n{USAGE}"
        ))?,
        key_file,
        passphrase_file,
        session: session.unwrap_or_else(|| {
            let id = memvault::crypto::random_bytes::<8>();
            format!("s-{}", data_encoding::HEXLOWER.encode(&id))
        }),
        actor,
        model,
        max_turns,
        prompt: prompt.join(" "),
    })
}

/// Open and unlock the vault with the key file or passphrase file given.
fn open_vault(args: &Args) -> Result<Vault, Box<dyn Error>> {
    let who = Attribution {
        session: args.session.clone(),
        actor: args.actor.clone(),
    };
    match (&args.passphrase_file, &args.key_file) {
        (Some(p), _) => {
            let text = Zeroizing::new(std::fs::read_to_string(p)?);
            let line = text.lines().next().unwrap_or_default();
            let pass = Passphrase::new(line.to_string());
            Ok(Vault::open(&args.vault, &Unlock::Passphrase(&pass), who)?)
        }
        (None, Some(k)) => {
            let bytes = Zeroizing::new(std::fs::read(k)?);
            let key = KeyFileKey::from_bytes(&bytes)?;
            Ok(Vault::open(&args.vault, &Unlock::KeyFile(&key), who)?)
        }
        (None, None) => Err("no secret: give --key-file or --passphrase-file".into()),
    }
}

/// The Messages API over HTTPS (rustls with the aws-lc-rs provider).
struct Api {
    agent: ureq::Agent,
    url: String,
    key: String,
    beta: Option<String>,
}

impl Api {
    fn from_env() -> Result<Api, String> {
        let key = std::env::var("ANTHROPIC_API_KEY")
            .ok()
            .filter(|k| !k.is_empty())
            .ok_or("set ANTHROPIC_API_KEY")?;
        let base = std::env::var("ANTHROPIC_BASE_URL")
            .ok()
            .filter(|b| !b.is_empty())
            .unwrap_or_else(|| "https://api.anthropic.com".into());
        let tls = ureq::tls::TlsConfig::builder()
            .provider(ureq::tls::TlsProvider::Rustls)
            .unversioned_rustls_crypto_provider(Arc::new(
                rustls::crypto::aws_lc_rs::default_provider(),
            ))
            .build();
        let agent = ureq::Agent::config_builder()
            .tls_config(tls)
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(600)))
            .build()
            .new_agent();
        Ok(Api {
            agent,
            url: format!("{}/v1/messages", base.trim_end_matches('/')),
            key,
            beta: std::env::var("ANTHROPIC_BETA")
                .ok()
                .filter(|b| !b.is_empty()),
        })
    }

    /// One `POST /v1/messages`, retried a few times on overload and rate limits.
    fn create(&self, body: &Value) -> Result<Value, Box<dyn Error>> {
        let body = body.to_string();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut req = self
                .agent
                .post(&self.url)
                .header("x-api-key", &self.key)
                .header("anthropic-version", "2023-06-01")
                .header("content-type", "application/json");
            if let Some(beta) = &self.beta {
                req = req.header("anthropic-beta", beta);
            }
            let mut resp = req.send(body.as_str())?;
            let status = resp.status().as_u16();
            let text = resp.body_mut().read_to_string()?;
            if status == 200 {
                return Ok(serde_json::from_str(&text)?);
            }
            if matches!(status, 429 | 500 | 502 | 503 | 529) && attempt < 4 {
                eprintln!("agent: the API answered {status}; retrying");
                std::thread::sleep(Duration::from_secs(1 << attempt));
                continue;
            }
            let detail: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
            let kind = detail["error"]["type"].as_str().unwrap_or("unknown");
            let message = detail["error"]["message"]
                .as_str()
                .unwrap_or("(no message)");
            return Err(format!("the API answered {status} ({kind}): {message}").into());
        }
    }
}

fn run(args: &Args) -> Result<(), Box<dyn Error>> {
    let api = Api::from_env()?;
    let mut vault = open_vault(args)?;
    let memory = memvault::memory_for_vault(&vault)?;
    eprintln!("agent: session {}", args.session);

    let mut messages = vec![json!({"role": "user", "content": args.prompt})];
    for turn in 1..=args.max_turns {
        let body = json!({
            "model": args.model,
            "max_tokens": 2048,
            "messages": messages,
            "tools": [{"type": "memory_20250818", "name": MEMORY_TOOL}],
        });
        let reply = api.create(&body)?;
        let content = reply["content"]
            .as_array()
            .ok_or("the reply has no content array")?
            .clone();
        let stop = reply["stop_reason"].as_str().unwrap_or("").to_string();
        messages.push(json!({"role": "assistant", "content": content}));
        match stop.as_str() {
            "tool_use" => {
                let mut results = Vec::new();
                for block in content.iter().filter(|b| b["type"] == "tool_use") {
                    results.push(run_tool(&memory, &mut vault, block, turn));
                }
                messages.push(json!({"role": "user", "content": results}));
            }
            // A server tool paused a long turn: send the conversation as it is.
            "pause_turn" => {}
            _ => {
                for block in content.iter().filter(|b| b["type"] == "text") {
                    println!("{}", block["text"].as_str().unwrap_or_default());
                }
                if stop != "end_turn" {
                    eprintln!("agent: the model stopped with stop_reason {stop:?}");
                }
                return Ok(());
            }
        }
    }
    Err(format!("no final answer after {} turns", args.max_turns).into())
}

/// Execute one `tool_use` block and return its `tool_result` block.
fn run_tool(
    memory: &memvault::memory::Memory,
    vault: &mut Vault,
    block: &Value,
    turn: u32,
) -> Value {
    if block["name"] != MEMORY_TOOL {
        return json!({
            "type": "tool_result",
            "tool_use_id": block["id"],
            "content": "Error: this agent only has the `memory` tool.",
            "is_error": true,
        });
    }
    let reply = protocol::handle_value(memory, vault, block);
    let command = block["input"]["command"].as_str().unwrap_or("");
    let command = COMMANDS
        .iter()
        .find(|c| **c == command)
        .unwrap_or(&"(invalid)");
    let outcome = if reply.result.is_error { "error" } else { "ok" };
    eprintln!("agent: turn {turn}: memory {command}: {outcome}");
    reply.to_json()
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("agent: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("agent: {e}");
            ExitCode::FAILURE
        }
    }
}
