//! colony's side of an MCP session as a server, on `rmcp`'s [`ServerHandler`]: the lists
//! (tools, resources, templates, prompts) read from the programs' [`Exports`] at each request,
//! calls run by [`super::call`], resources and prompts read by the script's functions,
//! `logging/setLevel`, completions, and `notifications/*/list_changed` when a program adds
//! to its lists.

// Logging (`logging/setLevel`, `notifications/message`) is deprecated in rmcp for the stateless
// 2026 revision; the revisions served here (2025-03-26 to 2025-11-25) still define it.
#![allow(deprecated)]

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CompleteRequestParams, CompleteResult,
    GetPromptRequestParams, GetPromptResponse, ListPromptsResult, ListResourceTemplatesResult,
    ListResourcesResult, ListToolsResult, LoggingLevel, PaginatedRequestParams, ProtocolVersion,
    ReadResourceRequestParams, ReadResourceResponse, ServerConfig, SetLevelRequestParams,
};
use rmcp::service::{NotificationContext, Peer, RequestContext};
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::ask::{self, Asker};
use super::call::{self, Caller, Outcome};
use super::content;
use super::exports::{Client, Closer, Exports, Report, Reporter};
use super::streams::Streams;
use crate::residents::Route;

/// One program's offer: what it exports and the route its handlers and residents run on.
#[derive(Clone)]
pub struct Offer {
    /// The program's name, for messages (`colony serve`'s name of it, or its file's stem).
    pub program: String,
    pub exports: Exports,
    pub route: Route,
}

impl Offer {
    /// Waits until the program has made its first exports: its main chunk returned, or its
    /// watch is up (a program that watches does not return while it serves), or it stopped.
    pub async fn ready(&self) {
        tokio::select! {
            _ = self.exports.ready() => {}
            _ = self.route.opened() => {}
        }
    }

    /// [`Offer::ready`], for at most `patience`. A program that was not ready in time is not
    /// waited for again (its exports count as made: what it adds later is told to clients by
    /// `list_changed`), so a main chunk that never returns costs one wait, not one a request.
    pub async fn ready_within(&self, patience: std::time::Duration) {
        if tokio::time::timeout(patience, self.ready()).await.is_err() {
            tracing::warn!(
                program = %self.program,
                "not ready after {} s (its main chunk has not returned and it has no watch up): \
                 serving what it exports so far",
                patience.as_secs()
            );
            self.exports.set_ready();
        }
    }
}

/// The programs a server offers now (a hosted program restarts with new exports).
pub trait Programs: Send + Sync {
    fn offers(&self) -> Vec<Offer>;

    /// Told each time the programs offered change (one started, restarted, stopped, added or
    /// removed): every list a session was given may have changed. `None`: they never do.
    fn lineup(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }
}

/// One program, fixed (`colony mcp serve`).
pub struct One(pub Offer);

impl Programs for One {
    fn offers(&self) -> Vec<Offer> {
        vec![self.0.clone()]
    }
}

/// How long a request waits for a program that is still starting.
const READY_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The revisions served, oldest first.
pub fn revisions() -> Vec<ProtocolVersion> {
    vec![
        ProtocolVersion::V_2025_03_26,
        ProtocolVersion::V_2025_06_18,
        ProtocolVersion::V_2025_11_25,
    ]
}

/// A server for one session. Cheap to clone.
#[derive(Clone)]
pub struct Server {
    programs: Arc<dyn Programs>,
    /// Who is on the other end when the request does not say (stdio).
    caller: Caller,
    name: String,
    /// The least severe level the client wants (`logging/setLevel`); everything until it says.
    level: Arc<Mutex<Option<LoggingLevel>>>,
    /// The HTTP sessions, where a call may close its stream (none over stdio).
    streams: Option<Arc<Streams>>,
    /// Why the server itself ends its session, once it does ([`Server::ending`]): a call cut
    /// then is answered with that, not "cancelled by the client".
    ending: Arc<Mutex<Option<String>>>,
}

/// Reads a model value from JSON (rmcp's types are `non_exhaustive`, JSON is their contract).
fn model<T: DeserializeOwned>(v: Value) -> Result<T, ErrorData> {
    serde_json::from_value(v).map_err(|e| ErrorData::internal_error(e.to_string(), None))
}

fn rank(level: LoggingLevel) -> u8 {
    match level {
        LoggingLevel::Debug => 0,
        LoggingLevel::Info => 1,
        LoggingLevel::Notice => 2,
        LoggingLevel::Warning => 3,
        LoggingLevel::Error => 4,
        LoggingLevel::Critical => 5,
        LoggingLevel::Alert => 6,
        LoggingLevel::Emergency => 7,
    }
}

/// What a call's client is told while it runs, in order: a channel drained by one task, which
/// the call waits for before it answers (so progress arrives before the result).
struct Notifier {
    reporter: Reporter,
    drained: tokio::task::JoinHandle<()>,
    /// Asks this call's client (`ctx.sample`, `ctx.elicit`), on the call's own stream.
    asker: Asker,
}

impl Notifier {
    fn client(&self, closer: Option<Closer>) -> Client {
        Client {
            reporter: self.reporter.clone(),
            asker: Some(self.asker.clone()),
            closer,
        }
    }
}

impl Server {
    pub fn new(programs: Arc<dyn Programs>, caller: Caller, name: impl Into<String>) -> Server {
        Server {
            programs,
            caller,
            name: name.into(),
            level: Arc::new(Mutex::new(None)),
            streams: None,
            ending: Arc::new(Mutex::new(None)),
        }
    }

    /// Where to say why the server ends its session (before cancelling it): what the calls
    /// still running are answered.
    pub fn ending(&self) -> Arc<Mutex<Option<String>>> {
        self.ending.clone()
    }

    /// A server on `/mcp`'s sessions: its calls may close their SSE streams (SSE polling).
    pub fn with_streams(mut self, streams: Arc<Streams>) -> Server {
        self.streams = Some(streams);
        self
    }

    /// The HTTP session of this request and the sessions it is in, if it came over HTTP.
    fn session_of(&self, context: &RequestContext<RoleServer>) -> Option<(Arc<Streams>, String)> {
        let streams = self.streams.clone()?;
        let session = context
            .extensions
            .get::<axum::http::request::Parts>()?
            .headers
            .get("mcp-session-id")?
            .to_str()
            .ok()?
            .to_string();
        Some((streams, session))
    }

    /// Forgets this call's stream; a call that closed it answers once its client is back.
    async fn finish(&self, context: &RequestContext<RoleServer>) {
        if let Some((streams, session)) = self.session_of(context) {
            streams.finish(&session.into(), &context.id).await;
        }
    }

    /// How this call closes its stream, over HTTP.
    fn closer(&self, context: &RequestContext<RoleServer>) -> Option<Closer> {
        let (streams, session) = self.session_of(context)?;
        let request = context.id.clone();
        let session: rmcp::transport::common::server_side_http::SessionId = session.into();
        Some(Arc::new(move |retry| {
            let (streams, session, request) = (streams.clone(), session.clone(), request.clone());
            Box::pin(async move { streams.close(&session, &request, retry).await })
        }))
    }

    /// The caller of this request: what the HTTP front put in its extensions, else the
    /// session's.
    fn caller_of(&self, context: &RequestContext<RoleServer>) -> Caller {
        context
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|p| p.extensions.get::<Caller>())
            .or_else(|| context.extensions.get::<Caller>())
            .cloned()
            .unwrap_or_else(|| self.caller.clone())
    }

    fn notifier(&self, context: &RequestContext<RoleServer>) -> Notifier {
        let token = context.meta.get_progress_token();
        let peer = context.peer.clone();
        let level = self.level.clone();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Report>();
        let drained = tokio::spawn(async move {
            while let Some(report) = rx.recv().await {
                send(&peer, token.as_ref(), &level, report).await;
            }
        });
        Notifier {
            reporter: call::reporter(move |r| {
                let _ = tx.send(r);
            }),
            drained,
            asker: ask::asker(context.peer.clone(), context.id.clone()),
        }
    }

    /// The programs' offers, each once it has made its first exports (waiting at most
    /// [`READY_WAIT`] for a program still starting).
    async fn offers(&self) -> Vec<Offer> {
        let offers = self.programs.offers();
        futures::future::join_all(offers.iter().map(|o| o.ready_within(READY_WAIT))).await;
        offers
    }

    /// `Ok` for a resource (or a template's instance) some program offers.
    async fn known_resource(&self, uri: &str) -> Result<(), ErrorData> {
        let known = self.offers().await.iter().any(|o| {
            o.exports.resources().iter().any(|r| {
                if r.template {
                    content::match_template(&r.uri, uri).is_some()
                } else {
                    r.uri == uri
                }
            })
        });
        if known {
            Ok(())
        } else {
            Err(ErrorData::resource_not_found(
                format!("no resource {uri:?}"),
                Some(json!({ "uri": uri })),
            ))
        }
    }

    async fn find_tool(&self, name: &str) -> Option<(Offer, Target)> {
        for offer in self.offers().await {
            if let Some(t) = offer
                .exports
                .tools()
                .into_iter()
                .find(|t| t.spec.name == name)
            {
                return Some((offer, Target::Tool(Box::new(t))));
            }
            if let Some(r) = offer
                .exports
                .residents()
                .into_iter()
                .find(|r| r.name == name)
            {
                return Some((offer, Target::Resident(r)));
            }
        }
        None
    }
}

/// Each export once by its key (a tool's or resident's name, a resource's URI, a prompt's name),
/// from the first program that offers it: the one a call, read or get finds first. Another
/// program's export of the same key is left out of the list, and the service's log says so once,
/// where before tools were silently shadowed and resources and prompts listed twice.
fn first_of_each(
    offers: &[Offer],
    kind: &str,
    exports: impl Fn(&Offer) -> Vec<(String, Value)>,
) -> Vec<Value> {
    let mut first: HashMap<String, &str> = HashMap::new();
    let mut list = Vec::new();
    for offer in offers {
        for (key, entry) in exports(offer) {
            match first.get(key.as_str()) {
                None => {
                    first.insert(key, &offer.program);
                    list.push(entry);
                }
                Some(owner) => shadowed(kind, &key, owner, &offer.program),
            }
        }
    }
    list
}

/// Warns, once a process for each, that `program`'s export `key` is hidden behind `owner`'s.
fn shadowed(kind: &str, key: &str, owner: &str, program: &str) {
    static WARNED: crate::said::SaidOnce = crate::said::SaidOnce::new();
    if WARNED.first(&format!("{kind}\0{key}\0{owner}\0{program}")) {
        tracing::warn!(
            "/mcp: {program} also exports the {kind} {key:?}, which {owner} answers for: \
             give one of them another name"
        );
    }
}

enum Target {
    Tool(Box<crate::turn::ToolDef>),
    Resident(super::exports::ResidentExport),
}

#[allow(deprecated)]
async fn send(
    peer: &Peer<RoleServer>,
    token: Option<&rmcp::model::ProgressToken>,
    level: &Mutex<Option<LoggingLevel>>,
    report: Report,
) {
    match report {
        Report::Progress {
            progress,
            total,
            message,
        } => {
            // Progress goes only to a request that asked for it (with a token).
            let Some(token) = token else { return };
            let mut p = json!({ "progressToken": token, "progress": progress });
            if let Some(t) = total {
                p["total"] = json!(t);
            }
            if let Some(m) = message {
                p["message"] = json!(m);
            }
            if let Ok(p) = model(p) {
                let _ = peer.notify_progress(p).await;
            }
        }
        Report::Log { level: l, data } => {
            let Ok(asked) = model::<LoggingLevel>(json!(l)) else {
                return;
            };
            let least = *level.lock().unwrap_or_else(|e| e.into_inner());
            if least.is_some_and(|least| rank(asked) < rank(least)) {
                return;
            }
            if let Ok(p) = model(json!({ "level": l, "logger": "colony", "data": data })) {
                let _ = peer.notify_logging_message(p).await;
            }
        }
    }
}

/// A call's outcome as the client reads it: the text (and the structured value when the text is
/// a JSON object), images and audio as their blocks, other files as embedded resources. A
/// handler that answers `{ content = { blocks... } }` gives its MCP content blocks as they are.
fn result(outcome: Outcome) -> Result<CallToolResponse, ErrorData> {
    if !outcome.is_error
        && let Ok(Value::Object(o)) = serde_json::from_str::<Value>(&outcome.text)
        && let Some(Value::Array(blocks)) = o.get("content")
        && blocks
            .iter()
            .all(|b| b.get("type").is_some_and(Value::is_string))
    {
        let mut r = json!({ "content": blocks });
        if let Some(e) = o
            .get("is_error")
            .or(o.get("isError"))
            .and_then(Value::as_bool)
        {
            r["isError"] = json!(e);
        }
        if let Some(s) = o.get("structured") {
            r["structuredContent"] = s.clone();
        }
        // Blocks MCP does not know are the handler's mistake, said as its call's error: they
        // were a JSON-RPC internal error (-32603) the client showed as a failure of the server.
        return match model::<rmcp::model::CallToolResult>(r) {
            Ok(r) => Ok(r.into()),
            Err(e) => refused(format!(
                "the tool answered content blocks that are not MCP's ({}): give blocks of type \
                 text, image, audio, resource or resource_link",
                e.message
            )),
        };
    }
    let mut content = vec![json!({ "type": "text", "text": outcome.text })];
    content.extend(outcome.files.iter().filter_map(content::file_block));
    let mut r = json!({ "content": content, "isError": outcome.is_error });
    if !outcome.is_error
        && let Ok(Value::Object(o)) = serde_json::from_str::<Value>(&outcome.text)
    {
        r["structuredContent"] = Value::Object(o);
    }
    let r: rmcp::model::CallToolResult = model(r)?;
    Ok(r.into())
}

fn refused(text: String) -> Result<CallToolResponse, ErrorData> {
    result(Outcome {
        text,
        files: Vec::new(),
        is_error: true,
    })
}

impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        model(json!({
            "protocolVersion": ProtocolVersion::V_2025_11_25,
            "capabilities": {
                "tools": { "listChanged": true },
                "resources": { "listChanged": true, "subscribe": true },
                "prompts": { "listChanged": true },
                "logging": {},
                "completions": {}
            },
            "serverInfo": { "name": self.name, "version": env!("CARGO_PKG_VERSION") },
        }))
        .expect("a valid server config")
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Owned(revisions())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let tools = first_of_each(&self.offers().await, "tool", |o| {
            let tools = o.exports.tools().into_iter().map(|t| {
                let entry = json!({
                    "name": t.spec.name,
                    "description": t.spec.description,
                    "inputSchema": t.spec.parameters,
                });
                (t.spec.name, entry)
            });
            let residents = o.exports.residents().into_iter().map(|r| {
                let entry = json!({
                    "name": r.name,
                    "description": r.description,
                    "inputSchema": call::resident_schema(),
                });
                (r.name, entry)
            });
            tools.chain(residents).collect()
        });
        model(json!({ "tools": tools }))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let caller = self.caller_of(&context);
        let args = request.arguments.clone().unwrap_or_default();
        let Some((offer, target)) = self.find_tool(&request.name).await else {
            // Not offered: unknown, or a tool the program did not mark exportable.
            // A stopped program's tools are not offered either: that is said, as well as the
            // `exportable` it may lack (a stopped program's tool sent people off to check it).
            let message = format!(
                "unknown tool {:?}: it is not exported by any program running now (a tool is \
                 offered once marked exportable, while its program runs)",
                request.name
            );
            for offer in self.offers().await {
                call::refused(
                    &offer.route,
                    &caller,
                    &request.name,
                    "not_exported",
                    &message,
                );
            }
            self.finish(&context).await;
            return refused(message);
        };
        let notifier = self.notifier(&context);
        let cancelled = context.ct.clone();
        let run = async {
            match &target {
                Target::Tool(def) => {
                    call::tool(
                        &offer.route,
                        &offer.exports,
                        def,
                        args,
                        &caller,
                        Some(notifier.client(self.closer(&context))),
                    )
                    .await
                }
                Target::Resident(r) => {
                    call::resident(
                        &offer.route,
                        r,
                        args,
                        &caller,
                        Some(notifier.reporter.clone()),
                    )
                    .await
                }
            }
        };
        let outcome = tokio::select! {
            o = run => o,
            _ = cancelled.cancelled() => Outcome {
                text: self
                    .ending
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone()
                    .unwrap_or_else(|| "cancelled by the client".into()),
                files: Vec::new(),
                is_error: true,
            },
        };
        let Notifier {
            reporter, drained, ..
        } = notifier;
        drop(reporter);
        let _ = drained.await;
        self.finish(&context).await;
        result(outcome)
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let list = first_of_each(&self.offers().await, "resource", |o| {
            o.exports
                .resources()
                .into_iter()
                .filter(|r| !r.template)
                .map(|r| (r.uri.clone(), content::resource_entry(&r, "uri")))
                .collect()
        });
        model(json!({ "resources": list }))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        let list = first_of_each(&self.offers().await, "resource template", |o| {
            o.exports
                .resources()
                .into_iter()
                .filter(|r| r.template)
                .map(|r| (r.uri.clone(), content::resource_entry(&r, "uriTemplate")))
                .collect()
        });
        model(json!({ "resourceTemplates": list }))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        for offer in self.offers().await {
            if let Some(v) = content::read(&offer, &request.uri).await {
                return model::<rmcp::model::ReadResourceResult>(v?).map(Into::into);
            }
        }
        Err(ErrorData::resource_not_found(
            format!("no resource {:?}", request.uri),
            Some(json!({ "uri": request.uri })),
        ))
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        let list = first_of_each(&self.offers().await, "prompt", |o| {
            o.exports
                .prompts()
                .into_iter()
                .map(|p| (p.name.clone(), content::prompt_entry(&p)))
                .collect()
        });
        model(json!({ "prompts": list }))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        let args = request.arguments.clone().unwrap_or_default();
        for offer in self.offers().await {
            if let Some(p) = offer
                .exports
                .prompts()
                .into_iter()
                .find(|p| p.name == request.name)
            {
                let v = content::prompt(&offer, &p, args).await?;
                return model::<rmcp::model::GetPromptResult>(v).map(Into::into);
            }
        }
        Err(ErrorData::invalid_params(
            format!("no prompt {:?}", request.name),
            None,
        ))
    }

    async fn complete(
        &self,
        request: CompleteRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, ErrorData> {
        let asked = serde_json::to_value(&request).unwrap_or(Value::Null);
        let name = asked["ref"]["name"].as_str().unwrap_or("");
        let mut values = Vec::new();
        for offer in self.offers().await {
            if let Some(p) = offer.exports.prompts().into_iter().find(|p| p.name == name) {
                values =
                    content::complete(&offer, &p, &request.argument.name, &request.argument.value)
                        .await?;
                break;
            }
        }
        let total = values.len();
        values.truncate(100);
        model(json!({ "completion": { "values": values, "total": total, "hasMore": total > 100 } }))
    }

    /// Accepted for a resource the programs offer; colony's resources do not announce updates
    /// yet (`notifications/resources/updated` is never sent), so a subscription only succeeds.
    async fn subscribe(
        &self,
        request: rmcp::model::SubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.known_resource(&request.uri).await
    }

    async fn unsubscribe(
        &self,
        request: rmcp::model::UnsubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.known_resource(&request.uri).await
    }

    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        *self.level.lock().unwrap_or_else(|e| e.into_inner()) = Some(request.level);
        Ok(())
    }

    /// rmcp hands over as "custom" a request of a known method whose params it could not read
    /// (`tools/call` with `arguments: [1, 2]`, no `name`): answered `-32602 Invalid params`
    /// naming what is wrong, not "method not found" for a method that exists.
    async fn on_custom_request(
        &self,
        request: rmcp::model::CustomRequest,
        _context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::CustomResult, ErrorData> {
        let params = request.params.clone().unwrap_or(Value::Null);
        let problem = match request.method.as_str() {
            "tools/call" => params_problem::<CallToolRequestParams>(params),
            "resources/read" | "resources/subscribe" | "resources/unsubscribe" => {
                params_problem::<ReadResourceRequestParams>(params)
            }
            "prompts/get" => params_problem::<GetPromptRequestParams>(params),
            "logging/setLevel" => params_problem::<SetLevelRequestParams>(params),
            "completion/complete" => params_problem::<CompleteRequestParams>(params),
            "tools/list" | "resources/list" | "resources/templates/list" | "prompts/list" => {
                params_problem::<Option<PaginatedRequestParams>>(params)
            }
            _ => {
                return Err(ErrorData::new(
                    rmcp::model::ErrorCode::METHOD_NOT_FOUND,
                    request.method,
                    None,
                ));
            }
        };
        Err(ErrorData::invalid_params(
            format!(
                "{}: the params do not read: {}",
                request.method,
                problem.unwrap_or_else(|| "they are not what the method takes".into())
            ),
            None,
        ))
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        // Tell this client when a program adds to a list, or the programs offered change (a
        // restart, a reload, one added), until it goes away. Subscribed before anything here
        // waits: a call the client makes right after `initialized` (one that adds a tool) may
        // run as soon as this yields, and its change must not be taken as the start.
        let programs = self.programs.clone();
        let lineup = programs.lineup();
        let watched = Watched::all(&programs.offers());
        tokio::spawn(tell_changes(
            programs,
            lineup,
            watched,
            context.peer.clone(),
        ));
    }
}

/// One program's lists, as this session was last told of them.
struct Watched {
    changes: tokio::sync::watch::Receiver<super::exports::Changes>,
    last: super::exports::Changes,
}

impl Watched {
    fn all(offers: &[Offer]) -> Vec<Watched> {
        offers
            .iter()
            .map(|offer| {
                let mut changes = offer.exports.changes();
                let last = *changes.borrow_and_update();
                Watched { changes, last }
            })
            .collect()
    }
}

/// What woke [`tell_changes`].
enum Woke {
    /// The programs offered changed (`false`: the host has gone).
    Lineup(bool),
    /// Program `i`'s lists changed (`false`: the program has ended).
    Lists(usize, bool),
}

/// Sends `peer` a `list_changed` for each list that changes, until it goes away.
async fn tell_changes(
    programs: Arc<dyn Programs>,
    mut lineup: Option<tokio::sync::watch::Receiver<u64>>,
    mut watched: Vec<Watched>,
    peer: rmcp::Peer<RoleServer>,
) {
    let told_of_lineup = lineup.is_some();
    loop {
        let woke = {
            let lineup_changed = async {
                match lineup.as_mut() {
                    Some(l) => l.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            if watched.is_empty() {
                if !told_of_lineup {
                    return;
                }
                Woke::Lineup(lineup_changed.await)
            } else {
                let lists = futures::future::select_all(
                    watched.iter_mut().map(|w| Box::pin(w.changes.changed())),
                );
                tokio::select! {
                    ok = lineup_changed => Woke::Lineup(ok),
                    (changed, i, _) = lists => Woke::Lists(i, changed.is_ok()),
                }
            }
        };
        let sent = match woke {
            Woke::Lineup(false) => return,
            // Every list may have changed: told all three, and the new programs watched.
            Woke::Lineup(true) => {
                watched = Watched::all(&programs.offers());
                peer.notify_tool_list_changed().await.is_ok()
                    && peer.notify_resource_list_changed().await.is_ok()
                    && peer.notify_prompt_list_changed().await.is_ok()
            }
            // Its end changes the lineup, which tells.
            Woke::Lists(i, false) => {
                watched.swap_remove(i);
                true
            }
            Woke::Lists(i, true) => {
                let w = &mut watched[i];
                let now = *w.changes.borrow_and_update();
                // Each list that changed is told: one wake-up may hold several changes.
                let mut sent = true;
                if now.tools != w.last.tools {
                    sent &= peer.notify_tool_list_changed().await.is_ok();
                }
                if now.resources != w.last.resources {
                    sent &= peer.notify_resource_list_changed().await.is_ok();
                }
                if now.prompts != w.last.prompts {
                    sent &= peer.notify_prompt_list_changed().await.is_ok();
                }
                w.last = now;
                sent
            }
        };
        if !sent || peer.is_transport_closed() {
            return;
        }
    }
}

/// Why `params` do not read as a `P`, if they do not.
fn params_problem<P: DeserializeOwned>(params: Value) -> Option<String> {
    serde_json::from_value::<P>(params)
        .err()
        .map(|e| e.to_string())
}
