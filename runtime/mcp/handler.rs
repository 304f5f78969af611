//! Our side of the protocol, what the server may ask of us: `ping` (answered `{}` by rmcp's
//! default), `roots/list` with the configured roots, `elicitation/create` (answered by the
//! program's elicitor, declined without one; the capability is offered only with one), and the
//! `sampling/createMessage` (answered by the use-type the program named, refused without one; the
//! capability is offered only with one), and the
//! log lines a server sends, which go to our log under the server's name, and
//! `notifications/tools/list_changed`, which marks the connection's tools as changed
//! ([`super::session::ToolsChanged`]). Anything else gets
//! rmcp's `-32601`; progress for tokens we do not know is dropped by rmcp's default.

#![allow(deprecated)] // roots and logging are deprecated in the 2026 revision; we speak 2025's.

use rmcp::ClientHandler;
use rmcp::model::{
    ClientCapabilities, ClientConfig, CreateMessageRequestParams, CreateMessageResult,
    ElicitRequestParams, ElicitResult, ElicitationAction, ElicitationCapability, ErrorCode,
    FormElicitationCapability, Implementation, ListRootsResult, LoggingMessageNotificationParam,
    ProtocolVersion, Root, UrlElicitationCapability,
};
use rmcp::service::{NotificationContext, RequestContext, RoleClient};

/// One per connection: it knows the server's name (for the log) and the roots to give.
#[derive(Clone)]
pub struct Handler {
    pub server: String,
    pub roots: Vec<String>,
    pub elicit: Option<super::elicit::Hook>,
    pub sampling: Option<super::sampling::Hook>,
    pub tools_changed: std::sync::Arc<super::session::ToolsChanged>,
}

impl ClientHandler for Handler {
    fn get_info(&self) -> ClientConfig {
        let mut caps = ClientCapabilities::default();
        caps.roots = Some(Default::default());
        if self.elicit.is_some() {
            caps.elicitation = Some(
                ElicitationCapability::new()
                    .with_form(FormElicitationCapability::new())
                    .with_url(UrlElicitationCapability::new()),
            );
        }
        if self.sampling.is_some() {
            caps.sampling = Some(Default::default());
        }
        ClientConfig::new(
            caps,
            Implementation::new("colony", env!("CARGO_PKG_VERSION")),
        )
        .with_protocol_version(ProtocolVersion::V_2025_11_25)
    }

    async fn list_roots(
        &self,
        _context: RequestContext<RoleClient>,
    ) -> Result<ListRootsResult, rmcp::ErrorData> {
        Ok(ListRootsResult::new(
            self.roots.iter().map(Root::new).collect(),
        ))
    }

    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        tracing::info!(target: "colony::mcp", server = %self.server, level = ?params.level, "{}", params.data);
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        tracing::info!(target: "colony::mcp", server = %self.server, "its tools changed");
        self.tools_changed.bump();
    }

    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, rmcp::ErrorData> {
        use super::elicit;
        let Some(hook) = &self.elicit else {
            tracing::info!(target: "colony::mcp", server = %self.server,
                "declined an elicitation request (no on_elicit hook)");
            return Ok(ElicitResult::new(ElicitationAction::Decline));
        };
        let params = serde_json::to_value(&request).unwrap_or_default();
        let asked = elicit::request(&self.server, &params);
        let schema = asked.schema.clone();
        let answer = hook.0.elicit(asked).await.map_err(|e| {
            tracing::warn!(target: "colony::mcp", server = %self.server, "on_elicit: {e}");
            rmcp::ErrorData::internal_error(format!("the client's elicitation failed: {e}"), None)
        })?;
        let answer = elicit::with_defaults(answer, schema.as_ref());
        let action = match answer.action.as_str() {
            "accept" => ElicitationAction::Accept,
            "cancel" => ElicitationAction::Cancel,
            _ => ElicitationAction::Decline,
        };
        let mut result = ElicitResult::new(action);
        if let Some(content) = answer.content {
            result = result.with_content(serde_json::Value::Object(content));
        }
        Ok(result)
    }

    async fn create_message(
        &self,
        params: CreateMessageRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, rmcp::ErrorData> {
        let Some(hook) = &self.sampling else {
            tracing::info!(target: "colony::mcp", server = %self.server,
                "refused a sampling request (sampling is not enabled for this server)");
            // -1: the user (here, the program) rejected the request.
            return Err(rmcp::ErrorData::new(
                ErrorCode(-1),
                format!(
                    "sampling is not enabled for server {}: the program names a use-type to answer (sampling = \"helper\")",
                    self.server
                ),
                None,
            ));
        };
        let params = serde_json::to_value(&params).unwrap_or_default();
        // A sample of no tokens is no request a model can answer (the config refuses
        // `max_tokens = 0` for the same reason): it was passed on to the provider.
        if params.get("maxTokens").and_then(serde_json::Value::as_u64) == Some(0) {
            return Err(rmcp::ErrorData::invalid_params(
                "maxTokens = 0: ask for at least one token",
                None,
            ));
        }
        let answer = hook.0.sample(params).await.map_err(|e| {
            tracing::warn!(target: "colony::mcp", server = %self.server, "sampling: {e}");
            rmcp::ErrorData::internal_error(format!("the client's sampling failed: {e}"), None)
        })?;
        serde_json::from_value(answer).map_err(|e| {
            rmcp::ErrorData::internal_error(format!("the client's sampling answer: {e}"), None)
        })
    }
}
