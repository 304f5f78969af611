//! Our side of the protocol, what the server may ask of us: `ping` (answered `{}` by rmcp's
//! default), `roots/list` with the configured roots, and the log lines a server sends, which go to
//! our log under the server's name. Anything else gets rmcp's `-32601`; progress for tokens we do
//! not know is dropped by rmcp's default.

#![allow(deprecated)] // roots and logging are deprecated in the 2026 revision; we speak 2025's.

use rmcp::ClientHandler;
use rmcp::model::{
    ClientCapabilities, ClientConfig, Implementation, ListRootsResult,
    LoggingMessageNotificationParam, ProtocolVersion, Root,
};
use rmcp::service::{NotificationContext, RequestContext, RoleClient};

/// One per connection: it knows the server's name (for the log) and the roots to give.
#[derive(Clone)]
pub struct Handler {
    pub server: String,
    pub roots: Vec<String>,
}

impl ClientHandler for Handler {
    fn get_info(&self) -> ClientConfig {
        let mut caps = ClientCapabilities::default();
        caps.roots = Some(Default::default());
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
}
