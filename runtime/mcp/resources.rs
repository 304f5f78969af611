//! What a server offers besides tools: its resources (`resources/list`, `resources/read`) and
//! prompts (`prompts/list`, `prompts/get`), read on a [`Connection`]'s session and answered as
//! JSON in the wire's shape (paging followed, as for tools). A resource's binary contents become
//! files (as an embedded resource in a tool's result does, [`super::result::content_to_file`]).

use std::time::Duration;

use rmcp::model::{
    ClientRequest, GetPromptRequest, GetPromptRequestParams, ListPromptsRequest,
    ListResourceTemplatesRequest, ListResourcesRequest, PaginatedRequestParams,
    ReadResourceRequest, ReadResourceRequestParams, ServerResult,
};
use serde_json::{Map, Value};

use super::session::MAX_PAGES;
use super::{Connection, McpError};
use crate::vocab::FileRef;

/// How long one list page, a read or a prompt may take.
const TIMEOUT: Duration = Duration::from_secs(60);

/// One item of `resources/read`: its text, or its bytes as a file.
#[derive(Debug, Clone)]
pub struct Contents {
    pub uri: String,
    pub mime_type: Option<String>,
    pub text: Option<String>,
    pub file: Option<FileRef>,
}

/// Which list to page through.
#[derive(Clone, Copy)]
enum List {
    Resources,
    Templates,
    Prompts,
}

impl List {
    fn method(self) -> &'static str {
        match self {
            List::Resources => "resources/list",
            List::Templates => "resources/templates/list",
            List::Prompts => "prompts/list",
        }
    }
}

impl Connection {
    /// Every resource the server lists (`uri`, `name`, `description`, `mimeType` ...).
    pub async fn list_resources(&self) -> Result<Vec<Value>, McpError> {
        self.pages(List::Resources).await
    }

    /// Every resource template the server lists (`uriTemplate`, `name` ...).
    pub async fn list_resource_templates(&self) -> Result<Vec<Value>, McpError> {
        self.pages(List::Templates).await
    }

    /// Every prompt the server lists (`name`, `description`, `arguments`).
    pub async fn list_prompts(&self) -> Result<Vec<Value>, McpError> {
        self.pages(List::Prompts).await
    }

    async fn pages(&self, list: List) -> Result<Vec<Value>, McpError> {
        let mut items = Vec::new();
        let mut cursor: Option<String> = None;
        let mut seen = std::collections::HashSet::new();
        for _ in 0..MAX_PAGES {
            let params = PaginatedRequestParams::default().with_cursor(cursor.take());
            let req = match list {
                List::Resources => {
                    ClientRequest::ListResourcesRequest(ListResourcesRequest::with_param(params))
                }
                List::Templates => ClientRequest::ListResourceTemplatesRequest(
                    ListResourceTemplatesRequest::with_param(params),
                ),
                List::Prompts => {
                    ClientRequest::ListPromptsRequest(ListPromptsRequest::with_param(params))
                }
            };
            let (page, next) = match (list, self.ask(req, TIMEOUT).await?) {
                (List::Resources, ServerResult::ListResourcesResult(r)) => {
                    (serde_json::to_value(&r.resources), r.next_cursor)
                }
                (List::Templates, ServerResult::ListResourceTemplatesResult(r)) => {
                    (serde_json::to_value(&r.resource_templates), r.next_cursor)
                }
                (List::Prompts, ServerResult::ListPromptsResult(r)) => {
                    (serde_json::to_value(&r.prompts), r.next_cursor)
                }
                _ => return Err(self.unexpected("a list request")),
            };
            if let Ok(Value::Array(page)) = page {
                items.extend(page);
            }
            match super::session::next_cursor(&mut seen, next, self.name(), list.method()) {
                Some(c) => cursor = Some(c),
                None => return Ok(items),
            }
        }
        tracing::warn!(target: "colony::mcp", server = %self.name(),
            "a list still had more after {MAX_PAGES} pages; the rest is left out");
        Ok(items)
    }

    /// `resources/read`: the contents at `uri`, text as text and bytes as files.
    pub async fn read_resource(&self, uri: &str) -> Result<Vec<Contents>, McpError> {
        let req = ClientRequest::ReadResourceRequest(ReadResourceRequest::new(
            ReadResourceRequestParams::new(uri),
        ));
        let ServerResult::ReadResourceResult(r) = self.ask(req, TIMEOUT).await? else {
            return Err(self.unexpected("resources/read"));
        };
        let json = serde_json::to_value(&r.contents).unwrap_or_default();
        let items = json.as_array().cloned().unwrap_or_default();
        Ok(items
            .iter()
            .enumerate()
            .map(|(n, item)| contents(item, n))
            .collect())
    }

    /// `prompts/get`: the prompt's `description` and `messages` (each `{ role, content }`).
    pub async fn get_prompt(
        &self,
        name: &str,
        arguments: Map<String, Value>,
    ) -> Result<Value, McpError> {
        let mut params = GetPromptRequestParams::new(name);
        if !arguments.is_empty() {
            params = params.with_arguments(arguments);
        }
        let req = ClientRequest::GetPromptRequest(GetPromptRequest::new(params));
        match self.ask(req, TIMEOUT).await? {
            ServerResult::GetPromptResult(r) => Ok(serde_json::to_value(&r).unwrap_or_default()),
            _ => Err(self.unexpected("prompts/get")),
        }
    }
}

/// One read item: text stays text (with any secret the server was given redacted); a blob
/// becomes a file.
fn contents(item: &Value, n: usize) -> Contents {
    let field = |k: &str| item.get(k).and_then(Value::as_str).map(str::to_string);
    let uri = field("uri").unwrap_or_default();
    let mime_type = field("mimeType");
    if let Some(text) = field("text") {
        return Contents {
            uri,
            mime_type,
            text: Some(crate::secrets::redact(&text)),
            file: None,
        };
    }
    let block = serde_json::json!({ "type": "resource", "resource": item });
    Contents {
        uri,
        mime_type,
        text: None,
        file: super::result::content_to_file(&block, n),
    }
}
