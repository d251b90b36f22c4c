//! `/mcp`: the `memory` tool of `memvault mcp` over MCP streamable HTTP
//! (rmcp, stateless, JSON responses). The tenant of each call is the one
//! [`mcp_gate`](super::http) authenticated for that very HTTP request: rmcp
//! hands the request's parts to the handler, and nothing in the MCP
//! messages (arguments, session ids) chooses a tenant.

use std::sync::Arc;

use axum::http::request::Parts;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ListToolsResult, PaginatedRequestParams, ServerConfig,
    Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ErrorData, ServerHandler};
use serde_json::Value;

use super::http::{App, Authed, INLINE_BODY, Refusal, on_vault};
use super::pool::{PoolError, Slot};
use crate::cli::mcp::{TOOL_NAME, memory_tool, server_info, to_mcp};
use crate::memory::ToolResult;
use crate::vault::{Attribution, VaultConfig};

/// The MCP handler of one HTTP request.
#[derive(Clone)]
pub struct TenantMcp {
    pub app: Arc<App>,
    pub tool: Tool,
}

impl TenantMcp {
    pub fn new(app: Arc<App>) -> TenantMcp {
        TenantMcp {
            app,
            tool: memory_tool(&VaultConfig::default()),
        }
    }
}

fn internal(message: &'static str) -> ErrorData {
    ErrorData::internal_error(message, None)
}

const UNAUTHENTICATED: &str = "the request reached the tool unauthenticated";

/// The HTTP request an MCP call came in, and the tenant the gate
/// authenticated for it.
fn authenticated(context: &RequestContext<RoleServer>) -> Result<(&Parts, Authed), ErrorData> {
    let parts = context
        .extensions
        .get::<Parts>()
        .ok_or_else(|| internal("the request reached the tool without its HTTP request"))?;
    let who = parts
        .extensions
        .get::<Authed>()
        .cloned()
        .ok_or_else(|| internal(UNAUTHENTICATED))?;
    Ok((parts, who))
}

/// The labels the gate checked from the request's headers (with the
/// token), and the tenant's slot it admitted the request to (its rate
/// counted once, there).
fn admitted(parts: &Parts) -> Result<(Attribution, Arc<Slot>), ErrorData> {
    let attribution = parts
        .extensions
        .get::<Attribution>()
        .cloned()
        .ok_or_else(|| internal(UNAUTHENTICATED))?;
    let slot = parts
        .extensions
        .get::<Arc<Slot>>()
        .cloned()
        .ok_or_else(|| internal(UNAUTHENTICATED))?;
    Ok((attribution, slot))
}

impl ServerHandler for TenantMcp {
    fn get_info(&self) -> ServerConfig {
        server_info()
    }

    /// The tool as the tenant's own vault describes it (its settings:
    /// whether `create` overwrites, the filter's mode, the view cap), as
    /// `memvault mcp` on that vault does.
    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let (parts, who) = authenticated(&context)?;
        let (attribution, slot) = admitted(parts)?;
        let described = on_vault(&self.app, &slot, attribution, &who, true, |open| {
            memory_tool(open.vault.config())
        })
        .await;
        match described {
            Ok(Ok(tool)) => Ok(ListToolsResult::with_all_items(vec![tool])),
            _ => Err(internal(
                "this tenant's memory could not be opened to describe its tool; try again",
            )),
        }
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        (name == TOOL_NAME).then(|| self.tool.clone())
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let (parts, who) = authenticated(&context)?;
        if let Some(Refusal(message)) = parts.extensions.get::<Refusal>() {
            return Ok(to_mcp(ToolResult::error(message.clone())).into());
        }
        if request.name != TOOL_NAME {
            return Err(ErrorData::invalid_params(
                "unknown tool: this server has one tool, `memory`",
                None,
            ));
        }
        let (attribution, slot) = admitted(parts)?;
        let input = Value::Object(request.arguments.unwrap_or_default());
        // A small request may run on the connection's thread (see
        // `on_vault`); the gate read the body, so its length is known.
        let inline = parts
            .headers
            .get(axum::http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok())
            .is_some_and(|n| n <= INLINE_BODY);
        let slot_quota = slot.quota();
        let result = on_vault(&self.app, &slot, attribution, &who, inline, move |open| {
            open.with_quota(slot_quota, |open| {
                open.memory.execute_json(&mut open.vault, &input)
            })
            .unwrap_or_else(|why| ToolResult::error(format!("Error: {why}")))
        })
        .await
        .map_err(|_| internal("the memory command failed unexpectedly"))?;
        match result {
            Ok(r) => Ok(to_mcp(r).into()),
            Err(PoolError::Gone) => {
                Err(ErrorData::invalid_request("this tenant was removed", None))
            }
            Err(PoolError::Unavailable(m)) => {
                Ok(to_mcp(ToolResult::error(format!("Error: the memory vault: {m}"))).into())
            }
        }
    }
}
