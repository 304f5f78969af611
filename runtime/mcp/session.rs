//! One live connection to a server, on `rmcp`.
//!
//! rmcp does the wire: the handshake (tolerating notifications before the initialize result), JSON
//! or SSE answers over Streamable HTTP with `Mcp-Session-Id` and `MCP-Protocol-Version`, a 404 for
//! the session answered by re-initialising once, one JSON message a line over stdio, and the
//! `notifications/cancelled` sent when a request's timeout passes. Around it, this file adds what
//! rmcp leaves to its user: refusing a revision we do not speak, paging `tools/list` with a cap, a
//! dead child reported and restarted on next use, a server that answers a dead session with 400
//! (the TypeScript SDK does) re-initialised once (`http_client`), and a shutdown that waits for answers in flight
//! before closing stdin (the Python SDK's server drops requests still running when stdin closes).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rmcp::ServiceExt;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, ClientRequest, ListToolsRequest,
    PaginatedRequestParams, ServerResult,
};
use rmcp::service::{PeerRequestOptions, RoleClient, RunningService, ServiceError};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::Value;
use tokio::io::AsyncBufReadExt;
use tokio::sync::{Mutex, Notify};

use super::handler::Handler;
use super::result::{CallOutput, shape};
use super::server_group::ServerGroup;
use super::{McpError, REVISIONS, ServerSpec, Transport};

/// At most this many `tools/list` pages are read (a server that pages forever is cut off).
pub const MAX_PAGES: usize = 50;

/// How long the handshake may take (a child that starts slowly, a far server).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a `tools/list` page may take.
const LIST_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a message may stand half read, no byte coming, when a request times out, before
/// the server is taken to have stopped in the middle of it ([`Connection::after_timeout`]); a
/// long message still arriving is read in pieces far closer together than this.
const HALF_MESSAGE_STALL: Duration = Duration::from_secs(1);

/// How long a shutdown waits for answers in flight before closing anyway.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

type Service = RunningService<RoleClient, Handler>;

struct Live {
    service: Service,
    /// Which session of the connection this is ([`Connection::reset_from`]).
    generation: u64,
    version: String,
    /// A stdio server's processes, ended when the session is (after `service`, dropped first).
    group: Option<ServerGroup>,
    /// A stdio server's last stderr lines, read for as long as it runs.
    stderr: Option<StderrTail>,
}

/// A server we talk to. Cheap to share (`Arc`); calls run concurrently on one session. The
/// session is opened on first use and again after it died.
pub struct Connection {
    spec: ServerSpec,
    live: Mutex<Option<Live>>,
    inflight: AtomicUsize,
    drained: Notify,
    /// Set by `close`: a closed connection refuses calls instead of starting the server again.
    closed: std::sync::atomic::AtomicBool,
    /// What the live session's stdio reader has seen: why colony ended the session itself (a
    /// message past its limit), said by the calls it ended; a message left half read.
    reading: super::child::Reading,
    /// Sessions opened so far.
    sessions: AtomicUsize,
    /// The live session's stderr (a stdio server's): what a server that dies mid-call said.
    stderr: std::sync::Mutex<Option<StderrTail>>,
    tools_changed: Arc<ToolsChanged>,
}

/// How many times a server's tools may have changed since it was first listed: its
/// `notifications/tools/list_changed`, and each session after the first (a server started
/// again may be a newer one). Whoever keeps its tools for long lists them again when this moves
/// ([`super::relisted`]).
#[derive(Default)]
pub struct ToolsChanged(std::sync::atomic::AtomicU64);

impl ToolsChanged {
    pub fn bump(&self) {
        self.0.fetch_add(1, Ordering::AcqRel);
    }

    pub fn generation(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }
}

/// A server's tool as listed: its own name and the JSON it was listed with.
#[derive(Debug, Clone)]
pub struct ListedTool {
    pub name: String,
    pub description: String,
    pub input_schema: Value,
}

impl Connection {
    pub fn new(spec: ServerSpec) -> Arc<Connection> {
        Arc::new(Connection {
            spec,
            live: Mutex::new(None),
            inflight: AtomicUsize::new(0),
            drained: Notify::new(),
            closed: std::sync::atomic::AtomicBool::new(false),
            reading: super::child::Reading::default(),
            sessions: AtomicUsize::new(0),
            stderr: std::sync::Mutex::new(None),
            tools_changed: Arc::default(),
        })
    }

    /// Opens the connection now (rather than on first use): the handshake's errors surface here.
    pub async fn open(spec: ServerSpec) -> Result<Arc<Connection>, McpError> {
        let conn = Connection::new(spec);
        conn.peer().await?;
        Ok(conn)
    }

    pub fn name(&self) -> &str {
        &self.spec.name
    }

    pub fn spec(&self) -> &ServerSpec {
        &self.spec
    }

    /// Moves when the server's tools may have changed since they were listed.
    pub fn tools_changed(&self) -> &ToolsChanged {
        &self.tools_changed
    }

    /// How many calls are waiting for their answers.
    pub fn in_flight(&self) -> usize {
        self.inflight.load(Ordering::SeqCst)
    }

    /// The revision the server answered, once connected.
    pub async fn version(&self) -> Option<String> {
        self.live.lock().await.as_ref().map(|l| l.version.clone())
    }

    /// The server's name and version from its initialize result.
    pub async fn server_info(&self) -> Option<(String, String)> {
        let live = self.live.lock().await;
        let info = live.as_ref()?.service.peer_info()?;
        let imp = info.server_info.as_ref()?;
        Some((imp.name.clone(), imp.version.clone()))
    }

    /// The live session's peer, connecting (or reconnecting after a death) first.
    async fn peer(&self) -> Result<rmcp::Peer<RoleClient>, McpError> {
        self.session().await.map(|(peer, _)| peer)
    }

    /// [`Connection::peer`], and which session it is.
    async fn session(&self) -> Result<(rmcp::Peer<RoleClient>, u64), McpError> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(self.closed("the connection was closed (mcp.close)"));
        }
        let mut live = self.live.lock().await;
        if let Some(l) = live.as_ref() {
            if !l.service.is_closed() && !l.service.peer().is_transport_closed() {
                return Ok((l.service.peer().clone(), l.generation));
            }
            tracing::warn!(target: "colony::mcp", server = %self.spec.name,
                "the connection closed (a child that exited, a server that went away); reconnecting");
            *live = None;
        }
        *self.reading.lock().unwrap_or_else(|e| e.into_inner()) = Default::default();
        let connecting = connect(&self.spec, &self.reading, &self.tools_changed);
        let fresh = tokio::time::timeout(CONNECT_TIMEOUT, connecting)
            .await
            .map_err(|_| McpError::Connect {
                server: self.spec.name.clone(),
                message: format!(
                    "no initialize result within {} s",
                    CONNECT_TIMEOUT.as_secs()
                ),
            })??;
        let mut fresh = fresh;
        fresh.generation = self.sessions.fetch_add(1, Ordering::SeqCst) as u64 + 1;
        if fresh.generation > 1 {
            self.tools_changed.bump();
        }
        let peer = fresh.service.peer().clone();
        let generation = fresh.generation;
        *self.stderr.lock().unwrap_or_else(|e| e.into_inner()) = fresh.stderr.clone();
        *live = Some(fresh);
        Ok((peer, generation))
    }

    /// Forgets session `generation`, if it is still the live one, so the next use opens a new
    /// one: whether it did. A call that failed with a session that died must not close the
    /// session another call has opened since (many calls fail with one server's death).
    async fn reset_from(&self, generation: u64) -> bool {
        let mut live = self.live.lock().await;
        if live.as_ref().is_none_or(|l| l.generation != generation) {
            return false;
        }
        if let Some(mut l) = live.take() {
            drop(live);
            let _ = l.service.close_with_timeout(Duration::from_secs(2)).await;
        }
        true
    }

    /// After a request that timed out: a stdio server that stopped in the middle of a message
    /// (its answer to that request, say) has its session ended and is started again on next
    /// use. The reader would take the server's next message for the rest of that one, and lose
    /// it: every later call would wait for its timeout.
    async fn after_timeout(&self, e: &McpError, generation: u64) {
        if !matches!(e, McpError::Timeout { .. }) {
            return;
        }
        let stalled = (self.reading.lock().unwrap_or_else(|e| e.into_inner()))
            .stalled_in_a_message(HALF_MESSAGE_STALL);
        if stalled && self.reset_from(generation).await {
            tracing::warn!(target: "colony::mcp", server = %self.spec.name,
                "a request timed out with the server's message half read: the server is started \
                 again on next use, so that its next message is read whole");
        }
    }

    /// Forgets the session so the next use opens a new one.
    async fn reset(&self) {
        if let Some(mut l) = self.live.lock().await.take() {
            let _ = l.service.close_with_timeout(Duration::from_secs(2)).await;
        }
    }

    /// Every tool the server lists, following `nextCursor` for at most [`MAX_PAGES`] pages.
    pub async fn list_tools(&self) -> Result<Vec<ListedTool>, McpError> {
        let _guard = self.enter();
        let mut retried = false;
        let mut authorized = false;
        loop {
            match self.list_pages().await {
                Err(Failure::Auth(_, challenge)) if !authorized => {
                    authorized = true;
                    self.reauthorize(&challenge).await?;
                }
                Err(Failure::Retry(e)) if !retried && self.is_http() => {
                    tracing::info!(target: "colony::mcp", server = %self.spec.name, "re-initialising after: {e}");
                    retried = true;
                    self.reset().await;
                }
                Err(f) => return Err(f.into_error()),
                Ok(tools) => return Ok(tools),
            }
        }
    }

    async fn list_pages(&self) -> Result<Vec<ListedTool>, Failure> {
        let peer = self.peer().await.map_err(Failure::Final)?;
        let mut tools = Vec::new();
        let mut cursor: Option<String> = None;
        let mut seen = std::collections::HashSet::new();
        for _ in 0..MAX_PAGES {
            let params = PaginatedRequestParams::default().with_cursor(cursor.take());
            let req = ClientRequest::ListToolsRequest(ListToolsRequest::with_param(params));
            let answer = self.request(&peer, req, LIST_TIMEOUT).await?;
            let next = match answer {
                ServerResult::ListToolsResult(page) => {
                    for t in page.tools {
                        tools.push(ListedTool {
                            name: t.name.to_string(),
                            description: t.description.map(|d| d.to_string()).unwrap_or_default(),
                            input_schema: Value::Object((*t.input_schema).clone()),
                        });
                    }
                    page.next_cursor
                }
                // A list rmcp could not read whole (one tool without its `inputSchema`) comes
                // as JSON: read a tool at a time, so one bad tool does not take the server's
                // others with it ("tools/list got an answer of another kind").
                ServerResult::CustomResult(rmcp::model::CustomResult(page))
                    if page.get("tools").is_some_and(Value::is_array) =>
                {
                    tools.extend(Self::listed_one_by_one(&self.spec.name, &page));
                    page.get("nextCursor")
                        .and_then(Value::as_str)
                        .map(str::to_string)
                }
                _ => {
                    return Err(Failure::Final(
                        self.closed("tools/list got an answer of another kind"),
                    ));
                }
            };
            match next_cursor(&mut seen, next, &self.spec.name, "tools/list") {
                Some(c) => cursor = Some(c),
                None => return Ok(tools),
            }
        }
        tracing::warn!(target: "colony::mcp", server = %self.spec.name,
            "tools/list still had more after {MAX_PAGES} pages; the rest is left out");
        Ok(tools)
    }

    /// Sends one request that changes nothing on the server (a list, a read), re-initialising a
    /// dead HTTP session once: what `resources` and `prompts` are built on.
    pub(super) async fn ask(
        &self,
        req: ClientRequest,
        timeout: Duration,
    ) -> Result<ServerResult, McpError> {
        let _guard = self.enter();
        let mut retried = false;
        let mut authorized = false;
        loop {
            let (peer, generation) = self.session().await?;
            match self.request(&peer, req.clone(), timeout).await {
                Err(Failure::Auth(_, challenge)) if !authorized => {
                    authorized = true;
                    self.reauthorize(&challenge).await?;
                }
                Err(Failure::Retry(e)) if !retried && self.is_http() => {
                    tracing::info!(target: "colony::mcp", server = %self.spec.name, "re-initialising after: {e}");
                    retried = true;
                    self.reset().await;
                }
                Err(f) => {
                    let e = f.into_error();
                    if matches!(e, McpError::Closed { .. }) {
                        self.reset_from(generation).await;
                    }
                    self.after_timeout(&e, generation).await;
                    return Err(e);
                }
                Ok(answer) => return Ok(answer),
            }
        }
    }

    /// The tools of a `tools/list` page read one by one: one without an `inputSchema` (which MCP
    /// requires) is offered as taking an object, said once; one without a name, or whose schema
    /// is not an object, is left out, said.
    fn listed_one_by_one(server: &str, page: &Value) -> Vec<ListedTool> {
        let mut out = Vec::new();
        for t in page["tools"].as_array().into_iter().flatten() {
            let Some(name) = t.get("name").and_then(Value::as_str) else {
                let shown: String = t.to_string().chars().take(200).collect();
                tracing::warn!(target: "colony::mcp", server = %server,
                "a tool without a name is left out: {shown}");
                continue;
            };
            let input_schema = match t.get("inputSchema") {
                Some(schema @ Value::Object(_)) => schema.clone(),
                None | Some(Value::Null) => {
                    tracing::warn!(target: "colony::mcp", server = %server, tool = %name,
                    "the tool has no inputSchema (MCP requires one): offered as taking an object");
                    serde_json::json!({ "type": "object" })
                }
                Some(other) => {
                    tracing::warn!(target: "colony::mcp", server = %server, tool = %name,
                    "the tool is left out: its inputSchema is not an object but {other}");
                    continue;
                }
            };
            out.push(ListedTool {
                name: name.to_string(),
                description: t
                    .get("description")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                input_schema,
            });
        }
        out
    }

    /// The server's name for errors about what it answered.
    pub(super) fn unexpected(&self, what: &str) -> McpError {
        self.closed(&format!("{what} got an answer of another kind"))
    }

    /// Calls `tool` with `args`; past `deadline` the server is told to cancel it.
    pub async fn call(
        &self,
        tool: &str,
        args: Value,
        deadline: Duration,
    ) -> Result<CallOutput, McpError> {
        let _guard = self.enter();
        let arguments = match args {
            Value::Object(map) => map,
            Value::Null => Default::default(),
            other => {
                return Err(McpError::Config(format!(
                    "{}: arguments of {tool} must be an object, not {other}",
                    self.spec.name
                )));
            }
        };
        let mut retried = false;
        let mut authorized = false;
        loop {
            let (peer, generation) = self.session().await?;
            let params =
                CallToolRequestParams::new(tool.to_string()).with_arguments(arguments.clone());
            let req = ClientRequest::CallToolRequest(CallToolRequest::new(params));
            match self.request(&peer, req, deadline).await {
                Ok(ServerResult::CallToolResult(r)) => {
                    let json = serde_json::to_value(&r).unwrap_or(Value::Null);
                    return Ok(shape(&json));
                }
                Ok(_) => return Err(self.closed("tools/call got an answer of another kind")),
                Err(Failure::Auth(_, challenge)) if !authorized => {
                    authorized = true;
                    self.reauthorize(&challenge).await?;
                }
                Err(Failure::Retry(e)) if !retried && self.is_http() => {
                    tracing::info!(target: "colony::mcp", server = %self.spec.name, "re-initialising after: {e}");
                    retried = true;
                    self.reset().await;
                }
                Err(f) => {
                    let mut e = f.into_error();
                    // A server that died mid-call: said with the tool and what it said last
                    // (its stderr was in the log only: "the connection closed: Transport
                    // closed" named neither).
                    // A session colony cut itself (a message past its limit) says only that.
                    let cut = (self.reading.lock().unwrap_or_else(|e| e.into_inner()))
                        .cut
                        .is_some();
                    if let McpError::Closed { message, .. } = &mut e {
                        let tail = self
                            .stderr
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .clone();
                        let cause = format!("{message}, while calling {tool}");
                        *message = match tail.filter(|_| !cut) {
                            Some(tail) => tail.said_after(cause).await,
                            None => cause,
                        };
                    }
                    // A child that died: reported now (by the first call it failed), restarted
                    // on next use.
                    if matches!(e, McpError::Closed { .. }) && self.reset_from(generation).await {
                        tracing::warn!(target: "colony::mcp", server = %self.spec.name, "{e}");
                    }
                    self.after_timeout(&e, generation).await;
                    return Err(e);
                }
            }
        }
    }

    async fn request(
        &self,
        peer: &rmcp::Peer<RoleClient>,
        req: ClientRequest,
        timeout: Duration,
    ) -> Result<ServerResult, Failure> {
        let sent = peer
            .send_request_with_option(req, PeerRequestOptions::with_timeout(timeout))
            .await;
        let answer = match sent {
            Ok(handle) => handle.await_response().await,
            Err(e) => Err(e),
        };
        answer.map_err(|e| self.failure(e, timeout))
    }

    fn failure(&self, e: ServiceError, timeout: Duration) -> Failure {
        let server = self.spec.name.clone();
        // A 401 or 403 with a challenge: the request was refused before it ran.
        if let Some(challenge) = e.auth_challenge() {
            let challenge = challenge.to_string();
            return Failure::Auth(
                McpError::Connect {
                    server,
                    message: format!("the server refused our authorization ({challenge})"),
                },
                challenge,
            );
        }
        match e {
            ServiceError::McpError(data) => Failure::Final(McpError::Rpc {
                server,
                code: data.code.0,
                message: data.message.to_string(),
            }),
            ServiceError::Timeout { .. } => Failure::Final(McpError::Timeout {
                server,
                seconds: timeout.as_secs_f64(),
            }),
            // No connection could be made (a server restarting): the request never reached it,
            // so one retry on a fresh session is safe. Any other failed POST (a 5xx from a proxy
            // after the tool ran, a body cut off) may have run the tool: not sent again. A dead
            // session (404, or the 400 some servers send) is re-initialised by rmcp itself.
            ServiceError::TransportSend(e) => {
                let closed = McpError::Closed {
                    server,
                    message: innermost(&e),
                };
                if never_reached(&e) {
                    Failure::Retry(closed)
                } else {
                    Failure::Final(closed)
                }
            }
            other => {
                let cut = (self.reading.lock().unwrap_or_else(|e| e.into_inner()))
                    .cut
                    .clone();
                Failure::Final(McpError::Closed {
                    server,
                    message: cut.unwrap_or_else(|| other.to_string()),
                })
            }
        }
    }

    /// Authorizes again after the server's `challenge` (an expired sign-in, a call that needs
    /// more scope: step-up), then starts a new session with the new tokens. Once per request.
    async fn reauthorize(&self, challenge: &str) -> Result<(), McpError> {
        let Transport::Http { url, .. } = &self.spec.transport else {
            return Err(self.closed("a stdio server asked for authorization"));
        };
        tracing::info!(target: "colony::mcp", server = %self.spec.name,
            "the server asks for authorization (or more scope); authorizing");
        let auth = self.spec.auth.clone().unwrap_or_default();
        super::oauth::authorize(&self.spec.name, url, &auth, Some(challenge)).await?;
        self.reset().await;
        Ok(())
    }

    fn closed(&self, message: &str) -> McpError {
        McpError::Closed {
            server: self.spec.name.clone(),
            message: message.into(),
        }
    }

    fn is_http(&self) -> bool {
        matches!(self.spec.transport, Transport::Http { .. })
    }

    fn enter(&self) -> InFlight<'_> {
        self.inflight.fetch_add(1, Ordering::SeqCst);
        InFlight(self)
    }

    /// Waits (a while) for answers in flight, then ends the session: over stdio, stdin is closed,
    /// then SIGTERM, then SIGKILL (rmcp's `graceful_shutdown`); over HTTP the session is dropped.
    pub async fn close(&self) {
        let drain = async {
            loop {
                let notified = self.drained.notified();
                if self.inflight.load(Ordering::SeqCst) == 0 {
                    return;
                }
                notified.await;
            }
        };
        let _ = tokio::time::timeout(DRAIN_TIMEOUT, drain).await;
        // After the calls in flight (they may still be connecting): from now on, refused.
        self.closed.store(true, Ordering::SeqCst);
        if let Some(mut l) = self.live.lock().await.take() {
            let _ = l.service.close().await;
        }
    }
}

struct InFlight<'a>(&'a Connection);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if self.0.inflight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.drained.notify_waiters();
        }
    }
}

enum Failure {
    Retry(McpError),
    Final(McpError),
    /// Refused for want of authorization (or of scope), with the server's `WWW-Authenticate`.
    Auth(McpError, String),
}

impl Failure {
    fn into_error(self) -> McpError {
        match self {
            Failure::Retry(e) | Failure::Final(e) | Failure::Auth(e, _) => e,
        }
    }
}

async fn connect(
    spec: &ServerSpec,
    reading: &super::child::Reading,
    tools_changed: &Arc<ToolsChanged>,
) -> Result<Live, McpError> {
    let handler = Handler {
        server: spec.name.clone(),
        tools_changed: tools_changed.clone(),
        roots: spec.roots.clone(),
        elicit: spec.elicit.clone(),
        sampling: spec.sampling.as_ref().and_then(|s| s.sampler.clone()),
    };
    let failed = |message: String| McpError::Connect {
        server: spec.name.clone(),
        message,
    };
    // A server's headers and `env` values are how it is given its tokens: each is a secret,
    // scrubbed from its stderr lines, its results, logs, cassettes and the store.
    match &spec.transport {
        Transport::Http {
            headers: values, ..
        }
        | Transport::Stdio { env: values, .. } => {
            values.values().for_each(|v| crate::secrets::register(v));
        }
        Transport::Unavailable { .. } => {}
    }
    // Held from the start: a failed handshake ends the server's processes too.
    let mut group = None;
    let mut tail = None;
    let service = match &spec.transport {
        Transport::Unavailable { reason } => return Err(McpError::Config(reason.clone())),
        Transport::Http { url, headers } => {
            let mut custom = HashMap::new();
            for (k, v) in headers {
                let name = reqwest::header::HeaderName::from_bytes(k.as_bytes())
                    .map_err(|e| failed(format!("header {k:?}: {e}")))?;
                let value = reqwest::header::HeaderValue::from_str(v)
                    .map_err(|e| failed(format!("header {k:?}: {e}")))?;
                custom.insert(name, value);
            }
            let config =
                StreamableHttpClientTransportConfig::with_uri(url.as_str()).custom_headers(custom);
            // The server's headers (a bearer token) go only where it was configured: no redirect
            // to another host, no Referer.
            let client = crate::tls::client_builder()
                .redirect(crate::providers::same_origin_redirects(
                    "the MCP server",
                    true,
                ))
                .referer(false)
                .build()
                .map_err(|e| failed(format!("the HTTP client: {e}")))?;
            let base = super::http_client::SessionAware::new(client);
            // Tokens from an earlier sign-in (`colony mcp login`) go with every request; a
            // server that refuses them, or asks for them, is authorized now (or told how).
            let auth = spec.auth.clone().unwrap_or_default();
            let manager = match super::oauth::stored(&spec.name, url).await? {
                Some(m) => Some(m),
                None => {
                    let plain =
                        StreamableHttpClientTransport::with_client(base.clone(), config.clone());
                    match handler.clone().serve(plain).await {
                        Ok(service) => return checked(spec, service).await,
                        Err(e) => match e.auth_challenge() {
                            Some(challenge) => {
                                let challenge = challenge.to_string();
                                tracing::info!(target: "colony::mcp", server = %spec.name, "the server asks for authorization");
                                Some(
                                    super::oauth::authorize(
                                        &spec.name,
                                        url,
                                        &auth,
                                        Some(&challenge),
                                    )
                                    .await?,
                                )
                            }
                            None => {
                                return Err(failed(base.unsent().unwrap_or_else(|| innermost(&e))));
                            }
                        },
                    }
                }
            };
            let manager = manager.expect("stored or authorized");
            let transport = StreamableHttpClientTransport::with_client(
                rmcp::transport::AuthClient::new(base.clone(), manager),
                config,
            );
            handler
                .serve(transport)
                .await
                .map_err(|e| failed(base.unsent().unwrap_or_else(|| innermost(&e))))?
        }
        Transport::Stdio {
            command,
            args,
            env,
            cwd,
        } => {
            let mut cmd = tokio::process::Command::new(command);
            // Like the official SDKs: a server gets a safe few variables and its own `env`, not
            // colony's whole environment (which holds the providers' keys).
            cmd.args(args).env_clear();
            for var in INHERITED_ENV {
                if let Some(v) = std::env::var_os(var) {
                    cmd.env(var, v);
                }
            }
            cmd.envs(env);
            if let Some(dir) = cwd {
                // The spawn's own error names the command ("cannot start python3: No such
                // file or directory") when it is the folder that is missing.
                if !std::path::Path::new(dir).is_dir() {
                    return Err(failed(format!(
                        "cannot start {command}: its cwd {} is not a folder",
                        dir.display()
                    )));
                }
                cmd.current_dir(dir);
            }
            // A group of its own, which colony ends whole (see `server_group`).
            let (transport, stderr) = super::child::Child::spawn(
                super::server_group::wrap(cmd),
                &spec.name,
                reading.clone(),
            )
            .map_err(|e| failed(format!("cannot start {command}: {e}")))?;
            group = transport.id().and_then(ServerGroup::started);
            let said = StderrTail::default();
            tail = Some(said.clone());
            if let Some(stderr) = stderr {
                let server = spec.name.clone();
                let said = said.clone();
                tokio::spawn(async move {
                    let mut lines = tokio::io::BufReader::new(stderr).lines();
                    while let Ok(Some(line)) = lines.next_line().await {
                        let line = crate::secrets::redact(&line);
                        tracing::info!(target: "colony::mcp::stderr", server = %server, "{line}");
                        said.push(line);
                    }
                    said.ended();
                });
            } else {
                said.ended();
            }
            match handler.serve(transport).await {
                Ok(service) => service,
                Err(e) => return Err(failed(said.explain(innermost(&e)).await)),
            }
        }
    };
    let mut live = checked(spec, service).await?;
    live.group = group;
    live.stderr = tail;
    Ok(live)
}

/// The last lines a stdio server wrote to its stderr, for the error of a handshake it failed:
/// a server that exits as it starts (a missing token, a missing module) says why there, and
/// colony said only "Broken pipe".
#[derive(Clone)]
struct StderrTail {
    lines: Arc<std::sync::Mutex<std::collections::VecDeque<String>>>,
    /// Whether its stderr has ended (the server exited, or closed it).
    ended: Arc<tokio::sync::watch::Sender<bool>>,
}

impl Default for StderrTail {
    fn default() -> StderrTail {
        StderrTail {
            lines: Arc::default(),
            ended: Arc::new(tokio::sync::watch::channel(false).0),
        }
    }
}

impl StderrTail {
    /// The lines kept, and the characters a line is cut to.
    const LINES: usize = 3;
    const WIDTH: usize = 300;

    fn push(&self, line: String) {
        let mut lines = self.lines.lock().unwrap_or_else(|e| e.into_inner());
        if lines.len() == Self::LINES {
            lines.pop_front();
        }
        lines.push_back(line.chars().take(Self::WIDTH).collect());
    }

    fn ended(&self) {
        self.ended.send_replace(true);
    }

    /// The lines kept, once its stderr has ended (it exited) or a moment later if it has not;
    /// and whether it ended.
    async fn last_lines(&self) -> (Vec<String>, bool) {
        let mut ended = self.ended.subscribe();
        let exited = tokio::time::timeout(Duration::from_secs(1), ended.wait_for(|e| *e))
            .await
            .is_ok_and(|r| r.is_ok());
        let lines = self.lines.lock().unwrap_or_else(|e| e.into_inner());
        let lines = lines
            .iter()
            .filter(|l| !l.trim().is_empty())
            .cloned()
            .collect();
        (lines, exited)
    }

    /// `cause` of a call the server's death failed, with what it said last.
    async fn said_after(&self, cause: String) -> String {
        match self.last_lines().await {
            (lines, _) if lines.is_empty() => cause,
            (lines, _) => format!("{cause}; its stderr: {}", lines.join(" / ")),
        }
    }

    /// `cause` with what the server said: once its stderr has ended (it exited), or a moment
    /// later if it has not.
    async fn explain(&self, cause: String) -> String {
        let (lines, exited) = self.last_lines().await;
        match (exited, lines.is_empty()) {
            (true, true) => format!("it ended before it answered, saying nothing ({cause})"),
            (true, false) => format!(
                "it ended before it answered; its stderr: {} ({cause})",
                lines.join(" / ")
            ),
            (false, true) => cause,
            (false, false) => format!("{cause}; its stderr: {}", lines.join(" / ")),
        }
    }
}

/// The session, unless the server answered a revision we do not speak.
async fn checked(spec: &ServerSpec, service: Service) -> Result<Live, McpError> {
    let version = service
        .peer_info()
        .map(|i| i.protocol_version.to_string())
        .unwrap_or_default();
    if !REVISIONS.contains(&version.as_str()) {
        let mut service = service;
        let _ = service.close().await;
        return Err(McpError::UnsupportedVersion {
            server: spec.name.clone(),
            version,
        });
    }
    Ok(Live {
        service,
        // Numbered as it becomes the live session (`Connection::session`).
        generation: 0,
        version,
        group: None,
        stderr: None,
    })
}

/// The cursor of the page after this one, if there is one to ask for: not after a page without
/// one, nor when the server gives a cursor it gave before (a server that answers `nextCursor`
/// with the cursor it was asked for would have its first page listed [`MAX_PAGES`] times).
pub(super) fn next_cursor(
    seen: &mut std::collections::HashSet<String>,
    next: Option<String>,
    server: &str,
    list: &str,
) -> Option<String> {
    let next = next.filter(|c| !c.is_empty())?;
    if seen.insert(next.clone()) {
        return Some(next);
    }
    tracing::warn!(target: "colony::mcp", server = %server,
        "{list} gave the cursor {next:?} a second time; listing stops there");
    None
}

/// The variables a stdio server inherits from colony (the MCP SDKs' default list).
const INHERITED_ENV: &[&str] = &[
    "HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "LANG", "TMPDIR",
];

/// Whether a failed send never reached the server (the connection could not be made).
fn never_reached(e: &(dyn std::error::Error + 'static)) -> bool {
    let cause = innermost(e).to_lowercase();
    [
        "connection refused",
        "failed to lookup address",
        "dns error",
        "no route to host",
    ]
    .iter()
    .any(|m| cause.contains(m))
}

/// The deepest cause of an error, which says what happened (the outer layers of the SDK's errors
/// name its own types).
fn innermost(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = e;
    while let Some(next) = cause.source() {
        cause = next;
    }
    let text = cause.to_string();
    let text = if text.trim().is_empty() {
        e.to_string()
    } else {
        text
    };
    readable_content_type(&without_type_names(&text))
}

/// rmcp's "Unexpected content type: Some(\"text/html\")" as a person reads it, with what a page
/// usually means: a URL that is not the server's MCP endpoint.
fn readable_content_type(text: &str) -> String {
    const AT: &str = "Unexpected content type: Some(\"";
    let Some(start) = text.find(AT) else {
        return text.to_string();
    };
    let after = &text[start + AT.len()..];
    let Some(end) = after.find("\")") else {
        return text.to_string();
    };
    let kind = &after[..end];
    let hint = if kind.starts_with("text/html") {
        " (a web page, not MCP: is the URL the server's MCP endpoint?)"
    } else {
        ""
    };
    format!(
        "{}the server answered {kind}{hint}{}",
        &text[..start],
        &after[end + 2..]
    )
}

/// `text` without the Rust type names rmcp puts in some messages (`Transport
/// [rmcp::transport::worker::WorkerTransport<...>] error: ...`): a user reads the cause, not the
/// SDK's types.
fn without_type_names(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find(" [") {
        let Some(close) = rest[open..].find(']').map(|i| open + i) else {
            break;
        };
        let inside = &rest[open + 2..close];
        out.push_str(&rest[..open]);
        if !inside.contains("::") {
            out.push_str(&rest[open..=close]);
        }
        rest = &rest[close + 1..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_unexpected_content_type_reads_as_what_the_server_answered() {
        assert_eq!(
            super::readable_content_type(
                "Unexpected content type: Some(\"text/html\"), when send initialize request"
            ),
            "the server answered text/html (a web page, not MCP: is the URL the server's MCP \
             endpoint?), when send initialize request"
        );
        assert_eq!(super::readable_content_type("Broken pipe"), "Broken pipe");
    }
}
