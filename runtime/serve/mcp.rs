//! `/mcp` on `colony serve`: the hosted programs' exports over Streamable HTTP, on `rmcp`'s
//! server (sessions with `Mcp-Session-Id`, SSE answers with priming events and `Last-Event-ID`
//! resumption, `DELETE` to end a session, `405` for what is not offered). It shares the
//! service's bearer tokens, `Origin` rule and per-caller rate limits; a request refused by any is
//! audited in every program's log, and a caller admitted is named in the audit lines of its
//! calls by its token's name (`mcp:alice`; `mcp:token` for a single unnamed token,
//! `mcp:loopback` without one). A session answers only the caller that opened it
//! ([`super::mcp_sessions`]).

use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{Next, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

use super::auth::{self, Guard};
use super::mcp_sessions::{MOST_PER_CALLER, Owners, SESSION_HEADER, Standing};

/// A place held for a session being opened ([`Owners::reserve`]), given back when dropped.
struct Opening {
    owners: std::sync::Arc<Owners>,
    caller: String,
}

impl Drop for Opening {
    fn drop(&mut self) {
        self.owners.opening_ended(&self.caller);
    }
}
use super::service::Service;
use super::{protected_resource, rate};
use crate::mcp::server::{Caller, Offer, Programs, Server, Streams, call};

/// The programs the service hosts now (a restarted one brings its new exports).
struct Hosted(Arc<Service>);

impl Programs for Hosted {
    fn offers(&self) -> Vec<Offer> {
        self.0
            .programs()
            .into_iter()
            .filter_map(|slot| slot.hosted().map(|h| h.offer(&slot.name)))
            .collect()
    }

    fn lineup(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.0.lineup())
    }
}

#[derive(Clone)]
struct Gate {
    guard: Guard,
    programs: Arc<Hosted>,
    /// Which caller opened each session: it answers that caller alone.
    owners: Arc<Owners>,
}

impl Gate {
    /// Audits a refusal in every program's log, under `who` (`http` before a token is known).
    fn audit_refusal(&self, who: &str, kind: &str, message: &str) {
        let who = Caller(who.into());
        for offer in self.programs.offers() {
            call::refused(&offer.route, &who, "(mcp)", kind, message);
        }
    }
}

/// The `/mcp` route, to merge into the service's router.
pub fn routes(service: Arc<Service>, guard: Guard) -> Router<Arc<Service>> {
    let programs = Arc::new(Hosted(service));
    let caller = Caller(
        if guard.has_token() {
            "token"
        } else {
            "loopback"
        }
        .into(),
    );
    let streams = Arc::new(Streams::default());
    let factory = {
        let (programs, streams) = (programs.clone(), streams.clone());
        move || {
            Ok(Server::new(programs.clone(), caller.clone(), "colony")
                .with_streams(streams.clone()))
        }
    };
    // The `Host` rule is the API's (`gate`): rmcp's own list of loopback names refused
    // `localhost.` and `127.0.0.2`, which the API took, so one service answered a name on
    // one path and refused it on the other.
    // And the body limit is the service's (rmcp's own is half of it, and said in plain text).
    let config = StreamableHttpServerConfig::default()
        .disable_allowed_hosts()
        .with_max_request_body_bytes(super::BODY_LIMIT);
    let mcp = StreamableHttpService::new(factory, streams, config);
    Router::new()
        .route_service("/mcp", mcp)
        .layer(from_fn_with_state(
            Gate {
                guard,
                programs,
                owners: Arc::default(),
            },
            gate,
        ))
}

/// The token and the `Origin` rule, audited when they refuse.
async fn gate(State(gate): State<Gate>, mut request: Request, next: Next) -> Response {
    let presented = gate.guard.presented(request.headers());
    let refusal = if auth::foreign_origin(request.headers()) {
        let origin = request
            .headers()
            .get(header::ORIGIN)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("?")
            .to_string();
        Some((
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("a request from another origin ({origin}) was refused"),
        ))
    } else if let Some(host) = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| !presented.asked && !auth::loopback_host(h))
    {
        // Without a token the service listens on loopback only: a page that renamed itself to
        // point there (DNS rebinding) sends its own name.
        Some((
            StatusCode::FORBIDDEN,
            "forbidden",
            format!(
                "a request to {host:?} was refused: a service without a token answers only its \
                 loopback names (localhost, 127.0.0.1, [::1]); give it a token (--token-file) to \
                 reach it by another name"
            ),
        ))
    } else if !presented.admitted() {
        let what = if auth::carries_a_token(request.headers()) {
            "a request with a wrong bearer token was refused"
        } else {
            "a request without a bearer token was refused"
        };
        Some((StatusCode::UNAUTHORIZED, "unauthorized", what.to_string()))
    } else {
        None
    };
    if let Some((status, kind, message)) = refusal {
        gate.audit_refusal("http", kind, &message);
        let mut answer = super::refusal::refuse(status, kind, &message).into_response();
        if status == StatusCode::UNAUTHORIZED {
            let challenge = protected_resource::challenge(&gate.programs.0, request.headers());
            answer
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, challenge);
        }
        return answer;
    }
    // The caller is its token's name (`token` for a single unnamed one), `loopback` without.
    let name = presented.caller;
    let limited = name.as_deref().unwrap_or(auth::Caller::LOCAL);
    if let Some(answer) = rate::over(&gate.programs.0, limited) {
        gate.audit_refusal(
            name.as_deref().unwrap_or("loopback"),
            "rate_limited",
            &format!("a request of caller {limited:?} over its rate limit was refused"),
        );
        return answer;
    }
    let caller = name.unwrap_or_else(|| "loopback".into());
    let session = request
        .headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    if let Some(id) = &session {
        let standing = gate.owners.standing(id, &caller);
        if standing == Standing::Foreign {
            gate.audit_refusal(
                &caller,
                "forbidden",
                "a request on a session another caller opened was refused",
            );
        }
        // Answered as a session that is not there, which it is not for this caller: an MCP
        // client then opens one of its own.
        if standing != Standing::Own {
            return super::refusal::refuse(
                StatusCode::NOT_FOUND,
                "not_found",
                "no such session: it has ended, or was never opened by this caller; \
                 initialize a new one",
            );
        }
    }
    // A request without a session opens one: a caller holding its most is refused, not let
    // grow the service's memory without bound.
    let opening = session.is_none() && request.method() == axum::http::Method::POST;
    if opening && !gate.owners.reserve(&caller) {
        // One audit line a period: a flood refused must not become a flood of store writes.
        static SAID: crate::said::SaidEvery = crate::said::SaidEvery::new();
        if let Some(unsaid) = SAID.say() {
            gate.audit_refusal(
                &caller,
                "too_many_sessions",
                &format!(
                    "a request to open one more MCP session was refused{}",
                    crate::said::also(unsaid)
                ),
            );
        }
        let mut answer = super::refusal::refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            "too_many_sessions",
            &format!(
                "this caller holds {MOST_PER_CALLER} open MCP sessions, the most it may: end \
                 one (DELETE with its Mcp-Session-Id) or let one idle for five minutes"
            ),
        )
        .into_response();
        answer
            .headers_mut()
            .insert(header::RETRY_AFTER, header::HeaderValue::from_static("60"));
        return answer;
    }
    request.extensions_mut().insert(Caller(caller.clone()));
    let admission = auth::Admission::of(&gate.guard, request.headers());
    let method = request.method().clone();
    let json = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("application/json"));
    // The place held for a session being opened is given back however the request ends (its
    // future dropped with the connection too).
    let _opening = opening.then(|| Opening {
        owners: gate.owners.clone(),
        caller: caller.clone(),
    });
    let answer = amended(method.clone(), json, next.run(request).await).await;
    match &session {
        None => {
            if let Some(opened) = answer
                .headers()
                .get(SESSION_HEADER)
                .and_then(|v| v.to_str().ok())
            {
                gate.owners.opened(opened, &caller);
            }
        }
        Some(id)
            if answer.status() == StatusCode::NOT_FOUND
                || (method == axum::http::Method::DELETE && answer.status().is_success()) =>
        {
            gate.owners.ended(id);
        }
        Some(_) => {}
    }
    // A stream that goes on (a session's GET, a long call's SSE answer) ends when a reload takes
    // out the token it was opened with, as the API's event stream does.
    let streamed = answer
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if !streamed {
        return answer;
    }
    let (parts, body) = answer.into_parts();
    let body = futures::StreamExt::take_until(body.into_data_stream(), admission.revoked());
    Response::from_parts(parts, axum::body::Body::from_stream(body))
}

/// rmcp's answers where the MCP SDKs expect others: a session ended with `DELETE` is `202`,
/// which the official clients log as a failed termination ("Session termination failed: 202":
/// they take 200 and 204); a body that is not JSON though it says it is is `415` in plain
/// text, where JSON-RPC says `-32700`, parse error.
async fn amended(method: axum::http::Method, json: bool, answer: Response) -> Response {
    if method == axum::http::Method::DELETE && answer.status() == StatusCode::ACCEPTED {
        let (mut parts, body) = answer.into_parts();
        parts.status = StatusCode::OK;
        return Response::from_parts(parts, body);
    }
    if json && answer.status() == StatusCode::UNSUPPORTED_MEDIA_TYPE {
        let (_, body) = answer.into_parts();
        let text = axum::body::to_bytes(body, 64 * 1024)
            .await
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        let error = serde_json::json!({
            "jsonrpc": "2.0",
            "id": null,
            "error": { "code": -32700, "message": format!("parse error: {}", text.trim()) },
        });
        return (StatusCode::BAD_REQUEST, axum::Json(error)).into_response();
    }
    answer
}
