//! The `http` module: `http.get`, `http.post`, `http.request`.
//!
//! Requests go through the VM's own HTTP client (one pool for the script's requests; model calls
//! have theirs, whose redirect rules differ). Every call is an async function: it suspends
//! only the calling coroutine. A response of any status is a response (`resp.status` says which);
//! only a failure to get one (a refused connection, a timeout, a bad URL) is `nil, err` with
//! `err.kind = "fetch_error"`, its message naming the method and the URL, redacted of keys.
//!
//! Limits: a request gives up after `timeout` seconds ([`DEFAULT_TIMEOUT`]), redirects included,
//! and reads at most `max_bytes` of the body ([`DEFAULT_MAX_BYTES`]); past either it is a
//! `fetch_error` naming the limit.
//!
//! Redirects (at most [`MAX_REDIRECTS`]) are followed here rather than by reqwest, because a
//! redirect that leaves the origin must not carry what the script sent: every header the script
//! set (an `Authorization`, an `X-Api-Key`) is dropped from then on, and no `Referer` is ever
//! sent (it would carry the original URL, `?key=` and all).

use std::time::Duration;

use mlua::{Lua, MultiValue, Table, Value};

use super::convert::{decode_json, error_table, misuse, to_json};
use crate::secrets::redact;

pub fn register(lua: &Lua) -> mlua::Result<Table> {
    let http = lua.create_table()?;
    http.set(
        "get",
        lua.create_async_function(|lua, (url, opts): (Value, Value)| async move {
            let opts: Option<Table> = super::convert::arg(&lua, "http.get", 2, opts)?;
            let req = read_request(&lua, "http.get", Some("GET"), Some(url), opts)?;
            fetch(&lua, req).await
        })?,
    )?;
    http.set(
        "post",
        lua.create_async_function(|lua, (url, opts): (Value, Value)| async move {
            let opts: Option<Table> = super::convert::arg(&lua, "http.post", 2, opts)?;
            let req = read_request(&lua, "http.post", Some("POST"), Some(url), opts)?;
            fetch(&lua, req).await
        })?,
    )?;
    http.set(
        "request",
        lua.create_async_function(|lua, spec: Value| async move {
            let spec: Table = super::convert::arg(&lua, "http.request", 1, spec)?;
            let req = read_request(&lua, "http.request", None, None, Some(spec))?;
            fetch(&lua, req).await
        })?,
    )?;
    Ok(http)
}

/// A request as the script described it.
struct Request {
    /// The function called (`http.get`), for messages.
    who: String,
    method: reqwest::Method,
    url: String,
    headers: Vec<(String, String)>,
    body: Option<Body>,
    timeout: Duration,
    max_bytes: u64,
}

/// How long a request may take when the script does not say.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// The most of a body read when the script does not say: 32 MiB.
pub const DEFAULT_MAX_BYTES: u64 = 32 << 20;
/// Redirects followed before the request fails.
const MAX_REDIRECTS: usize = 10;

#[derive(Clone)]
enum Body {
    Bytes(Vec<u8>),
    Json(serde_json::Value),
}

/// Options of `http.get` and `http.post`; `http.request` also takes `method` and `url`.
const OPTIONS: &[&str] = &["headers", "body", "json", "timeout", "max_bytes"];

/// Headers that frame the request or govern the connection (RFC 9112 §6, RFC 9110 §7.6.1): the
/// HTTP client computes them. `content-length = "3"` with a longer body sent the remainder as a
/// request of its own, and the next call on that connection read its answer.
const FRAMING: &[&str] = &[
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "upgrade",
    "proxy-connection",
];
const REQUEST_FIELDS: &[&str] = &[
    "method",
    "url",
    "headers",
    "body",
    "json",
    "timeout",
    "max_bytes",
];

fn read_request(
    lua: &Lua,
    who: &str,
    method: Option<&str>,
    url: Option<Value>,
    opts: Option<Table>,
) -> mlua::Result<Request> {
    let bad = |what: String| misuse(format!("{who}: {what}"));
    let fields = if url.is_some() {
        OPTIONS
    } else {
        REQUEST_FIELDS
    };
    if let Some(o) = &opts {
        for pair in o.pairs::<Value, Value>() {
            let (k, _) = pair?;
            let known =
                matches!(&k, Value::String(s) if fields.contains(&s.to_string_lossy().as_str()));
            if !known {
                return Err(bad(format!(
                    "unknown option {} (options: {})",
                    describe_key(&k),
                    fields.join(", ")
                )));
            }
        }
    }
    let get = |name: &str| -> mlua::Result<Value> {
        match &opts {
            Some(o) => o.get(name),
            None => Ok(Value::Nil),
        }
    };
    // Bytes that are not UTF-8 are refused, not changed: lossily read, `caf\xe9` went out as
    // `caf%EF%BF%BD`, another request than the one written.
    let text = |s: &mlua::LuaString, what: &str| -> mlua::Result<String> {
        s.to_str()
            .map(|t| t.to_string())
            .map_err(|_| bad(format!("{what} is not UTF-8 text")))
    };
    let url = match url.map_or_else(|| get("url"), Ok)? {
        Value::String(s) => text(&s, "the url")?,
        other => {
            return Err(bad(format!(
                "url must be a string, not {}",
                other.type_name()
            )));
        }
    };
    let method = match (method, get("method")?) {
        (Some(m), _) => m.to_string(),
        (None, Value::Nil) => "GET".to_string(),
        (None, Value::String(s)) => s.to_string_lossy().to_ascii_uppercase(),
        (None, other) => {
            return Err(bad(format!(
                "method must be a string, not {}",
                other.type_name()
            )));
        }
    };
    let method = reqwest::Method::from_bytes(method.as_bytes())
        .map_err(|_| bad(format!("{method:?} is not an HTTP method")))?;
    let mut headers = Vec::new();
    match get("headers")? {
        Value::Nil => {}
        Value::Table(t) => {
            for pair in t.pairs::<Value, Value>() {
                let (k, v) = pair?;
                let name = match &k {
                    Value::String(s) => s.to_string_lossy(),
                    other => {
                        return Err(bad(format!("header {} is not a name", describe_key(other))));
                    }
                };
                let value = match v {
                    Value::String(s) => text(&s, &format!("header {name:?}'s value"))?,
                    Value::Integer(n) => n.to_string(),
                    Value::Number(n) => n.to_string(),
                    other => {
                        return Err(bad(format!(
                            "header {name:?} must be a string, not {}",
                            other.type_name()
                        )));
                    }
                };
                if reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_err() {
                    return Err(bad(format!("{name:?} is not a header name")));
                }
                if FRAMING.contains(&name.to_ascii_lowercase().as_str()) {
                    return Err(bad(format!(
                        "header {name:?} is colony's to set: it says where the request ends \
                         and how the connection is kept, and a wrong one sends the rest of the \
                         body as another request on the pooled connection"
                    )));
                }
                if reqwest::header::HeaderValue::from_str(&value).is_err() {
                    return Err(bad(format!(
                        "header {name:?} has a value HTTP cannot carry"
                    )));
                }
                headers.push((name, value));
            }
        }
        other => {
            return Err(bad(format!(
                "headers must be a table, not {}",
                other.type_name()
            )));
        }
    }
    let body = match (get("body")?, get("json")?) {
        (Value::Nil, Value::Nil) => None,
        (Value::String(s), Value::Nil) => Some(Body::Bytes(s.as_bytes().to_vec())),
        (other, Value::Nil) => {
            return Err(bad(format!(
                "body must be a string, not {}",
                other.type_name()
            )));
        }
        (Value::Nil, value) => Some(Body::Json(
            to_json(lua, value).map_err(|e| bad(format!("json: {}", super::plain(&e))))?,
        )),
        _ => return Err(bad("give body or json, not both".into())),
    };
    let timeout = match get("timeout")? {
        Value::Nil => DEFAULT_TIMEOUT,
        // 0 is an immediate timeout, as for every other duration (README: "0 or more").
        Value::Integer(n) if n >= 0 => super::convert::seconds_option(who, "timeout", n as f64)?,
        Value::Number(n) if n >= 0.0 => super::convert::seconds_option(who, "timeout", n)?,
        other => {
            return Err(bad(format!(
                "timeout must be 0 or more seconds, not {}",
                match other {
                    Value::Integer(n) => n.to_string(),
                    Value::Number(n) => n.to_string(),
                    v => v.type_name().to_string(),
                }
            )));
        }
    };
    let max_bytes = match get("max_bytes")? {
        Value::Nil => super::convert::default_within_memory(lua, DEFAULT_MAX_BYTES),
        Value::Integer(n) if n > 0 => n as u64,
        Value::Number(n) if n >= 1.0 && n.fract() == 0.0 && n < u64::MAX as f64 => n as u64,
        other => {
            return Err(bad(format!(
                "max_bytes must be a whole number of bytes above 0, not {}",
                match other {
                    Value::Integer(n) => n.to_string(),
                    Value::Number(n) => n.to_string(),
                    v => v.type_name().to_string(),
                }
            )));
        }
    };
    if !matches!(get("max_bytes")?, Value::Nil) {
        super::convert::within_memory(lua, who, max_bytes)?;
    }
    Ok(Request {
        who: who.to_string(),
        method,
        url,
        headers,
        body,
        timeout,
        max_bytes,
    })
}

fn describe_key(k: &Value) -> String {
    match k {
        Value::String(s) => format!("{:?}", s.to_string_lossy()),
        Value::Integer(n) => format!("[{n}]"),
        other => format!("of type {}", other.type_name()),
    }
}

/// Sends `req`: a response table, or `nil, err` when no response came.
async fn fetch(lua: &Lua, req: Request) -> mlua::Result<MultiValue> {
    let failed = |detail: String| -> mlua::Result<MultiValue> {
        let url = redact(&req.url);
        let err = error_table(
            lua,
            "fetch_error",
            &redact(&format!("{} {url}: {detail}", req.method)),
        )?;
        err.set("url", url)?;
        Ok(MultiValue::from_iter([Value::Nil, Value::Table(err)]))
    };
    let url = match reqwest::Url::parse(&req.url) {
        Ok(u) if matches!(u.scheme(), "http" | "https") => u,
        Ok(u) => return failed(format!("unsupported scheme {:?}", u.scheme())),
        Err(e) => return failed(format!("bad URL: {e}")),
    };
    super::sandbox::check_net(lua, &req.who, &url)?;
    let client = client(lua);
    let permissions = super::sandbox::permissions(lua);
    let answer = tokio::time::timeout(req.timeout, send(&client, &req, url, &permissions)).await;
    let (response, body) = match answer {
        Err(_elapsed) => {
            return failed(format!("timed out after {} s", req.timeout.as_secs_f64()));
        }
        Ok(Err(detail)) => return failed(detail),
        Ok(Ok(answer)) => answer,
    };
    let status = response.status;
    let headers = lua.create_table()?;
    for name in response.headers.keys() {
        let joined = response
            .headers
            .get_all(name)
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .collect::<Vec<_>>()
            .join(", ");
        // `HeaderName`s are lowercase already.
        headers.set(name.as_str(), joined)?;
    }
    let body = lua.create_string(&body)?;
    let resp = lua.create_table()?;
    resp.set("status", status)?;
    resp.set("ok", (200..300).contains(&status))?;
    resp.set("headers", headers)?;
    resp.set("body", body.clone())?;
    // `resp.json()` and `resp:json()` both work: the body is captured, arguments are ignored.
    resp.set(
        "json",
        lua.create_function(move |lua, _: MultiValue| {
            decode_json(lua, &body.as_bytes(), "resp.json: the body is not JSON")
        })?,
    )?;
    Ok(MultiValue::from_iter([Value::Table(resp)]))
}

/// The status and headers of the final answer (after redirects).
struct Head {
    status: u16,
    headers: reqwest::header::HeaderMap,
}

/// The script's HTTP client: no automatic redirects (see the module's doc), no `Referer`. One
/// per Lua VM, so its connections are driven by the VM's own runtime.
fn client(lua: &Lua) -> reqwest::Client {
    struct ScriptClient(reqwest::Client);
    if let Some(c) = lua.app_data_ref::<ScriptClient>() {
        return c.0.clone();
    }
    let client = crate::tls::client_builder()
        .pool_idle_timeout(Duration::from_secs(90))
        .redirect(reqwest::redirect::Policy::none())
        .referer(false)
        // Some APIs (GitHub's) refuse a request without one; a script's own header wins.
        .user_agent(concat!("colony/", env!("CARGO_PKG_VERSION")))
        .build()
        .expect("the HTTP client builds");
    lua.set_app_data(ScriptClient(client.clone()));
    client
}

/// Sends `req` to `url`, following redirects (only to hosts `permissions` allow), and reads the
/// final body up to `max_bytes`.
async fn send(
    client: &reqwest::Client,
    req: &Request,
    mut url: reqwest::Url,
    permissions: &crate::permissions::Permissions,
) -> Result<(Head, bytes::Bytes), String> {
    let origin = url.origin();
    let mut method = req.method.clone();
    let mut body = req.body.clone();
    let mut own_headers = true;
    let mut hops = 0;
    let response = loop {
        let mut builder = client.request(method.clone(), url.clone());
        if own_headers {
            for (name, value) in &req.headers {
                builder = builder.header(name.as_str(), value.as_str());
            }
        }
        builder = match &body {
            None => builder,
            Some(Body::Bytes(b)) => builder.body(b.clone()),
            Some(Body::Json(v)) => builder.json(v),
        };
        let response = builder.send().await.map_err(|e| describe(&e))?;
        let status = response.status();
        let location = response
            .headers()
            .get(reqwest::header::LOCATION)
            .and_then(|v| v.to_str().ok());
        let (true, Some(location)) = (status.is_redirection(), location) else {
            break response;
        };
        if status == reqwest::StatusCode::NOT_MODIFIED {
            break response;
        }
        hops += 1;
        if hops > MAX_REDIRECTS {
            return Err(format!("more than {MAX_REDIRECTS} redirects"));
        }
        let next = url
            .join(location)
            .map_err(|e| format!("redirected to a bad URL {location:?}: {e}"))?;
        if !matches!(next.scheme(), "http" | "https") {
            return Err(format!(
                "redirected to unsupported scheme {:?}",
                next.scheme()
            ));
        }
        if let Err(denied) = permissions.check_net(&req.who, &next) {
            return Err(format!("redirected to {}: {denied}", redact(next.as_str())));
        }
        // 303, and 301/302 after a POST (as browsers do), turn into a GET without a body;
        // 307 and 308 repeat the request as it was.
        let to_get = status == reqwest::StatusCode::SEE_OTHER
            || (matches!(status.as_u16(), 301 | 302) && method == reqwest::Method::POST);
        if to_get {
            method = reqwest::Method::GET;
            body = None;
        }
        if next.origin() != origin {
            own_headers = false;
        }
        url = next;
    };
    let head = Head {
        status: response.status().as_u16(),
        headers: response.headers().clone(),
    };
    let body = crate::providers::body::read(response, req.max_bytes)
        .await
        .map_err(|e| match e {
            crate::providers::body::BodyError::TooLarge(_) => {
                format!("{e}; pass max_bytes to read more")
            }
            crate::providers::body::BodyError::Transport(e) => describe(&e),
        })?;
    Ok((head, body))
}

/// A reqwest error without its URL (the caller names it) and with its causes.
fn describe(e: &reqwest::Error) -> String {
    let mut text = String::new();
    let mut source: Option<&dyn std::error::Error> = Some(e);
    while let Some(s) = source {
        let part = match s.downcast_ref::<reqwest::Error>() {
            Some(re) => {
                let mut re_text = re.to_string();
                if let Some(u) = re.url() {
                    re_text = re_text.replace(&format!(" for url ({u})"), "");
                }
                re_text
            }
            None => s.to_string(),
        };
        if !part.is_empty() && !text.contains(&part) {
            if !text.is_empty() {
                text.push_str(": ");
            }
            text.push_str(&part);
        }
        source = s.source();
    }
    text
}
