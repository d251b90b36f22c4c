//! `memvault mcp`: the memory tool as a Model Context Protocol server on
//! stdin/stdout, for MCP clients such as Claude Code and Claude Desktop.
//!
//! It offers one tool, `memory`, whose arguments are exactly the `input` of
//! a `memory_20250818` `tool_use` block. A call runs through
//! [`Memory::execute_json`] on the unlocked vault, the same function `serve`
//! runs for a `tool_use` block, so every result and error carries the same
//! text as `serve` gives; an error result has `isError: true`. stdin
//! passes through a gate (`mcpwire`) that answers what rmcp would drop or
//! misname: a line that is not JSON, a line over the limit, a `tools/call`
//! with a key given twice or arguments that are not an object.
//!
//! The vault is opened and unlocked once, before the MCP handshake, so a
//! wrong key or a missing vault ends the process with status 1 and a
//! message on stderr instead of a half-working server. Requests run one at
//! a time on a current-thread runtime (each command is short and
//! synchronous; the vault's writer lock serialises other processes).
//!
//! Only JSON-RPC messages are written to stdout. Diagnostics go to stderr
//! and name no path, content or secret: an early protocol failure is
//! reported by kind only, since rmcp's own error text may quote the message.
//!
//! Limitations: no resources, prompts or notifications.

use std::sync::Mutex;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    JsonObject, ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
    ToolAnnotations,
};
use rmcp::service::{QuitReason, RequestContext, RoleServer, ServerInitializeError};
use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::{ErrorData, ServerHandler, ServiceExt};
use serde_json::{Value, json};

use super::mcpwire::{Gate, Out, Refusals};
use super::{CliError, Global, SessionArgs, memory_for, open_vault};
use crate::memory::{COMMAND_NAMES, Content, Memory, ToolResult};
use crate::redact::Mode;
use crate::vault::{Vault, VaultConfig};

/// The name of the one tool, as in `memory_20250818`.
pub const TOOL_NAME: &str = "memory";

/// Run `memvault mcp` until the client closes stdin.
pub fn run(global: &Global, session: &SessionArgs) -> Result<u8, CliError> {
    let attribution = session.attribution(true)?;
    let vault = open_vault(global, attribution)?;
    let memory = memory_for(vault.config())?;
    let max_line = vault.config().max_line_bytes;
    let tool = memory_tool(vault.config());
    let refusals = Refusals::default();
    let live = super::LiveMemory::new(vault.config());
    let server = MemoryServer {
        memory,
        live,
        tool,
        vault: Mutex::new(vault),
        refusals: refusals.clone(),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::failure(format!("cannot start the MCP runtime: {e}")))?;
    let outcome = runtime.block_on(async move {
        let out = Out::default();
        let stdin = Gate::new(tokio::io::stdin(), max_line, refusals, out.clone());
        // The gate hands on no line over the limit; rmcp's own limit is
        // only a backstop.
        let transport =
            AsyncRwTransport::new(stdin, out).with_max_line_length(max_line.saturating_add(64));
        let running = server.serve(transport).await?;
        Ok::<_, ServerInitializeError>(running.waiting().await)
    });
    // A read of stdin may still be pending on a blocking thread; do not wait
    // for a line that will never come.
    runtime.shutdown_background();
    match outcome {
        Ok(Ok(QuitReason::Closed | QuitReason::Cancelled)) => Ok(0),
        Ok(_) => Err(CliError::failure(
            "the MCP server stopped on an internal error",
        )),
        // The client went away before the handshake: nothing was asked.
        Err(ServerInitializeError::ConnectionClosed(_)) => Ok(0),
        Err(e) => Err(CliError::failure(format!(
            "MCP handshake failed ({}); the client must start with an `initialize` request",
            init_error_kind(&e)
        ))),
    }
}

/// A name for an initialisation failure that quotes nothing the client sent.
fn init_error_kind(e: &ServerInitializeError) -> &'static str {
    match e {
        ServerInitializeError::ExpectedInitializeRequest(_) => {
            "the first message was not `initialize`"
        }
        ServerInitializeError::ConnectionClosed(_) => "connection closed",
        ServerInitializeError::UnexpectedInitializeResponse(_) => "unexpected response",
        ServerInitializeError::InitializeFailed(_) => "initialize refused",
        ServerInitializeError::TransportError { .. } => "transport error",
        _ => "protocol error",
    }
}

/// The MCP handler: one tool over one unlocked vault.
struct MemoryServer {
    memory: Memory,
    /// The tool for settings another process set since (`config set`).
    live: super::LiveMemory,
    tool: Tool,
    /// `Vault` is `Send` but not `Sync`; rmcp wants a `Sync` handler.
    vault: Mutex<Vault>,
    /// `tools/call` requests screened out, with their answers.
    refusals: Refusals,
}

impl MemoryServer {
    /// Run one tool call's arguments as `serve` runs a `tool_use` input.
    fn execute(&self, input: &Value) -> Result<ToolResult, ErrorData> {
        let mut vault = self.vault.lock().map_err(|_| {
            ErrorData::internal_error(
                "an earlier memory command failed unexpectedly; restart the memvault MCP server",
                None,
            )
        })?;
        Ok(match self.live.now(&mut vault) {
            Ok(None) => self.memory.execute_json(&mut *vault, input),
            Ok(Some(live)) => live.execute_json(&mut *vault, input),
            Err(text) => ToolResult::error(text),
        })
    }
}

impl ServerHandler for MemoryServer {
    fn get_info(&self) -> ServerConfig {
        server_info()
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(vec![self.tool.clone()]))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        (name == TOOL_NAME).then(|| self.tool.clone())
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if let Some(message) = self.refusals.take(&context.id) {
            return Ok(to_mcp(ToolResult::error(message)).into());
        }
        if request.name != TOOL_NAME {
            return Err(ErrorData::invalid_params(
                "unknown tool: this server has one tool, `memory`",
                None,
            ));
        }
        // Absent arguments are an empty input: the command parser names
        // the missing `command`, as `serve` does for `"input": {}`.
        let input = Value::Object(request.arguments.unwrap_or_default());
        Ok(to_mcp(self.execute(&input)?).into())
    }
}

/// What `initialize` answers, here and in `memvault server`'s `/mcp`.
pub(crate) fn server_info() -> ServerConfig {
    ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
        .with_server_info(Implementation::new("memvault", env!("CARGO_PKG_VERSION")))
        .with_instructions(INSTRUCTIONS)
}

/// A memory result as an MCP tool result: same text, `isError` when it is
/// an error, images as image content.
pub(crate) fn to_mcp(result: ToolResult) -> CallToolResult {
    let block = match result.content {
        Content::Text(text) => ContentBlock::text(text),
        Content::Image {
            media_type,
            data_base64,
        } => ContentBlock::image(data_base64, media_type),
    };
    if result.is_error {
        CallToolResult::error(vec![block])
    } else {
        CallToolResult::success(vec![block])
    }
}

/// Sent once at `initialize`; clients may show it to the model.
pub(crate) const INSTRUCTIONS: &str = "memvault keeps your memory across conversations: a directory of files \
under /memories, encrypted and versioned. ALWAYS VIEW YOUR MEMORY DIRECTORY BEFORE DOING ANYTHING \
ELSE: call the `memory` tool with {\"command\": \"view\", \"path\": \"/memories\"}.";

/// The `memory` tool: its description follows the vault's settings.
pub fn memory_tool(config: &VaultConfig) -> Tool {
    let create = if config.overwrite_on_create {
        "create: `path`, `file_text`. Writes a whole file, replacing an existing one (the old \
         version stays in the history); missing parent directories are created."
    } else {
        "create: `path`, `file_text`. Writes a new file; missing parent directories are \
         created. It is an error if the file exists: edit it with str_replace or insert instead."
    };
    let secrets = match config.redaction.mode {
        Mode::Redact => {
            " Never store secrets (API keys, tokens, passwords, private keys): they are \
             redacted before saving, and the result says so."
        }
        Mode::Reject => {
            " Never store secrets (API keys, tokens, passwords, private keys): a write that \
             contains one is refused."
        }
        Mode::Off => " Never store secrets (API keys, tokens, passwords, private keys).",
    };
    let description = format!(
        "Persistent memory across conversations: a directory of text files under /memories that \
         you read and edit with the commands below. Your context window may be reset at any \
         moment; what is not written to memory is lost.\n\
         \n\
         IMPORTANT: ALWAYS VIEW YOUR MEMORY DIRECTORY BEFORE DOING ANYTHING ELSE (command \
         `view`, path `/memories`) to check for earlier progress. As you work, record status, \
         progress, decisions and open questions in memory.\n\
         \n\
         Keep the directory organised: few, small files with clear names, grouped in \
         directories by topic; keep each file up to date and coherent (edit it with \
         str_replace or insert rather than writing a near-duplicate); rename or delete files \
         that are no longer relevant; do not create new files unless necessary.{secrets}\n\
         \n\
         Every path is `/memories` or starts with `/memories/`; `..`, `.`, empty segments, \
         backslashes, control characters and a percent-encoded dot, slash or backslash \
         (`%2e`, `%2f`, `%5c`) are refused; nothing is URL-decoded.\n\
         \n\
         Commands (field `command`; the other fields it uses follow):\n\
         - view: `path`, optional `view_range` [start, end] (1-based; end -1 for the end of \
         the file). A directory is listed two levels deep with sizes; a file is shown with line \
         numbers. Text over {max_view} characters is cut in the middle: read the rest with \
         view_range (on a directory it selects entries of the listing, numbered from 1).\n\
         - {create}\n\
         - str_replace: `path`, `old_str`, optional `new_str` (absent deletes `old_str`). \
         `old_str` must appear exactly once, verbatim, including whitespace.\n\
         - insert: `path`, `insert_line`, `insert_text`. Inserts the text after line \
         `insert_line` (0 for the start of the file).\n\
         - delete: `path`. Deletes a file, or a directory with everything in it (not \
         /memories itself).\n\
         - rename: `old_path`, `new_path`. Moves a file or directory; never overwrites an \
         existing destination.",
        max_view = config.max_view_chars,
    );
    Tool::new(TOOL_NAME, description, input_schema())
        .with_title("Memory")
        .with_annotations(
            ToolAnnotations::with_title("Memory")
                .read_only(false)
                .destructive(true)
                .idempotent(false)
                .open_world(false),
        )
}

/// The JSON Schema of the tool's arguments: the fields of the
/// `memory_20250818` commands, `command` required. Which other fields a
/// command needs is checked when it runs, with the same messages as `serve`.
fn input_schema() -> JsonObject {
    let schema = json!({
        "type": "object",
        "properties": {
            "command": {
                "type": "string",
                "enum": COMMAND_NAMES,
                "description": "The operation to run."
            },
            "path": {
                "type": "string",
                "description": "view, create, str_replace, insert, delete: the file or directory, `/memories` or below it, e.g. `/memories/notes.md`."
            },
            "view_range": {
                "type": "array",
                "items": {"type": "integer"},
                "minItems": 2,
                "maxItems": 2,
                "description": "view (optional): [start_line, end_line], 1-based and inclusive; end_line -1 shows to the end of the file. On a directory: entries of its listing."
            },
            "file_text": {
                "type": "string",
                "description": "create: the whole content of the file."
            },
            "old_str": {
                "type": "string",
                "description": "str_replace: the text to replace; it must appear exactly once in the file."
            },
            "new_str": {
                "type": "string",
                "description": "str_replace (optional): the replacement; absent deletes old_str."
            },
            "insert_line": {
                "type": "integer",
                "minimum": 0,
                "description": "insert: the line after which the text goes; 0 puts it at the start."
            },
            "insert_text": {
                "type": "string",
                "description": "insert: the text to insert."
            },
            "old_path": {
                "type": "string",
                "description": "rename: the file or directory to move."
            },
            "new_path": {
                "type": "string",
                "description": "rename: where it goes; must not exist."
            }
        },
        "required": ["command"]
    });
    match schema {
        Value::Object(map) => map,
        _ => unreachable!("the schema literal is an object"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_lists_every_command_and_field() {
        let schema = input_schema();
        assert_eq!(
            schema["properties"]["command"]["enum"],
            json!(COMMAND_NAMES)
        );
        let props = schema["properties"].as_object().unwrap();
        for field in crate::protocol::COMMAND_FIELDS {
            assert!(props.contains_key(field), "{field} missing");
        }
        assert_eq!(schema["required"], json!(["command"]));
    }

    #[test]
    fn description_follows_the_create_setting() {
        let mut config = VaultConfig::default();
        let refuse = memory_tool(&config);
        config.overwrite_on_create = true;
        let overwrite = memory_tool(&config);
        let text = |t: &Tool| t.description.clone().unwrap().into_owned();
        assert!(text(&refuse).contains("It is an error if the file exists"));
        assert!(text(&overwrite).contains("replacing an existing one"));
        assert!(text(&refuse).contains("ALWAYS VIEW YOUR MEMORY DIRECTORY"));
    }

    #[test]
    fn results_keep_their_text_and_error_flag() {
        let ok = to_mcp(ToolResult::ok("File created successfully at: /memories/a"));
        assert_eq!(ok.is_error, Some(false));
        let err = to_mcp(ToolResult::error(
            "Error: The path /memories/x does not exist",
        ));
        assert_eq!(err.is_error, Some(true));
        let v = serde_json::to_value(&err).unwrap();
        assert_eq!(v["content"][0]["type"], "text");
        assert_eq!(
            v["content"][0]["text"],
            "Error: The path /memories/x does not exist"
        );
        let img = to_mcp(ToolResult {
            content: Content::Image {
                media_type: "image/png",
                data_base64: "iVBORw0KGgo=".into(),
            },
            is_error: false,
        });
        let v = serde_json::to_value(&img).unwrap();
        assert_eq!(v["content"][0]["type"], "image");
        assert_eq!(v["content"][0]["mimeType"], "image/png");
        assert_eq!(v["content"][0]["data"], "iVBORw0KGgo=");
    }
}
