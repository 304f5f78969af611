//! The `http` module: `http.get`, `http.post`, `http.request`.
//!
//! Requests go through the program's own HTTP client (`Providers::http`), so they share a
//! connection pool with the script's model calls. Every call is an async function: it suspends
//! only the calling coroutine. A response of any status is a response (`resp.status` says which);
//! only a failure to get one (a refused connection, a timeout, a bad URL) is `nil, err` with
//! `err.kind = "fetch_error"`, its message naming the method and the URL, redacted of keys.

use std::time::Duration;

use mlua::{Lua, MultiValue, Table, Value};

use super::convert::{decode_json, error_table, misuse, to_json};
use crate::secrets::redact;

pub fn register(lua: &Lua) -> mlua::Result<Table> {
    let http = lua.create_table()?;
    http.set(
        "get",
        lua.create_async_function(|lua, (url, opts): (Value, Option<Table>)| async move {
            let req = read_request(&lua, "http.get", Some("GET"), Some(url), opts)?;
            fetch(&lua, req).await
        })?,
    )?;
    http.set(
        "post",
        lua.create_async_function(|lua, (url, opts): (Value, Option<Table>)| async move {
            let req = read_request(&lua, "http.post", Some("POST"), Some(url), opts)?;
            fetch(&lua, req).await
        })?,
    )?;
    http.set(
        "request",
        lua.create_async_function(|lua, spec: Table| async move {
            let req = read_request(&lua, "http.request", None, None, Some(spec))?;
            fetch(&lua, req).await
        })?,
    )?;
    Ok(http)
}

/// A request as the script described it.
struct Request {
    method: reqwest::Method,
    url: String,
    headers: Vec<(String, String)>,
    body: Option<Body>,
    timeout: Option<Duration>,
}

enum Body {
    Bytes(Vec<u8>),
    Json(serde_json::Value),
}

/// Options of `http.get` and `http.post`; `http.request` also takes `method` and `url`.
const OPTIONS: &[&str] = &["headers", "body", "json", "timeout"];
const REQUEST_FIELDS: &[&str] = &["method", "url", "headers", "body", "json", "timeout"];

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
    let url = match url.map_or_else(|| get("url"), Ok)? {
        Value::String(s) => s.to_string_lossy(),
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
                    Value::String(s) => s.to_string_lossy(),
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
        Value::Nil => None,
        Value::Integer(n) if n > 0 => Some(Duration::from_secs(n as u64)),
        Value::Number(n) if n > 0.0 && n.is_finite() => Some(Duration::from_secs_f64(n)),
        other => {
            return Err(bad(format!(
                "timeout must be a positive number of seconds, not {}",
                match other {
                    Value::Integer(n) => n.to_string(),
                    Value::Number(n) => n.to_string(),
                    v => v.type_name().to_string(),
                }
            )));
        }
    };
    Ok(Request {
        method,
        url,
        headers,
        body,
        timeout,
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
    let client = super::ai::core(lua).providers().http().clone();
    let mut builder = client.request(req.method.clone(), url);
    for (name, value) in &req.headers {
        builder = builder.header(name.as_str(), value.as_str());
    }
    builder = match &req.body {
        None => builder,
        Some(Body::Bytes(b)) => builder.body(b.clone()),
        Some(Body::Json(v)) => builder.json(v),
    };
    if let Some(t) = req.timeout {
        builder = builder.timeout(t);
    }
    let response = match builder.send().await {
        Ok(r) => r,
        Err(e) => return failed(describe(&e, req.timeout)),
    };
    let status = response.status().as_u16();
    let headers = lua.create_table()?;
    for name in response.headers().keys() {
        let joined = response
            .headers()
            .get_all(name)
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .collect::<Vec<_>>()
            .join(", ");
        // `HeaderName`s are lowercase already.
        headers.set(name.as_str(), joined)?;
    }
    let body = match response.bytes().await {
        Ok(b) => b,
        Err(e) => return failed(describe(&e, req.timeout)),
    };
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

/// A reqwest error without its URL (the caller names it) and with its causes.
fn describe(e: &reqwest::Error, timeout: Option<Duration>) -> String {
    if e.is_timeout() {
        return match timeout {
            Some(t) => format!("timed out after {} s", t.as_secs_f64()),
            None => "timed out".into(),
        };
    }
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
