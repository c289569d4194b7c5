//! The MCP server handler: the four memory tools (run through `deermem::tools::dispatch`),
//! `memory_context`, and the read-only `memory://facts` resource, for one fixed identity
//! (stdio) or for the user an HTTP request authenticated as. The instructions describe the
//! tools actually offered; a known method whose params do not fit gets `-32602` with what is
//! wrong; every JSON-RPC error answered is logged at DEBUG.

use deermem_core::ports::MemoryManagerExt as _;
use std::sync::Arc;

use deermem::tools::{self, ToolDefinition};
use deermem_core::ports::{ContextRequest, MemoryManager, MemoryScope};
use deermem_core::{AgentName, ManagerError, UserId};
use rmcp::ErrorData as McpError;
use rmcp::model::{
    CacheScope, CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock,
    CustomRequest, CustomResult, ErrorCode, Implementation, JsonObject, ListResourcesResult,
    ListToolsResult, PaginatedRequestParams, ReadResourceRequestParams, ReadResourceResponse,
    ReadResourceResult, Resource, ResourceContents, ServerCapabilities, ServerConfig, Tool,
    ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{RoleServer, ServerHandler};
use serde_json::{Value, json};

use crate::jsonrpc::invalid_params_message;

/// Name of the MCP-only tool returning the injection block.
pub const MEMORY_CONTEXT: &str = "memory_context";

/// URI of the read-only resource listing the caller's facts.
pub const FACTS_RESOURCE_URI: &str = "memory://facts";

/// What `memory_context` returns when nothing is remembered: an empty wrapper, so the model
/// sees an explicit "no memory" rather than an empty string.
pub const EMPTY_CONTEXT_BLOCK: &str = "<memory>\n</memory>\n";

/// The identity a stdio server acts for: one user (and optionally one agent bucket) per process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct McpIdentity {
    /// The user whose memory the server reads and writes.
    pub user: UserId,
    /// The agent bucket; `None` is the reserved default bucket.
    pub agent: Option<AgentName>,
}

impl McpIdentity {
    /// The memory scope of this identity.
    pub fn scope(&self) -> MemoryScope {
        MemoryScope::new(Some(self.user.clone()), self.agent.clone())
    }
}

/// The user an HTTP request authenticated as; the HTTP layer puts it in the request's
/// extensions after checking the bearer token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthenticatedUser(pub UserId);

#[derive(Clone, Debug)]
enum IdentitySource {
    /// Every request acts for this scope (stdio).
    Fixed(MemoryScope),
    /// Each request acts for the user its bearer token names, in this agent bucket (HTTP).
    PerRequest { agent: Option<AgentName> },
}

/// The DeerMem MCP server handler over any memory backend.
#[derive(Clone, Debug)]
pub struct MemoryMcpServer {
    manager: Arc<dyn MemoryManager>,
    identity: IdentitySource,
}

impl MemoryMcpServer {
    /// A handler acting for one fixed identity (the stdio transport).
    pub fn for_identity(manager: Arc<dyn MemoryManager>, identity: &McpIdentity) -> Self {
        Self {
            manager,
            identity: IdentitySource::Fixed(identity.scope()),
        }
    }

    /// A handler acting for the [`AuthenticatedUser`] found in each HTTP request, in `agent`'s
    /// bucket. Requests without one are refused.
    pub fn for_http(manager: Arc<dyn MemoryManager>, agent: Option<AgentName>) -> Self {
        Self {
            manager,
            identity: IdentitySource::PerRequest { agent },
        }
    }

    /// The tools this backend can serve, as MCP tool definitions: `memory_search` when it
    /// searches, `memory_add`/`memory_update`/`memory_delete` when it has fact CRUD, and
    /// `memory_context` always.
    pub fn tools(&self) -> Vec<Tool> {
        let searches = self.manager.searcher().is_some();
        let fact_crud = self.manager.facts().is_some();
        let mut out: Vec<Tool> = tools::tool_definitions()
            .into_iter()
            .filter(|t| match t.name.as_str() {
                tools::MEMORY_SEARCH => searches,
                _ => fact_crud,
            })
            .map(|t| to_mcp_tool(&t))
            .collect();
        out.push(context_tool());
        out
    }

    /// The instructions for the tools [`MemoryMcpServer::tools`] offers, and nothing about the
    /// ones it does not.
    pub fn instructions(&self) -> String {
        let offered: Vec<String> = self
            .tools()
            .into_iter()
            .map(|t| t.name.into_owned())
            .collect();
        tools::instructions_for(
            &offered,
            &[&format!(
                "- {MEMORY_CONTEXT}: read what is already known about the user at the start of \
                 a conversation."
            )],
        )
    }

    fn scope(&self, context: &RequestContext<RoleServer>) -> Option<MemoryScope> {
        match &self.identity {
            IdentitySource::Fixed(scope) => Some(scope.clone()),
            IdentitySource::PerRequest { agent } => context
                .extensions
                .get::<http::request::Parts>()
                .and_then(|parts| parts.extensions.get::<AuthenticatedUser>())
                .map(|user| MemoryScope::new(Some(user.0.clone()), agent.clone())),
        }
    }

    async fn context_block(&self, scope: MemoryScope) -> CallToolResult {
        let request = ContextRequest {
            scope,
            thread_id: None,
        };
        match self.manager.get_context_block(request).await {
            Ok(ctx) if ctx.block.is_empty() => {
                CallToolResult::success(vec![ContentBlock::text(EMPTY_CONTEXT_BLOCK)])
            }
            Ok(ctx) => CallToolResult::success(vec![ContentBlock::text(ctx.block)]),
            Err(e) => tool_error(e.to_string()),
        }
    }

    async fn facts_json(&self, scope: MemoryScope) -> Result<String, McpError> {
        match self.manager.get_memory(scope).await {
            Ok(document) => {
                let count = document.facts.len();
                serde_json::to_value(&document.facts)
                    .and_then(|facts| {
                        serde_json::to_string(&json!({ "facts": facts, "count": count }))
                    })
                    .map_err(|e| {
                        McpError::internal_error(format!("could not encode the facts: {e}"), None)
                    })
            }
            Err(ManagerError::Unsupported { .. }) => Err(McpError::resource_not_found(
                format!(
                    "memory backend {} cannot list facts, so {FACTS_RESOURCE_URI} is unavailable",
                    self.manager.name()
                ),
                None,
            )),
            Err(e) => Err(McpError::internal_error(e.to_string(), None)),
        }
    }
}

fn to_mcp_tool(def: &ToolDefinition) -> Tool {
    let schema = match &def.input_schema {
        Value::Object(map) => map.clone(),
        _ => JsonObject::new(),
    };
    let read_only = def.name == tools::MEMORY_SEARCH;
    let annotations = ToolAnnotations::new()
        .read_only(read_only)
        .destructive(def.name == tools::MEMORY_DELETE || def.name == tools::MEMORY_UPDATE)
        .idempotent(read_only || def.name == tools::MEMORY_DELETE)
        .open_world(false);
    Tool::new(def.name.clone(), def.description.clone(), Arc::new(schema))
        .with_annotations(annotations)
}

fn context_tool() -> Tool {
    let schema = match json!({
        "type": "object",
        "properties": {},
        "required": [],
        "additionalProperties": false
    }) {
        Value::Object(map) => map,
        _ => JsonObject::new(),
    };
    Tool::new(
        MEMORY_CONTEXT,
        "Get the memory block the assistant would be given at the start of a conversation: \
         the user's summaries (work, personal, current focus, history) and their most \
         important facts, wrapped in <memory> tags. Call it once at the start to learn what is \
         already known about the user.",
        Arc::new(schema),
    )
    .with_annotations(
        ToolAnnotations::new()
            .read_only(true)
            .idempotent(true)
            .open_world(false),
    )
}

/// A tool error, `{"error": message}` as the dispatcher answers them.
fn tool_error(message: impl Into<String>) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(
        tools::ToolOutput::error(message).text,
    )])
}

impl ServerHandler for MemoryMcpServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .build(),
        )
        .with_server_info(Implementation::new("deermem", env!("CARGO_PKG_VERSION")))
        .with_instructions(self.instructions())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(self.tools()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tools().into_iter().find(|t| t.name == name)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let name = request.name.as_ref();
        if name != MEMORY_CONTEXT && !tools::TOOL_NAMES.contains(&name) {
            return Err(answered(McpError::invalid_params(
                format!(
                    "Unknown tool: {}. Available tools: {}, {MEMORY_CONTEXT}",
                    deermem_pycompat::py::prefix_chars(name, 200),
                    tools::TOOL_NAMES.join(", ")
                ),
                None,
            )));
        }
        let Some(scope) = self.scope(&context) else {
            return Ok(tool_error("the request carries no authenticated user").into());
        };
        if name == MEMORY_CONTEXT {
            return Ok(self.context_block(scope).await.into());
        }
        let arguments = request.arguments.map(Value::Object).unwrap_or(Value::Null);
        let output = tools::dispatch(self.manager.as_ref(), &scope, name, &arguments).await;
        let content = vec![ContentBlock::text(output.text)];
        let result = if output.is_error {
            CallToolResult::error(content)
        } else {
            CallToolResult::success(content)
        };
        Ok(result.into())
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let mut resources = Vec::new();
        if self.manager.reader().is_some() {
            resources.push(
                Resource::new(FACTS_RESOURCE_URI, "facts")
                    .with_title("Remembered facts")
                    .with_description(
                        "The facts remembered about you in this memory bucket, as JSON \
                         ({\"facts\": [...], \"count\": n}). Read-only.",
                    )
                    .with_mime_type("application/json"),
            );
        }
        Ok(ListResourcesResult::with_all_items(resources).with_cache_scope(CacheScope::Private))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        if request.uri != FACTS_RESOURCE_URI {
            return Err(answered(McpError::resource_not_found(
                format!(
                    "Unknown resource: {}. Available: {FACTS_RESOURCE_URI}",
                    deermem_pycompat::py::prefix_chars(&request.uri, 200)
                ),
                None,
            )));
        }
        let Some(scope) = self.scope(&context) else {
            return Err(answered(McpError::invalid_request(
                "the request carries no authenticated user",
                None,
            )));
        };
        let text = self.facts_json(scope).await.map_err(answered)?;
        let contents = vec![
            ResourceContents::text(text, FACTS_RESOURCE_URI).with_mime_type("application/json"),
        ];
        Ok(ReadResourceResult::new(contents)
            .with_cache_scope(CacheScope::Private)
            .with_ttl_ms(0)
            .into())
    }

    /// A request rmcp could not read as a method it knows: a known MCP method whose params do
    /// not fit it (`tools/call` with `arguments` as an array, `resources/read` without `uri`)
    /// is `-32602` with what is wrong; anything else is "Method not found".
    async fn on_custom_request(
        &self,
        request: CustomRequest,
        _context: RequestContext<RoleServer>,
    ) -> Result<CustomResult, McpError> {
        let method = deermem_pycompat::py::prefix_chars(&request.method, 200);
        Err(answered(
            match invalid_params_message(&request.method, request.params.as_ref()) {
                Some(message) => McpError::invalid_params(message, None),
                None => McpError::new(
                    ErrorCode::METHOD_NOT_FOUND,
                    format!("Method not found: {method}"),
                    None,
                ),
            },
        ))
    }
}

/// Logs a JSON-RPC error the server answers (at DEBUG: the request was the client's mistake)
/// and passes it on.
fn answered(error: McpError) -> McpError {
    tracing::debug!(code = error.code.0, message = %error.message, "answered a JSON-RPC error");
    error
}
