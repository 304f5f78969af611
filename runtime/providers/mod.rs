//! Model providers: the catalogue, one module per wire style, and the one function that calls them.
//!
//! A provider is an [`Endpoint`] (base URL, key, model) plus a [`Style`]; [`Providers::infer`]
//! dispatches on the style. Each style module is a [`Codec`]: it builds the wire request from an
//! [`InferRequest`], parses a whole response, and assembles a streamed one from SSE events. Above
//! this module only neutral types exist.

pub mod anthropic;
pub mod body;
pub mod catalogue;
pub mod errors;
pub mod gemini;
pub mod openai;
pub mod replay;
pub mod sse;
pub mod structured;
pub mod text_tools;
pub mod token_counts;
pub mod wire_names;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde_json::Value;

pub use catalogue::{CatalogueEntry, ToolsLevel};
pub use errors::ProviderError;

use crate::vocab::{InferRequest, Inferred, Style};

/// Where and how to reach a model. The key is read when the endpoint is resolved, which happens
/// for every request, so a rotated key lands mid-run.
#[derive(Clone)]
pub struct Endpoint {
    /// Catalogue id (`anthropic`, `groq`, ...) or `custom` for a bare base URL.
    pub provider: String,
    pub style: Style,
    /// Without a trailing slash, e.g. `https://api.openai.com/v1`.
    pub base_url: String,
    pub key: Option<String>,
    pub tools_level: ToolsLevel,
    pub timeout: Duration,
    /// The most of an answer read (`max_response_bytes`): past it the call is a `fetch_error`.
    pub max_response_bytes: u64,
    /// What the model reads beyond the style's file table.
    pub reads: crate::files::forms::Reads,
    /// The most calls in flight at once to this endpoint's host (`max_concurrent_calls`, default
    /// [`DEFAULT_MAX_CONCURRENT_CALLS`]); more wait their turn, in the order they came.
    pub max_concurrent_calls: usize,
}

impl Endpoint {
    /// The base URL without a trailing slash, for joining paths onto.
    pub fn base(&self) -> &str {
        self.base_url.trim_end_matches('/')
    }
}

/// The strings at `items[].field` of a model-list answer (`data[].id`, `models[].name`);
/// `Err` when it has no `items` list.
pub fn list_field<'a>(body: &'a Value, items: &str, field: &str) -> Result<Vec<&'a str>, String> {
    Ok(list_of(body, items)?
        .iter()
        .filter_map(|m| m.get(field).and_then(Value::as_str))
        .collect())
}

/// The list at `items` of a model-list answer, or what it lacks. A `null` list is an empty
/// one: Ollama with no model pulled answers `"data": null` (Go's nil slice).
pub fn list_of<'a>(body: &'a Value, items: &str) -> Result<&'a [Value], String> {
    match body.get(items) {
        Some(Value::Array(list)) => Ok(list),
        Some(Value::Null) => Ok(&[]),
        _ => Err(format!("the answer has no {items:?} list of models")),
    }
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("provider", &self.provider)
            .field("style", &self.style)
            .field("base_url", &self.base_url)
            .field("key", &self.key.as_ref().map(|_| "[redacted]"))
            .field("tools_level", &self.tools_level)
            .finish()
    }
}

/// A request ready for the wire. Headers may hold the key: never log this value.
pub struct WireRequest {
    pub url: String,
    pub headers: Vec<(String, String)>,
    /// The JSON body, written out (empty for a GET).
    pub body: Vec<u8>,
}

impl WireRequest {
    /// A request whose body is this JSON value.
    pub fn with_json(url: String, headers: Vec<(String, String)>, body: &Value) -> WireRequest {
        WireRequest {
            url,
            headers,
            body: serde_json::to_vec(body).expect("a JSON value serialises"),
        }
    }

    /// The body read back as JSON, for whoever looks inside it (tests, mostly); `null` for a
    /// request without one.
    pub fn json(&self) -> Value {
        if self.body.is_empty() {
            return Value::Null;
        }
        serde_json::from_slice(&self.body).expect("a codec writes JSON")
    }
}

/// One wire style's translations, both ways.
pub trait Codec: Sync {
    /// The HTTP request for `req`; `stream` asks for SSE.
    fn request(&self, req: &InferRequest, ep: &Endpoint, stream: bool) -> WireRequest;
    /// A whole (non-streamed) 2xx response body.
    fn parse(&self, body: &[u8]) -> Result<Inferred, ProviderError>;
    /// A fresh assembler for one streamed response.
    fn assembler(&self) -> Box<dyn Assembler>;
    /// The URL and headers that list the models an account can reach, and how to read the answer.
    fn models_request(&self, ep: &Endpoint) -> WireRequest;
    /// The models listed; `Err` names the list the answer lacks (a base URL that reaches
    /// something else answers JSON of another shape, which listed nothing, status 0).
    fn parse_models(&self, body: &Value) -> Result<Vec<String>, String>;
}

/// Builds an [`Inferred`] from the events of one SSE stream.
pub trait Assembler: Send {
    /// One event: its `event:` name (empty when the server sends none) and its `data` payload.
    /// Visible text deltas are handed to `on_text` in order as they arrive.
    fn event(
        &mut self,
        event: &str,
        data: &str,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<(), ProviderError>;
    /// The stream ended (the server closed it, or sent its end marker). Tool arguments still open
    /// are closed here; a stream cut before its end marker is an error unless the style says
    /// otherwise.
    fn finish(self: Box<Self>) -> Result<Inferred, ProviderError>;
}

/// The codec for a wire style. Replay has none: it never touches the wire.
pub fn codec(style: Style) -> Option<&'static dyn Codec> {
    match style {
        Style::Anthropic => Some(&anthropic::Anthropic),
        Style::Openai => Some(&openai::OpenAi),
        Style::Gemini => Some(&gemini::Gemini),
        Style::Replay => None,
    }
}

/// Merges `extra` (a JSON object) over `body`, key by key, recursing into objects.
pub fn merge_extra(body: &mut Value, extra: Option<&Value>) {
    let (Some(Value::Object(extra)), Value::Object(target)) = (extra, body) else {
        return;
    };
    for (k, v) in extra {
        match (target.get_mut(k), v) {
            (Some(existing @ Value::Object(_)), Value::Object(_)) => {
                merge_extra(existing, Some(v));
            }
            _ => {
                target.insert(k.clone(), v.clone());
            }
        }
    }
}

/// How many model calls may be in flight at once to one provider host unless a use-type sets
/// `max_concurrent_calls`. Over HTTP/1.1 each call in flight holds a connection of its own (and
/// its buffers), so without a bound a program of 1,000 residents opens 1,000 sockets to one
/// provider in a burst (outages end for all of them at once) and keeps them. 100 is the
/// keep-alive pool of the official Anthropic and OpenAI SDKs: at a few seconds a call it is more
/// than most accounts' rate limits allow, and at 10-30 kB a connection it costs a few MB.
pub const DEFAULT_MAX_CONCURRENT_CALLS: usize = 100;

/// One semaphore per provider host and limit, shared by every client of a program (the core's
/// and the Lua thread's), so the limit is on the program's calls, not on one pool's. Use-types
/// that reach one host with different limits are counted apart.
type CallLimits = dashmap::DashMap<(String, usize), Arc<tokio::sync::Semaphore>>;

/// `scheme://host:port` of a base URL: the part a connection pool keys on.
fn origin(base_url: &str) -> &str {
    let after_scheme = base_url.find("://").map_or(0, |i| i + 3);
    match base_url[after_scheme..].find('/') {
        Some(i) => &base_url[..after_scheme + i],
        None => base_url,
    }
}

/// The client model calls go out on. Its pool keeps at most [`DEFAULT_MAX_CONCURRENT_CALLS`]
/// idle connections to a host, for 90 s each: the call limit ([`Providers::slot`]) bounds the
/// connections in use, and this bounds the ones the pool opens beyond them (while a finished
/// call's connection is being handed back, a waiting call may open another, which then joins the
/// idle ones), so one pool holds at most the call limit plus 100 sockets to a host, however
/// the load comes.
fn new_client() -> reqwest::Client {
    crate::tls::client_builder()
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(DEFAULT_MAX_CONCURRENT_CALLS)
        .redirect(same_origin_redirects("the provider", true))
        // A Referer would carry the original URL, and with it a `?key=` (Gemini).
        .referer(false)
        .build()
        .expect("the HTTP client builds")
}

/// The client a model list (a GET) goes out on: as [`new_client`]'s, but a 301, 302 or 303
/// is followed, a GET having no body to lose.
fn listing_client() -> reqwest::Client {
    crate::tls::client_builder()
        .redirect(same_origin_redirects("the provider", false))
        .referer(false)
        .build()
        .expect("the HTTP client builds")
}

/// Redirects a call that carries secrets follows (a model call; an MCP server's requests with its
/// configured headers): within the origin it was sent to, at most ten. A redirect to another host
/// (or port, or scheme) would carry the key headers (`x-api-key`, `x-goog-api-key`, a server's
/// `Authorization`) there, so it is refused, naming `who` and where it pointed.
///
/// For a client that `posts`, a 301, 302 or 303 is refused too: followed, it turns the call (a
/// POST) into a GET without its body, which the server then answered with a 405 that never
/// said a redirect came first (an `http://` base URL in front of `https://`, a missing
/// trailing slash). 307 and 308 keep the method and the body, and are followed.
pub(crate) fn same_origin_redirects(who: &'static str, posts: bool) -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(move |attempt| {
        let origin = attempt.previous().first().map(reqwest::Url::origin);
        let status = attempt.status();
        if origin.is_some_and(|o| o != attempt.url().origin()) {
            let to = crate::secrets::redact(attempt.url().as_str());
            attempt.error(format!(
                "{who} redirected to another host ({to}); colony does not send a key there"
            ))
        } else if posts && matches!(status.as_u16(), 301..=303) {
            let to = crate::secrets::redact(attempt.url().as_str());
            attempt.error(format!(
                "{who} answered {status} to {to}: a redirect that would send the call on as a \
                 GET without its body; set the URL to where it points"
            ))
        } else if attempt.previous().len() > 10 {
            attempt.error("more than 10 redirects")
        } else {
            attempt.follow()
        }
    })
}

/// The most of an error answer read: its message is all colony keeps of it.
const MAX_ERROR_BODY: u64 = 1 << 20;

/// A failure to read an answer's body, as the call's error: past the limit a `config_error`
/// naming it (the next answer would be as long, and each try reads the limit's worth), a
/// timeout saying so, anything else as [`ProviderError::fetch`].
pub(crate) fn body_failure(e: body::BodyError, ep: &Endpoint) -> ProviderError {
    match e {
        body::BodyError::TooLarge(_) => ProviderError::Config(format!(
            "{e}; raise max_response_bytes in the use-type to read more"
        )),
        body::BodyError::Transport(e) => transport_failure(&e, ep),
    }
}

/// How long a model list may take: the use-type's timeout is sized for a model's answer (600 s
/// by default), and `colony models` or the wizard against a server that never answers sat
/// silent for all of it.
fn model_list_timeout(use_type: Duration) -> Duration {
    use_type.min(Duration::from_secs(30))
}

/// A request that got no (whole) answer; a timeout names the timeout that ran out.
fn transport_failure(e: &reqwest::Error, ep: &Endpoint) -> ProviderError {
    if e.is_timeout() {
        return ProviderError::Fetch(format!(
            "timed out after {} s (its use-type's timeout, or the call's own)",
            ep.timeout.as_secs_f64()
        ));
    }
    ProviderError::fetch(e)
}

/// A whole answer the codec could not read, classified as the same fault streamed would be: a
/// body whose JSON ends early was cut off (a `fetch_error`, as a stream that ends before its
/// end marker), and an error object in a 200 answer is the error it names (as an `error` event
/// in a stream). `framed`: the body's end was announced (a `Content-Length`, or chunked
/// encoding's last chunk), so every byte came and the server itself sent JSON that stops
/// half-way (a proxy whose upstream failed mid-answer, say): still worth a retry, but not
/// called a cut the server did not make.
/// A 200 answer to a streamed call that says it is a page or a JSON document, not a stream of
/// events (a proxy's sign-in page, a gateway's error in a 200, a whole answer from a server
/// that ignores `stream: true`): read as what it is. Any other type is read as a stream, as a
/// server that labels its events loosely may.
fn not_a_stream(response: &reqwest::Response) -> bool {
    response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .is_some_and(|mime| mime == "text/html" || mime == "application/json")
}

/// The `Content-Encoding` of an answer colony did not ask to be compressed (it sends no
/// `Accept-Encoding`): a proxy that compresses anyway sent bytes that were read as text and
/// shown as garbage ("the server answered with a page: ^_M-oM-?...", "bad SSE: UTF8 error").
fn unasked_encoding(response: &reqwest::Response) -> Option<String> {
    let coding = response
        .headers()
        .get(reqwest::header::CONTENT_ENCODING)?
        .to_str()
        .unwrap_or("?")
        .trim()
        .to_string();
    (!coding.is_empty() && !coding.eq_ignore_ascii_case("identity")).then_some(coding)
}

/// What a 200 answer that is not a stream says: the provider's error if it holds one, else what
/// the page is (its title), never "the stream ended early", which reads as a failure that
/// passes.
fn unstreamed_answer(body: &str) -> ProviderError {
    if let Ok(value) = serde_json::from_str::<Value>(body)
        && value.get("error").is_some_and(|e| !e.is_null())
    {
        let mut e = errors::classify_stream_error(&value);
        if let ProviderError::Provider { message, .. } | ProviderError::Api { message, .. } = &mut e
        {
            *message = message.replacen("mid-stream:", "in a 200 answer:", 1);
        }
        return e;
    }
    a_page(body, "a stream of events")
}

/// A 2xx answer that is not the API's at all (a captive portal's page, a proxy's text, a
/// base URL that points at a website): what it is, summarised, in place of the JSON parser's
/// "expected value at line 1 column 1".
fn a_page(body: &str, wanted: &str) -> ProviderError {
    let shown = errors::summarise_body(body).unwrap_or_else(|| body.trim().to_string());
    let shown = if shown.is_empty() {
        "(an empty body)".to_string()
    } else {
        shown
    };
    ProviderError::Api {
        status: 200,
        message: format!(
            "the server answered with a page, not {wanted} (a proxy or a wrong base_url?): \
             {shown}"
        ),
        body: crate::secrets::redact(&shown),
    }
}

fn whole_body_fault(e: ProviderError, body: &[u8], framed: bool, url: &str) -> ProviderError {
    if !matches!(e, ProviderError::Parse(_)) {
        return e;
    }
    match serde_json::from_slice::<Value>(body) {
        Err(json) if json.is_eof() && framed => ProviderError::Fetch(format!(
            "the answer's JSON stops half-way ({} bytes, all the server announced: it sent an \
             unfinished answer)",
            body.len()
        )),
        Err(json) if json.is_eof() => ProviderError::Fetch(format!(
            "the answer ended early ({} bytes, its JSON cut off)",
            body.len()
        )),
        Ok(value) if value.get("error").is_some_and(|e| !e.is_null()) => {
            let mut e = errors::classify_stream_error(&value);
            if let ProviderError::Provider { message, .. } | ProviderError::Api { message, .. } =
                &mut e
            {
                *message = message.replacen("mid-stream:", "in a 200 answer:", 1);
            }
            e
        }
        // What does not even begin as JSON; a body that does (nested too deep, bytes that are
        // not UTF-8) stays a parse error.
        Err(_)
            if !body.trim_ascii_start().starts_with(b"{")
                && !body.trim_ascii_start().starts_with(b"[") =>
        {
            let text = String::from_utf8_lossy(body);
            a_page(&text, "the API's JSON").located(url, &text)
        }
        _ => e,
    }
}

/// Calls models: over HTTP, from a cassette, or over HTTP while recording one.
#[derive(Clone)]
pub struct Providers {
    /// Built on first use: a client loads the system's certificates (about 5 ms), which a
    /// program whose calls all go elsewhere (replay, the Lua thread's own pool) never needs.
    http: Arc<OnceLock<reqwest::Client>>,
    /// The model lists' client ([`listing_client`]), built on first use as `http` is: made for
    /// each list, it loaded the certificates again each time.
    listing: Arc<OnceLock<reqwest::Client>>,
    replay: Option<Arc<replay::Cassette>>,
    record: Option<Arc<replay::Recorder>>,
    limits: Arc<CallLimits>,
}

impl Providers {
    pub fn new(
        replay: Option<Arc<replay::Cassette>>,
        record: Option<Arc<replay::Recorder>>,
    ) -> Providers {
        Providers {
            http: Arc::default(),
            listing: Arc::default(),
            replay,
            record,
            limits: Arc::default(),
        }
    }

    /// The same providers with an HTTP client (and so a connection pool) of their own.
    ///
    /// A connection's I/O is driven by the runtime that opened it. The Lua thread makes its
    /// calls on its own runtime (crossing to the core and back costs two thread wake-ups, about
    /// 60 us a call on a 2-core machine), so it gets its own pool: a busy Lua thread then never
    /// stalls a connection the core's residents are using.
    pub fn with_own_client(&self) -> Providers {
        Providers {
            http: Arc::default(),
            listing: Arc::default(),
            ..self.clone()
        }
    }

    /// Whether a cassette answers every call.
    pub fn is_replaying(&self) -> bool {
        self.replay.is_some()
    }

    pub fn http(&self) -> &reqwest::Client {
        self.http.get_or_init(new_client)
    }

    /// A slot to call `ep`'s host on: held until its answer is read, so at most
    /// `ep.max_concurrent_calls` calls (and so connections in use) are open to it at once. Waiting is fair
    /// (first come, first served), so a burst is served in order and no caller starves; the wait
    /// does not count against the use-type's `timeout`, which bounds each call in flight and so
    /// the wait. A caller that gives up (a deadline, Ctrl-C) leaves the queue.
    async fn slot(&self, ep: &Endpoint) -> tokio::sync::OwnedSemaphorePermit {
        let limit = ep.max_concurrent_calls.max(1);
        let key = (origin(ep.base()).to_string(), limit);
        let semaphore = self
            .limits
            .entry(key)
            .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(limit)))
            .clone();
        semaphore
            .acquire_owned()
            .await
            .expect("a call limit's semaphore is never closed")
    }

    /// Sends one request to the endpoint's provider, or answers it from the replayed cassette
    /// (and records the answer when recording). With `on_text`, the response is streamed and each
    /// text delta handed over as it arrives; without, the whole response is fetched at once.
    pub async fn call(
        &self,
        req: &InferRequest,
        ep: &Endpoint,
        on_text: Option<&mut (dyn FnMut(&str) + Send)>,
    ) -> Result<Inferred, ProviderError> {
        if crate::signals::ending_with().is_some() {
            return Err(ProviderError::Fetch(
                "not sent: the process is ending".into(),
            ));
        }
        if let Some(cassette) = &self.replay {
            return cassette.answer(req, on_text);
        }
        if ep.style == Style::Replay {
            return Err(ProviderError::Config(
                "the replay provider needs a cassette: pass --replay FILE".into(),
            ));
        }
        let result = self
            .infer_live(req, ep, on_text)
            .await
            .map_err(ProviderError::redacted);
        if let (Some(recorder), Ok(inferred)) = (&self.record, &result) {
            recorder.record(req, inferred)?;
        }
        result
    }

    async fn infer_live(
        &self,
        req: &InferRequest,
        ep: &Endpoint,
        on_text: Option<&mut (dyn FnMut(&str) + Send)>,
    ) -> Result<Inferred, ProviderError> {
        let codec = codec(ep.style).expect("live styles have a codec");
        // Files take the form this provider's API documents (or a note); older ones a reference.
        let rendered = crate::files::window::render(req, ep.style, ep.reads);
        let req = &*rendered;
        // Anthropic has no native structured output: the schema becomes a forced tool, whose
        // call is turned back into the answer's text below. The other styles' codecs map
        // `response_schema` themselves.
        let structured = ep.style == Style::Anthropic && req.response_schema.is_some();
        let original = req;
        let forced;
        let req = if structured {
            forced = structured::prepare(req);
            &forced
        } else {
            req
        };
        let text_mode = ep.tools_level == ToolsLevel::Text && !req.tools.is_empty();
        let prepared;
        let req = if text_mode {
            prepared = text_tools::prepare(req);
            &prepared
        } else {
            req
        };
        let names = wire_names::WireNames::for_request(req);
        let renamed;
        let req = if names.is_identity() {
            req
        } else {
            renamed = names.outgoing(req);
            &renamed
        };
        let stream = on_text.is_some();
        let wire = codec.request(req, ep, stream);
        let mut inferred = self.send(codec, wire, ep, on_text).await?;
        inferred.usage = inferred.usage.believable();
        names.incoming(&mut inferred);
        if text_mode {
            text_tools::parse_calls(&mut inferred);
        }
        if structured {
            structured::finish(original, &mut inferred);
        }
        Ok(inferred)
    }

    async fn send(
        &self,
        codec: &dyn Codec,
        wire: WireRequest,
        ep: &Endpoint,
        on_text: Option<&mut (dyn FnMut(&str) + Send)>,
    ) -> Result<Inferred, ProviderError> {
        let _slot = self.slot(ep).await;
        let mut builder = self.http().post(&wire.url).timeout(ep.timeout);
        for (k, v) in &wire.headers {
            builder = builder.header(k, v);
        }
        if !wire
            .headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
        {
            builder = builder.header(reqwest::header::CONTENT_TYPE, "application/json");
        }
        let response = builder
            .body(wire.body)
            .send()
            .await
            .map_err(|e| transport_failure(&e, ep))?;
        let status = response.status().as_u16();
        if !(200..300).contains(&status) {
            let headers = response.headers().clone();
            let body = body::read(response, MAX_ERROR_BODY.min(ep.max_response_bytes))
                .await
                .unwrap_or_default();
            let body = String::from_utf8_lossy(&body);
            return Err(errors::classify(status, &headers, &body)
                .located(&wire.url, &body)
                .naming_the_key(&ep.provider, &wire.url));
        }
        if let Some(coding) = unasked_encoding(&response) {
            return Err(ProviderError::Api {
                status,
                message: format!(
                    "the server sent its answer compressed (Content-Encoding: {coding}), which \
                     colony does not ask for and does not read (a proxy in between?)"
                ),
                body: String::new(),
            }
            .located(&wire.url, ""));
        }
        match on_text {
            Some(on_text) if not_a_stream(&response) => {
                let body = body::read(response, ep.max_response_bytes)
                    .await
                    .map_err(|e| body_failure(e, ep))?;
                // A server that ignores `stream: true` answers whole: its text is one delta.
                let error_in_it = serde_json::from_slice::<Value>(&body)
                    .is_ok_and(|v| v.get("error").is_some_and(|e| !e.is_null()));
                if !error_in_it && let Ok(whole) = codec.parse(&body) {
                    let text = whole.text();
                    if !text.is_empty() {
                        on_text(&text);
                    }
                    return Ok(whole);
                }
                let text = String::from_utf8_lossy(&body);
                Err(unstreamed_answer(&text).located(&wire.url, &text))
            }
            Some(on_text) => sse::assemble(response, codec.assembler(), on_text, ep).await,
            None => {
                let framed = response.content_length().is_some()
                    || response
                        .headers()
                        .get(reqwest::header::TRANSFER_ENCODING)
                        .and_then(|v| v.to_str().ok())
                        .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
                let body = body::read(response, ep.max_response_bytes)
                    .await
                    .map_err(|e| body_failure(e, ep))?;
                codec
                    .parse(&body)
                    .map_err(|e| whole_body_fault(e, &body, framed, &wire.url))
            }
        }
    }

    /// The model ids the account behind `ep` can reach, over the network.
    pub async fn models(&self, ep: &Endpoint) -> Result<Vec<String>, ProviderError> {
        self.list_models(ep).await.map_err(ProviderError::redacted)
    }

    async fn list_models(&self, ep: &Endpoint) -> Result<Vec<String>, ProviderError> {
        let Some(codec) = codec(ep.style) else {
            return Ok(self.replay.as_ref().map(|c| c.models()).unwrap_or_default());
        };
        let wire = codec.models_request(ep);
        let _slot = self.slot(ep).await;
        let limit = model_list_timeout(ep.timeout);
        let timed_out = || {
            ProviderError::Fetch(format!(
                "no model list within {} s (a list answers in seconds; the use-type's timeout is for answers from a model)",
                limit.as_secs_f64()
            ))
        };
        let mut builder = self
            .listing
            .get_or_init(listing_client)
            .get(&wire.url)
            .timeout(limit);
        for (k, v) in &wire.headers {
            builder = builder.header(k, v);
        }
        let response = builder.send().await.map_err(|e| {
            if e.is_timeout() {
                timed_out()
            } else {
                transport_failure(&e, ep)
            }
        })?;
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = body::read(response, ep.max_response_bytes)
            .await
            .map_err(|e| match e {
                body::BodyError::Transport(t) if t.is_timeout() => timed_out(),
                e => body_failure(e, ep),
            })?;
        let body = String::from_utf8_lossy(&body);
        if !(200..300).contains(&status) {
            return Err(errors::classify(status, &headers, &body).located(&wire.url, &body));
        }
        let value: Value = serde_json::from_str(&body)
            .map_err(|e| ProviderError::Parse(format!("model list: {e}")))?;
        let mut models = codec.parse_models(&value).map_err(|lacks| {
            let shown: String = body.chars().take(200).collect();
            ProviderError::Parse(format!(
                "model list: {lacks} (is the base URL the provider's?): {}",
                crate::secrets::redact(shown.trim())
            ))
        })?;
        models.sort();
        Ok(models)
    }
}
