//! The HTTP side: one fallback handler that records the request, routes it by path (by hand,
//! since Gemini's `models/{model}:generateContent` puts a colon inside a segment), checks the
//! key, takes the next reply and renders it in the path's style, applying the reply's faults.

use std::collections::VecDeque;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State as AxState;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::Response;
use futures::StreamExt;
use serde_json::{Value, json};

use super::Recorded;
use super::anthropic::Anthropic;
use super::gemini::Gemini;
use super::openai::OpenAi;
use super::reply::{Kind, Reply};
use super::wire::{Ctx, Frame, Wire};

pub(crate) type Responder = Arc<dyn Fn(&Value, &str) -> Reply + Send + Sync>;

/// Everything the test thread and the server share.
pub(crate) struct State {
    pub queue: VecDeque<Reply>,
    pub default: Option<Reply>,
    pub responder: Option<Responder>,
    pub requests: Vec<Recorded>,
    pub calls: usize,
    pub require_key: bool,
    /// A key (or part of one) answered 401 wherever it appears in a request's headers.
    pub refused_key: Option<String>,
    pub seq: u64,
}

impl Default for State {
    fn default() -> State {
        State {
            queue: VecDeque::new(),
            default: None,
            responder: None,
            requests: Vec::new(),
            calls: 0,
            require_key: true,
            refused_key: None,
            seq: 0,
        }
    }
}

pub(crate) type Shared = Arc<Mutex<State>>;

pub(crate) fn router(state: Shared) -> Router {
    Router::new().fallback(handle).with_state(state)
}

pub(crate) fn wire_for(style: &str) -> Option<&'static dyn Wire> {
    match style {
        "anthropic" => Some(&Anthropic),
        "openai" => Some(&OpenAi),
        "gemini" => Some(&Gemini),
        _ => None,
    }
}

enum Route {
    Models,
    Call {
        model: String,
        stream: bool,
        /// Gemini without `alt=sse` streams one JSON array instead of SSE.
        sse: bool,
    },
}

fn route(w: &dyn Wire, method: &Method, path: &str, query: &str, body: &Value) -> Option<Route> {
    let rest = path.strip_prefix('/')?.strip_prefix(w.name())?;
    let model = || body["model"].as_str().unwrap_or("fake-model").to_string();
    let stream = body["stream"] == Value::Bool(true);
    match (method.as_str(), w.name(), rest) {
        ("GET", "anthropic" | "openai", "/v1/models") | ("GET", "gemini", "/v1beta/models") => {
            Some(Route::Models)
        }
        ("POST", "anthropic", "/v1/messages") | ("POST", "openai", "/v1/chat/completions") => {
            Some(Route::Call {
                model: model(),
                stream,
                sse: true,
            })
        }
        ("POST", "gemini", rest) => {
            let rest = rest.strip_prefix("/v1beta/models/")?.replace("%3A", ":");
            let (model, action) = rest.rsplit_once(':')?;
            let stream = match action {
                "generateContent" => false,
                "streamGenerateContent" => true,
                _ => return None,
            };
            let sse = query.split('&').any(|p| p == "alt=sse");
            Some(Route::Call {
                model: model.to_string(),
                stream,
                sse,
            })
        }
        _ => None,
    }
}

async fn handle(
    AxState(shared): AxState<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path();
    let query = uri.query().unwrap_or("");
    if path == "/stats" {
        let calls = shared.lock().unwrap().calls;
        return respond(
            200,
            "application/json",
            vec![],
            &[],
            json!({"calls": calls}).to_string(),
        );
    }
    let json_body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let style = path.trim_start_matches('/').split('/').next().unwrap_or("");
    let w = wire_for(style);
    let wire = w.map(|w| (w, route(w, &method, path, query, &json_body)));
    let is_call = matches!(wire, Some((_, Some(Route::Call { .. }))));
    let (seq, require_key, refused_key) = {
        let mut st = shared.lock().unwrap();
        st.seq += 1;
        st.calls += usize::from(is_call);
        st.requests.push(Recorded {
            method: method.to_string(),
            path: uri
                .path_and_query()
                .map_or(path, |p| p.as_str())
                .to_string(),
            style: w.map_or("", |w| w.name()).to_string(),
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), String::from_utf8_lossy(v.as_bytes()).into()))
                .collect(),
            body: json_body.clone(),
        });
        (st.seq, st.require_key, st.refused_key.clone())
    };
    let Some((w, route)) = wire else {
        let msg =
            "fake provider: unknown path; use base_url(\"anthropic\" | \"openai\" | \"gemini\")";
        return respond(404, "text/plain", vec![], &[], msg);
    };
    let Some(route) = route else {
        let msg = format!("fake provider: no route for {method} {path}");
        return respond(
            404,
            "application/json",
            w.headers(seq),
            &[],
            w.error(404, None, &msg, None).to_string(),
        );
    };
    if require_key && !w.has_key(&headers, query) {
        let msg = format!("fake provider: missing API key ({})", w.key_header());
        return respond(
            401,
            "application/json",
            w.headers(seq),
            &[],
            w.error(401, None, &msg, None).to_string(),
        );
    }
    if let Some(bad) = refused_key
        && headers
            .iter()
            .any(|(_, v)| String::from_utf8_lossy(v.as_bytes()).contains(bad.as_str()))
    {
        let msg = "fake provider: invalid API key";
        return respond(
            401,
            "application/json",
            w.headers(seq),
            &[],
            w.error(401, None, msg, None).to_string(),
        );
    }
    let Route::Call { model, stream, sse } = route else {
        return respond(
            200,
            "application/json",
            w.headers(seq),
            &[],
            w.models().to_string(),
        );
    };
    let Some(reply) = next_reply(&shared, &json_body, w.name()) else {
        let msg = "fake provider: no scripted reply left";
        eprintln!("{msg} (request {method} {path})");
        return respond(
            500,
            "application/json",
            w.headers(seq),
            &[],
            w.error(500, None, msg, None).to_string(),
        );
    };
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    let cx = Ctx {
        req: &json_body,
        model,
        seq,
    };
    render(w, &reply, &cx, stream, sse)
}

/// The queue first, then the responder, then the default.
fn next_reply(shared: &Shared, body: &Value, style: &str) -> Option<Reply> {
    let (responder, default) = {
        let mut st = shared.lock().unwrap();
        if let Some(r) = st.queue.pop_front() {
            return Some(r);
        }
        (st.responder.clone(), st.default.clone())
    };
    match responder {
        Some(f) => Some(f(body, style)),
        None => default,
    }
}

fn render(w: &dyn Wire, r: &Reply, cx: &Ctx, stream: bool, sse: bool) -> Response {
    let base = w.headers(cx.seq);
    let json_type = "application/json";
    match &r.kind {
        Kind::Status => {
            let retry = r.headers.iter().find(|(k, _)| k == "retry-after");
            let body = r.body.clone().unwrap_or_else(|| {
                let msg = format!("fake provider: scripted status {}", r.status);
                w.error(r.status, None, &msg, retry.map(|(_, v)| v.as_str()))
                    .to_string()
            });
            respond(r.status, json_type, base, &r.headers, body)
        }
        Kind::StreamError { kind, message } if !stream => {
            let status = w.error_status(kind);
            let body = w.error(status, Some(kind), message, None).to_string();
            respond(status, json_type, base, &r.headers, body)
        }
        _ if !stream => {
            let text = w.message(r, cx).to_string();
            let half = text[..floor_boundary(&text, text.len() / 2)].to_string();
            match r.kind {
                Kind::Malformed => respond(200, json_type, base, &r.headers, half),
                Kind::DropMidStream => {
                    let mut resp = respond(
                        200,
                        json_type,
                        base,
                        &r.headers,
                        chunked(vec![half], r, true),
                    );
                    // The body is a stream, so hyper trusts this header and closes the
                    // connection when the body ends short of it.
                    resp.headers_mut()
                        .insert(header::CONTENT_LENGTH, HeaderValue::from(text.len()));
                    resp
                }
                _ => respond(200, json_type, base, &r.headers, text),
            }
        }
        _ => {
            let s = w.stream(r, cx);
            let mut frames = s.head;
            let drop = r.kind == Kind::DropMidStream;
            match &r.kind {
                Kind::Malformed => {
                    frames.push(w.malformed());
                    frames.extend(s.tail);
                }
                Kind::StreamError { kind, message } => frames.push(w.stream_error(kind, message)),
                Kind::DropMidStream => {
                    frames.extend(s.tail);
                    frames.truncate((frames.len() / 2).max(1));
                }
                _ => frames.extend(s.tail),
            }
            let chunks = if sse {
                frames.into_iter().map(|f| sse_text(w, f)).collect()
            } else {
                json_array(frames, !drop)
            };
            let ct = if sse { "text/event-stream" } else { json_type };
            respond(200, ct, base, &r.headers, chunked(chunks, r, drop))
        }
    }
}

fn floor_boundary(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn sse_text(w: &dyn Wire, f: Frame) -> String {
    match f {
        Frame::Event(name, v) => format!("event: {name}\ndata: {v}{}", w.sep()),
        Frame::Data(v) => format!("data: {v}{}", w.sep()),
        Frame::Raw(s) => s,
    }
}

/// Gemini's stream without `alt=sse`: one JSON array, sent element by element.
fn json_array(frames: Vec<Frame>, close: bool) -> Vec<String> {
    let mut out: Vec<String> = frames
        .into_iter()
        .enumerate()
        .map(|(i, f)| {
            let item = match f {
                Frame::Event(_, v) | Frame::Data(v) => v.to_string(),
                Frame::Raw(s) => s.trim_start_matches("data: ").trim_end().to_string(),
            };
            format!("{}{item}", if i == 0 { "[" } else { ",\r\n" })
        })
        .collect();
    if close {
        out.push("]".into());
    }
    out
}

/// A body sent chunk by chunk, `stream_delay` apart; with `abort`, the connection is then cut.
fn chunked(chunks: Vec<String>, r: &Reply, abort: bool) -> Body {
    let gap = r.stream_delay;
    let items =
        futures::stream::iter(chunks.into_iter().enumerate()).then(move |(i, c)| async move {
            if i > 0 && !gap.is_zero() {
                tokio::time::sleep(gap).await;
            }
            Ok::<Bytes, io::Error>(Bytes::from(c))
        });
    let end = futures::stream::iter(abort.then_some(())).then(|()| async {
        // Give hyper time to flush what was sent before the cut.
        tokio::time::sleep(Duration::from_millis(30)).await;
        Err(io::Error::new(
            io::ErrorKind::ConnectionAborted,
            "fake provider: dropped mid-stream",
        ))
    });
    Body::from_stream(items.chain(end))
}

fn respond(
    status: u16,
    content_type: &str,
    base: Vec<(&'static str, String)>,
    extra: &[(String, String)],
    body: impl Into<Body>,
) -> Response {
    let mut resp = Response::new(body.into());
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_str(content_type).unwrap(),
    );
    let base = base.into_iter().map(|(k, v)| (k.to_string(), v));
    for (k, v) in base.chain(extra.iter().cloned()) {
        if let (Ok(k), Ok(v)) = (
            HeaderName::from_bytes(k.as_bytes()),
            HeaderValue::from_str(&v),
        ) {
            h.insert(k, v);
        }
    }
    resp
}
