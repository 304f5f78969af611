//! The Streamable HTTP sessions of `/mcp`: `rmcp`'s [`LocalSessionManager`], with what SSE
//! polling (SEP-1699) needs on top. A handler may close its call's SSE stream mid-call
//! (`ctx.close_stream`): the client is told when to come back (the `retry` field) and resumes
//! with `Last-Event-ID`, and the answer reaches it on the resumed stream.
//!
//! rmcp can close a request's stream and replay its cache on resumption, but it does not say
//! which stream carries which request, and it drops a closed stream's cache once the answer is
//! sent. So [`Streams`] opens each `tools/call` stream itself (the same calls rmcp's own
//! `create_stream` makes), noting its stream by session and request id, and the call whose
//! stream was closed holds its answer until the client has come back for it (at most
//! [`RESUME_WAIT`]).

use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use futures::Stream;
use rmcp::model::{ClientJsonRpcMessage, ClientRequest, RequestId, ServerJsonRpcMessage};
use rmcp::transport::common::server_side_http::{ServerSseMessage, SessionId};
use rmcp::transport::streamable_http_server::SessionManager;
use rmcp::transport::streamable_http_server::session::local::{
    LocalSessionHandle, LocalSessionManager, LocalSessionManagerError,
};
use tokio::sync::Notify;

/// How long a call whose stream was closed keeps its answer for a client that has not come back.
pub const RESUME_WAIT: Duration = Duration::from_secs(30);

type Key = (SessionId, RequestId);

/// `/mcp`'s sessions. Shared by the HTTP service and every session's server.
#[derive(Default)]
pub struct Streams {
    inner: LocalSessionManager,
    /// The stream (rmcp's HTTP request id) of each `tools/call` running now.
    calls: DashMap<Key, u64>,
    /// Streams closed by their handler, told when their client resumes them.
    closed: DashMap<(SessionId, u64), Arc<Notify>>,
}

impl Streams {
    async fn handle(&self, id: &SessionId) -> Result<LocalSessionHandle, LocalSessionManagerError> {
        self.inner
            .sessions
            .read()
            .await
            .get(id)
            .cloned()
            .ok_or_else(|| LocalSessionManagerError::SessionNotFound(id.clone()))
    }

    /// Closes the stream of call `request` in `session`, asking its client to come back after
    /// `retry`. `Err` says why it cannot (not a stream this service opened, or gone).
    pub async fn close(
        &self,
        session: &SessionId,
        request: &RequestId,
        retry: Duration,
    ) -> Result<(), String> {
        let key = (session.clone(), request.clone());
        let Some(stream) = self.calls.get(&key).map(|s| *s) else {
            return Err("this call's answer is not on an SSE stream of its own".into());
        };
        let handle = self.handle(session).await.map_err(|e| e.to_string())?;
        self.closed
            .entry((session.clone(), stream))
            .or_insert_with(|| Arc::new(Notify::new()));
        handle
            .close_sse_stream(stream, Some(retry))
            .await
            .map_err(|e| e.to_string())
    }

    /// Ends what is kept of call `request`: when its stream was closed, waits (at most
    /// [`RESUME_WAIT`]) for the client to resume it, so the answer has a stream to go out on.
    pub async fn finish(&self, session: &SessionId, request: &RequestId) {
        let Some((_, stream)) = self.calls.remove(&(session.clone(), request.clone())) else {
            return;
        };
        let Some((_, resumed)) = self.closed.remove(&(session.clone(), stream)) else {
            return;
        };
        if tokio::time::timeout(RESUME_WAIT, resumed.notified())
            .await
            .is_err()
        {
            tracing::debug!("a closed MCP stream was not resumed within {RESUME_WAIT:?}");
        }
    }
}

/// The stream a `Last-Event-ID` (`<index>/<stream>`) names, if a request's.
fn stream_of(last_event_id: &str) -> Option<u64> {
    last_event_id.split_once('/')?.1.parse().ok()
}

fn tool_call(message: &ClientJsonRpcMessage) -> Option<RequestId> {
    match message {
        ClientJsonRpcMessage::Request(r)
            if matches!(r.request, ClientRequest::CallToolRequest(_)) =>
        {
            Some(r.id.clone())
        }
        _ => None,
    }
}

impl SessionManager for Streams {
    type Error = LocalSessionManagerError;
    type Transport = <LocalSessionManager as SessionManager>::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        self.inner.create_session().await
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        self.inner.initialize_session(id, message).await
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        self.inner.has_session(id).await
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        self.calls.retain(|(s, _), _| s != id);
        self.closed.retain(|(s, _), _| s != id);
        self.inner.close_session(id).await
    }

    /// As rmcp's own, but a `tools/call`'s stream is noted before the call reaches its handler.
    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        let handle = self.handle(id).await?;
        let receiver = handle.establish_request_wise_channel().await?;
        let stream = receiver.http_request_id;
        if let (Some(call), Some(stream)) = (tool_call(&message), stream) {
            self.calls.insert((id.clone(), call), stream);
        }
        handle.push_message(message, stream).await?;
        let mut rx = receiver.inner;
        Ok(futures::stream::poll_fn(move |cx| rx.poll_recv(cx)))
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        self.inner.accept_message(id, message).await
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.inner.create_standalone_stream(id).await
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        let stream = stream_of(&last_event_id);
        let resumed = self.inner.resume(id, last_event_id).await?;
        // The resumed stream is in place: a held answer may go out now.
        if let Some(s) = stream
            && let Some(waiting) = self.closed.get(&(id.clone(), s))
        {
            waiting.notify_one();
        }
        Ok(resumed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_last_event_id_names_its_stream() {
        assert_eq!(stream_of("3/7"), Some(7));
        assert_eq!(stream_of("3"), None);
        assert_eq!(stream_of("x/y"), None);
    }
}
