//! Every refusal the service answers is JSON, `{ "error": kind, "message": ... }`: a script
//! that reads the API's answers reads its errors the same way, whether a handler refused the
//! request or the routing did (no such path, another method, a body over the limit).

use axum::extract::Request;
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// An error answer: `{ "error": kind, "message": ... }`.
pub fn refuse(status: StatusCode, kind: &str, message: &str) -> Response {
    (
        status,
        axum::Json(serde_json::json!({ "error": kind, "message": message })),
    )
        .into_response()
}

/// What a body over the service's limit is told, however the limit was found (a
/// `Content-Length`, or a chunked body while it was read).
pub fn too_large_message() -> String {
    format!(
        "the request body is over the service's limit of {} bytes",
        super::BODY_LIMIT
    )
}

/// Answers in JSON the refusals that do not come from a handler: axum's empty `404` and
/// `405`, and the body limit's plain-text `413`. `/mcp` is left as its MCP transport answers.
pub async fn as_json(request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let response = next.run(request).await;
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error())
        || path == "/mcp"
        || path.starts_with("/mcp/")
        || is_json(&response)
    {
        return response;
    }
    let (kind, message) = match status {
        StatusCode::NOT_FOUND => ("not_found", format!("no such path: {method} {path}")),
        StatusCode::METHOD_NOT_ALLOWED => (
            "method_not_allowed",
            format!("{path} does not take {method}"),
        ),
        StatusCode::PAYLOAD_TOO_LARGE => ("too_large", too_large_message()),
        _ => (
            if status.is_server_error() {
                "internal"
            } else {
                "bad_request"
            },
            status.canonical_reason().unwrap_or("refused").to_string(),
        ),
    };
    let mut answer = refuse(status, kind, &message);
    // The methods a path takes, and a wait, stay with the answer.
    for name in [header::ALLOW, header::RETRY_AFTER] {
        if let Some(value) = response.headers().get(&name) {
            answer.headers_mut().insert(name, value.clone());
        }
    }
    answer
}

fn is_json(response: &Response) -> bool {
    response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("application/json"))
}
