//! The MCP client: tools that live in MCP servers, remote (Streamable HTTP) or local (a child
//! process over stdio), offered to turns beside Lua and native tools.
//!
//! - [`spec`]: what a server is (a URL with headers, or a command with args, env and cwd) and how
//!   one is read from the config file, a Lua table or a Claude Desktop / `.mcp.json` file.
//! - [`session`]: one live connection on `rmcp` (handshake, paging `tools/list`, `tools/call` with
//!   a deadline and `notifications/cancelled`, re-initialising a dead session, restarting a dead child).
//! - [`server_group`]: a stdio server's processes, a group of their own, ended whole however
//!   colony stops.
//! - [`http_client`]: rmcp's HTTP client, reading the TypeScript SDK's 400 for a dead session as
//!   the 404 the spec asks for.
//! - [`handler`]: our side of the protocol: `ping`, `roots/list`, `elicitation/create`, the
//!   server's log lines.
//! - [`elicit`]: a server's questions for our user, answered by the program's elicitor (an
//!   `on_elicit` hook) or declined.
//! - [`sampling`]: a server's `sampling/createMessage`, answered by the use-type the program
//!   names (`sampling = "helper"`) through the core, or refused.
//! - [`naming`]: `<server>__<tool>` names that every provider accepts, and which are dropped.
//! - [`result`]: a `tools/call` result as the text a model reads.
//! - [`toolset`]: a turn's servers opened at once, their tools made into [`crate::turn::ToolDef`]s,
//!   and the per-server report; `dynamic` adds the `mcp_connect` / `mcp_disconnect` tools.
//! - [`oauth`]: OAuth 2.1 for remote servers (rmcp's `auth`): tokens in the state directory,
//!   the authorizer that sends a person to the sign-in page, `[mcp.NAME.auth]`.
//! - [`enterprise`]: enterprise-managed authorization (cross-app access): the identity
//!   provider's ID token exchanged for an ID-JAG, and that for the server's token.
//! - [`resources`]: a server's resources (`resources/list`, `resources/read`, binary contents
//!   as files) and prompts (`prompts/list`, `prompts/get`).
//! - [`resource_tools`]: a server's resources as read-only tools of a turn (`resources = true`).
//! - [`cache`]: the `colony tools refresh` cache of every configured server's tools.
//! - [`server`]: the other direction: colony as an MCP server of a program's exports.

pub mod cache;
pub mod child;
pub mod dynamic;
pub mod elicit;
pub mod enterprise;
pub mod handler;
pub mod http_client;
pub mod naming;
pub mod oauth;
pub mod relisted;
pub mod resource_tools;
pub mod resources;
pub mod result;
pub mod sampling;
pub mod server;
pub mod server_group;
pub mod session;
pub mod spec;
pub mod toolset;

pub use session::Connection;
pub use spec::{ServerSpec, Transport};

/// The revisions we speak, newest first; we ask for the first.
pub const REVISIONS: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26"];

/// What can go wrong between us and a server.
#[derive(Debug, Clone, thiserror::Error)]
pub enum McpError {
    /// The server could not be reached or started, or the handshake failed.
    #[error("{server}: cannot connect: {message}")]
    Connect { server: String, message: String },
    /// The server answered a revision we do not speak.
    #[error("{server}: the server speaks MCP {version}, which colony does not (it speaks {})", REVISIONS.join(", "))]
    UnsupportedVersion { server: String, version: String },
    /// A JSON-RPC error answer.
    #[error("{server}: error {code}: {message}")]
    Rpc {
        server: String,
        code: i32,
        message: String,
    },
    /// The call's deadline passed (the server was told to cancel it).
    #[error("{server}: no answer within {seconds} s (the call was cancelled)")]
    Timeout { server: String, seconds: f64 },
    /// The connection went away (a child that died, a server that closed).
    #[error("{server}: the connection closed: {message}")]
    Closed { server: String, message: String },
    /// A server spec or config entry that cannot be used.
    #[error("{0}")]
    Config(String),
}

impl McpError {
    /// The `kind` a Lua caller sees.
    pub fn kind(&self) -> &'static str {
        match self {
            McpError::Connect { .. } => "connect_error",
            McpError::UnsupportedVersion { .. } => "unsupported_version",
            McpError::Rpc { .. } => "rpc_error",
            McpError::Timeout { .. } => "timeout",
            McpError::Closed { .. } => "closed",
            McpError::Config(_) => "config",
        }
    }
}
