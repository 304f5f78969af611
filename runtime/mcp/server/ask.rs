//! What a tool handler called over MCP asks its client and waits for: `ctx.sample` (the
//! client's model, `sampling/createMessage`) and `ctx.elicit` (the client's user,
//! `elicitation/create`), sent through the session's `rmcp` peer.
//!
//! A question rides the stream of the `tools/call` it serves (rmcp routes a request marked with
//! the call's [`OriginatingRequestId`] onto that call's SSE answer), so a client that opened no
//! standalone `GET` stream still hears it. A client that did not declare the capability is not
//! asked: the handler gets [`Unanswered::Unsupported`], as the specification asks.

// Sampling is deprecated in rmcp for the stateless 2026 revision (SEP-2577); the revisions
// served here (2025-03-26 to 2025-11-25) still define it.
#![allow(deprecated)]

use std::sync::Arc;

use futures::future::BoxFuture;
use rmcp::RoleServer;
use rmcp::model::{
    CancelledNotificationParam, ClientResult, CreateMessageRequest, CreateMessageRequestParams,
    ElicitRequest, ElicitRequestParams, RequestId, ServerRequest,
};
use rmcp::service::{OriginatingRequestId, Peer, PeerRequestOptions, ServiceError};
use serde_json::Value;

/// A question for the client, its parameters as the wire names them (camelCase JSON).
#[derive(Debug, Clone, PartialEq)]
pub enum Question {
    /// `sampling/createMessage`: `{ messages, maxTokens, systemPrompt?, ... }`.
    Sample(Value),
    /// `elicitation/create` (form mode): `{ message, requestedSchema }`.
    Elicit(Value),
}

impl Question {
    fn what(&self) -> &'static str {
        match self {
            Question::Sample(_) => "sampling",
            Question::Elicit(_) => "elicitation",
        }
    }
}

/// Why a question got no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unanswered {
    /// Nobody to ask: the client declared no such capability, or the call did not come over MCP.
    Unsupported(String),
    /// The question is not one the protocol can carry (a schema that is not flat, no
    /// messages): the handler's mistake.
    Invalid(String),
    /// The client answered with a JSON-RPC error.
    Refused(String),
    /// The session ended before the answer came.
    Closed(String),
}

impl std::fmt::Display for Unanswered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unanswered::Unsupported(m)
            | Unanswered::Invalid(m)
            | Unanswered::Refused(m)
            | Unanswered::Closed(m) => f.write_str(m),
        }
    }
}

/// Asks the client of one call; the answer is the client's result as JSON (camelCase).
pub type Asker =
    Arc<dyn Fn(Question) -> BoxFuture<'static, Result<Value, Unanswered>> + Send + Sync>;

/// The asker of the call `originating` on `peer`'s session.
pub fn asker(peer: Peer<RoleServer>, originating: RequestId) -> Asker {
    Arc::new(move |question| {
        let peer = peer.clone();
        let originating = originating.clone();
        Box::pin(async move { ask(&peer, originating, question).await })
    })
}

fn invalid(what: &str, e: impl std::fmt::Display) -> Unanswered {
    Unanswered::Invalid(format!("not a valid {what} request: {e}"))
}

async fn ask(
    peer: &Peer<RoleServer>,
    originating: RequestId,
    question: Question,
) -> Result<Value, Unanswered> {
    let what = question.what();
    let capabilities = peer.peer_info().map(|i| i.capabilities.clone());
    let declared = capabilities.as_ref().is_some_and(|c| match question {
        Question::Sample(_) => c.sampling.is_some(),
        Question::Elicit(_) => c.elicitation.is_some(),
    });
    if !declared {
        return Err(Unanswered::Unsupported(format!(
            "the client declared no {what} capability, so it cannot be asked"
        )));
    }
    let marker = OriginatingRequestId(originating);
    let request = match question {
        Question::Sample(params) => {
            let params: CreateMessageRequestParams =
                serde_json::from_value(params).map_err(|e| invalid(what, e))?;
            params.validate().map_err(|e| invalid(what, e))?;
            let mut r = CreateMessageRequest::new(params);
            r.extensions.insert(marker);
            ServerRequest::CreateMessageRequest(r)
        }
        Question::Elicit(params) => {
            let params: ElicitRequestParams =
                serde_json::from_value(params).map_err(|e| invalid(what, e))?;
            let mut r = ElicitRequest::new(params);
            r.extensions.insert(marker);
            ServerRequest::ElicitRequest(r)
        }
    };
    let answer = match peer
        .send_request_with_option(request, PeerRequestOptions::no_options())
        .await
    {
        Ok(handle) => {
            // A handler that stops waiting (its deadline, a cancelled call) withdraws the
            // question: the client's form or model call would stay open for nobody.
            let mut withdraw = Withdraw {
                peer: peer.clone(),
                id: Some(handle.id.clone()),
            };
            let answer = handle.await_response().await;
            withdraw.id = None;
            answer
        }
        Err(e) => Err(e),
    };
    match answer {
        Ok(answer @ (ClientResult::CreateMessageResult(_) | ClientResult::ElicitResult(_))) => {
            serde_json::to_value(&answer).map_err(|e| Unanswered::Refused(e.to_string()))
        }
        Ok(other) => Err(Unanswered::Refused(format!(
            "the client's answer to the {what} request is not what it asked for: {}",
            serde_json::to_string(&other).unwrap_or_default()
        ))),
        Err(ServiceError::McpError(e)) => Err(Unanswered::Refused(format!(
            "the client refused the {what} request: {} (code {})",
            e.message, e.code.0
        ))),
        Err(e @ (ServiceError::TransportClosed | ServiceError::Cancelled { .. })) => Err(
            Unanswered::Closed(format!("no answer to the {what} request: {e}")),
        ),
        Err(e) => Err(Unanswered::Refused(format!(
            "the {what} request failed: {e}"
        ))),
    }
}

/// A question still unanswered when its asker stops waiting: dropped, it tells the client
/// (`notifications/cancelled` for the request's id).
struct Withdraw {
    peer: Peer<RoleServer>,
    id: Option<RequestId>,
}

impl Drop for Withdraw {
    fn drop(&mut self) {
        let (Some(id), Ok(runtime)) = (self.id.take(), tokio::runtime::Handle::try_current())
        else {
            return;
        };
        let peer = self.peer.clone();
        runtime.spawn(async move {
            let reason = "the tool that asked no longer waits for the answer";
            let _ = peer
                .notify_cancelled(CancelledNotificationParam::new(
                    Some(id),
                    Some(reason.into()),
                ))
                .await;
        });
    }
}
