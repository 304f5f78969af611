//! rmcp's reqwest client with one change: a dead session answered the TypeScript SDK's way.
//!
//! A spec-following server answers a request on an unknown session with 404, which rmcp turns into
//! a re-initialisation and one retry. The TypeScript SDK's servers answer 400 with a JSON-RPC
//! error that has no `id` instead; rmcp hands that on as a message nobody waits for, and the
//! request hangs until its deadline. Here such an answer to a request sent with a session is
//! read as the session having expired, so rmcp's own recovery runs. Written by hand because rmcp
//! has no hook for it; everything else delegates to rmcp's client.
//!
//! It also keeps why the last request could not be sent: rmcp's error holds reqwest's without
//! its causes, so an unreachable server read "error sending request for url (...)", never
//! "connection refused" or "failed to lookup address".

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::stream::BoxStream;
use reqwest::header::{HeaderName, HeaderValue};
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_client::SseError;
use rmcp::transport::streamable_http_client::{
    StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
    StreamableHttpResponseLimits,
};
use sse_stream::Sse;

#[derive(Clone, Default)]
pub struct SessionAware {
    client: reqwest::Client,
    unsent: Arc<Mutex<Option<String>>>,
}

impl SessionAware {
    pub fn new(client: reqwest::Client) -> SessionAware {
        SessionAware {
            client,
            unsent: Arc::default(),
        }
    }

    /// Why the last request that could not be sent was not, with every cause (secrets
    /// redacted): what a failed handshake reports.
    pub fn unsent(&self) -> Option<String> {
        self.unsent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn noted<T>(
        &self,
        r: Result<T, StreamableHttpError<reqwest::Error>>,
    ) -> Result<T, StreamableHttpError<reqwest::Error>> {
        // Only the last request's: an earlier one's failure (a stream's GET) is not why a
        // later one failed.
        let why = match &r {
            Err(StreamableHttpError::Client(e)) => Some(crate::providers::errors::unsent(e)),
            _ => None,
        };
        *self.unsent.lock().unwrap_or_else(|e| e.into_inner()) = why;
        r
    }
}

type PostResult = Result<StreamableHttpPostResponse, StreamableHttpError<reqwest::Error>>;

/// A reply to a request that is an error without an `id` while a session was attached.
fn dead_session(sent: &ClientJsonRpcMessage, had_session: bool, result: PostResult) -> PostResult {
    let is_request = matches!(sent, ClientJsonRpcMessage::Request(_));
    match result {
        Ok(StreamableHttpPostResponse::Json(ServerJsonRpcMessage::Error(e), _))
            if had_session && is_request && e.id.is_none() =>
        {
            tracing::info!(target: "colony::mcp", "the server refused our session ({}): re-initialising", e.error.message);
            Err(StreamableHttpError::SessionExpired)
        }
        other => other,
    }
}

impl StreamableHttpClient for SessionAware {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> PostResult {
        let had = session_id.is_some();
        let sent = message.clone();
        let r = self
            .client
            .post_message(uri, message, session_id, auth_header, custom_headers)
            .await;
        dead_session(&sent, had, self.noted(r))
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> PostResult {
        let had = session_id.is_some();
        let sent = message.clone();
        let r = self
            .client
            .post_message_with_max_sse_event_size(
                uri,
                message,
                session_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await;
        dead_session(&sent, had, self.noted(r))
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> PostResult {
        let had = session_id.is_some();
        let sent = message.clone();
        let r = self
            .client
            .post_message_with_response_limits(
                uri,
                message,
                session_id,
                auth_header,
                custom_headers,
                limits,
            )
            .await;
        dead_session(&sent, had, self.noted(r))
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), StreamableHttpError<Self::Error>> {
        let r = self
            .client
            .delete_session(uri, session_id, auth_header, custom_headers)
            .await;
        self.noted(r)
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, StreamableHttpError<Self::Error>> {
        let r = self
            .client
            .get_stream(uri, session_id, last_event_id, auth_header, custom_headers)
            .await;
        self.noted(r)
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, StreamableHttpError<Self::Error>> {
        let r = self
            .client
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await;
        self.noted(r)
    }
}
