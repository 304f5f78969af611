//! The JSON control API under `/api`: programs, residents, their conversations, mail, and what
//! an operator does to them (unblock, dismiss, restart, stop). Errors answer
//! `{ "error": kind, "message": ... }`.

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde::Deserialize;
use serde_json::{Value, json};

use super::host::Hosted;
use super::refusal::refuse;
use super::service::{IdSeen, Service, Slot};
use crate::infer::breaker::{BreakerState, BreakerStatus};
use crate::residents::resident::State as ResidentState;
use crate::residents::{Mail, MailError, ResidentInfo};
use crate::vocab::{Message, Part};

type Svc = State<Arc<Service>>;

/// The most residents or messages one page answers.
const PAGE_MAX: usize = 1000;

pub async fn programs(State(s): Svc) -> Response {
    let list: Vec<Value> = s.programs().iter().map(|p| p.view()).collect();
    Json(json!({ "programs": list })).into_response()
}

pub async fn program(State(s): Svc, Path(p): Path<String>) -> Response {
    match s.program(&p) {
        Some(slot) => Json(slot.view()).into_response(),
        None => no_program(&p),
    }
}

#[derive(Deserialize)]
pub struct Page {
    #[serde(default)]
    offset: usize,
    limit: Option<usize>,
    /// Only residents in this state.
    state: Option<String>,
}

pub async fn residents(
    State(s): Svc,
    Path(p): Path<String>,
    uri: axum::http::Uri,
    page: Result<Query<Page>, QueryRejection>,
) -> Response {
    let page = match page {
        Ok(Query(page)) => page,
        Err(e) => return bad_query(&uri, &e),
    };
    if let Some(state) = &page.state
        && !ResidentState::ALL.iter().any(|s| s.as_str() == state)
    {
        let known: Vec<&str> = ResidentState::ALL.iter().map(|s| s.as_str()).collect();
        return refuse(
            StatusCode::BAD_REQUEST,
            "bad_request",
            &format!(
                "state = {state:?} is not a resident's state ({})",
                known.join(", ")
            ),
        );
    }
    let (slot, hosted) = match running(&s, &p) {
        Ok(x) => x,
        Err(r) => return *r,
    };
    let all = hosted.residents();
    let chosen: Vec<&ResidentInfo> = all
        .iter()
        .filter(|r| {
            page.state
                .as_deref()
                .is_none_or(|st| r.state.as_str() == st)
        })
        .collect();
    let limit = page.limit.unwrap_or(100).min(PAGE_MAX);
    let list: Vec<Value> = chosen
        .iter()
        .skip(page.offset)
        .take(limit)
        .map(|r| resident_view(&s, &slot, &hosted, r))
        .collect();
    Json(json!({
        "program": slot.name,
        "total": chosen.len(),
        "offset": page.offset,
        "residents": list,
    }))
    .into_response()
}

pub async fn resident(State(s): Svc, Path((p, name)): Path<(String, String)>) -> Response {
    let (slot, hosted) = match running(&s, &p) {
        Ok(x) => x,
        Err(r) => return *r,
    };
    match hosted.resident(&name) {
        Some(info) => Json(resident_view(&s, &slot, &hosted, &info)).into_response(),
        None => no_resident(&name),
    }
}

fn resident_view(s: &Service, slot: &Slot, hosted: &Hosted, r: &ResidentInfo) -> Value {
    let tally = s.tally(&slot.name, &r.name);
    json!({
        "name": r.name,
        "state": r.state,
        "node": r.node,
        "mailbox": r.held,
        "capacity": hosted.capacity(&r.name),
        "held": r.held,
        "dropped": r.dropped,
        "refused": r.refused,
        "served": r.served,
        "restarts": r.restarts,
        "conversation": r.conversation,
        "persist": hosted.persists(&r.name),
        "tokens_in": tally.tokens_in,
        "tokens_out": tally.tokens_out,
        "turns": tally.turns,
        "blocked_by": r.error,
        "last_error": tally.last_error,
        "breaker": hosted.breaker(&r.name).map(|b| breaker_view(&b)),
    })
}

/// A breaker as the API shows it: its status, failures, when it last changed and, open, when
/// the next probe may go (wall-clock ms, and how long from now).
pub fn breaker_view(b: &BreakerState) -> Value {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let next = b.next_probe_ms.filter(|_| b.status == BreakerStatus::Open);
    json!({
        "status": b.status,
        "failures": b.failures,
        "since_ms": b.since_ms,
        "next_probe_ms": next,
        "next_probe_in_ms": next.map(|t| t.saturating_sub(now)),
        "last_error": b.last_error.as_deref().map(crate::secrets::redact),
    })
}

#[derive(Deserialize)]
pub struct After {
    #[serde(default)]
    after: usize,
    limit: Option<usize>,
}

/// `?after=N`: the messages from index N on (at most `limit`), and `next` to ask for after.
pub async fn conversation(
    State(s): Svc,
    Path((p, name)): Path<(String, String)>,
    uri: axum::http::Uri,
    q: Result<Query<After>, QueryRejection>,
) -> Response {
    let q = match q {
        Ok(Query(q)) => q,
        Err(e) => return bad_query(&uri, &e),
    };
    let (_, hosted) = match running(&s, &p) {
        Ok(x) => x,
        Err(r) => return *r,
    };
    let Some(messages) = hosted.conversation(&name) else {
        return not_here(&hosted, &name);
    };
    let limit = q.limit.unwrap_or(100).min(PAGE_MAX);
    let total = messages.len();
    let page: Vec<Value> = messages
        .iter()
        .enumerate()
        .skip(q.after)
        .take(limit)
        .map(|(i, m)| message_view(i, m))
        .collect();
    let next = (q.after + page.len()).min(total);
    Json(json!({ "resident": name, "total": total, "after": q.after, "next": next, "messages": page }))
        .into_response()
}

/// A message with its files as references (name, type, size, hash), never their bytes.
fn message_view(index: usize, m: &Message) -> Value {
    let mut v = serde_json::to_value(m).unwrap_or(Value::Null);
    if let Some(map) = v.as_object_mut() {
        map.insert("index".into(), json!(index));
        let files: Vec<Value> = m
            .parts
            .iter()
            .filter_map(|p| match p {
                Part::File(f) => Some(json!({
                    "name": f.name, "content_type": f.content_type, "size": f.size,
                    "ref": f.handle(),
                })),
                _ => None,
            })
            .collect();
        if !files.is_empty() {
            map.insert("files".into(), Value::Array(files));
        }
    }
    v
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MailIn {
    to: String,
    content: String,
    source: Option<String>,
    id: Option<String>,
    #[serde(default)]
    files: Vec<FileIn>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileIn {
    name: String,
    content_type: Option<String>,
    /// The bytes, base64.
    data: String,
}

/// `202` once the mail is accepted (saved first, for a resident that keeps its conversation);
/// the same `id` is accepted once. `404`: no such resident; `429` with `Retry-After`: its
/// mailbox is full.
/// The sender a mail from the API is labelled with: the `source` it gives (`api` when none),
/// and, for a caller known by its token's name, that name (`ops (api:bob)`, `api:bob`), so
/// one caller cannot pass its mail off as another's. `mcp:` and `api:` are colony's own labels
/// and refused: a mail from `mcp:alice (mcp-1-7)` would also have been taken for the reply to
/// alice's MCP call of that id, which waits for its resident's answer to that sender.
fn mail_source(given: Option<&str>, caller: Option<&str>) -> Result<String, String> {
    if let Some(source) = given {
        let lower = source.trim_start().to_ascii_lowercase();
        if lower.starts_with("mcp:") || lower.starts_with("api:") {
            return Err(format!(
                "source {source:?}: \"mcp:\" and \"api:\" begin colony's own labels of callers; \
                 name the sender another way"
            ));
        }
    }
    let named =
        caller.filter(|c| *c != super::auth::Caller::LOCAL && *c != super::auth::Caller::TOKEN);
    Ok(match (given, named) {
        (Some(source), Some(caller)) => format!("{source} (api:{caller})"),
        (None, Some(caller)) => format!("api:{caller}"),
        (Some(source), None) => source.to_string(),
        (None, None) => "api".to_string(),
    })
}

/// How long mail to a program whose watch is not up yet waits for it.
const OPEN_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);

pub async fn mail(
    State(s): Svc,
    Path(p): Path<String>,
    caller: Option<axum::Extension<super::auth::Caller>>,
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    // The body is read as JSON whatever its Content-Type: `curl -d '{...}'` sends it as a form.
    // (A page of another origin is refused before this, by its `Origin`.)
    let body = match body {
        Ok(b) => b,
        // A body past the limit sent chunked is found too long only while it is read.
        Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return refuse(
                e.status(),
                "too_large",
                &super::refusal::too_large_message(),
            );
        }
        Err(e) => return refuse(e.status(), "bad_request", &e.body_text()),
    };
    let m: MailIn = match serde_json::from_slice(&body) {
        Ok(m) => m,
        Err(e) => {
            return refuse(
                StatusCode::BAD_REQUEST,
                "bad_request",
                &format!("the body is not a mail ({{\"to\", \"content\", ...}}): {e}"),
            );
        }
    };
    if let Some(why) = Mail::id_refusal(m.id.as_deref()) {
        return refuse(StatusCode::BAD_REQUEST, "bad_request", why);
    }
    if let Some(why) = m.source.as_deref().and_then(Mail::source_refusal) {
        return refuse(StatusCode::BAD_REQUEST, "bad_request", &why);
    }
    if s.draining() {
        return draining();
    }
    let (slot, hosted) = match running(&s, &p) {
        Ok(x) => x,
        Err(r) => return *r,
    };
    if hosted.stopping() {
        return stopping(&p);
    }
    // A program just started registers its residents when its watch comes up: mail sent in
    // that moment waits for it (a little) instead of finding nobody.
    if !hosted.knows(&m.to) && !hosted.is_open() {
        let _ = tokio::time::timeout(OPEN_PATIENCE, hosted.opened()).await;
    }
    if !hosted.knows(&m.to) {
        // Still not watching (a program that warms up before its watch): its residents are
        // not registered yet, and a 404 reads as "no such resident", which a client drops.
        if !hosted.is_open() {
            return not_open(&p);
        }
        return no_resident(&m.to);
    }
    let mut files = Vec::new();
    for f in &m.files {
        // The model reads the name (`[file a.csv (...)]`): a blank one names nothing.
        if f.name.trim().is_empty() {
            return refuse(
                StatusCode::BAD_REQUEST,
                "bad_request",
                "a file's name is empty: give the name the model should read it under",
            );
        }
        if let Some(ct) = f.content_type.as_deref().filter(|c| !c.trim().is_empty())
            && !crate::files::is_content_type(ct)
        {
            return refuse(
                StatusCode::BAD_REQUEST,
                "bad_request",
                &format!(
                    "file {:?}: content_type {ct:?} is not a content type (type/subtype, such as \
                     image/png)",
                    f.name
                ),
            );
        }
        match base64::engine::general_purpose::STANDARD.decode(f.data.as_bytes()) {
            Ok(bytes) => files.push(hosted.record_file(&f.name, f.content_type.as_deref(), bytes)),
            Err(e) => {
                return refuse(
                    StatusCode::BAD_REQUEST,
                    "bad_request",
                    &format!("file {:?}: data is not base64: {e}", f.name),
                );
            }
        }
    }
    let source = match mail_source(m.source.as_deref(), caller.as_ref().map(|c| c.0.0.as_str())) {
        Ok(source) => source,
        Err(why) => return refuse(StatusCode::BAD_REQUEST, "bad_request", &why),
    };
    let durable = hosted.persists(&m.to).unwrap_or(false);
    if let Some(id) = &m.id {
        match s.first_time(&slot.name, &m.to, id, durable) {
            IdSeen::New => {}
            IdSeen::Accepted => return accepted(true, durable),
            IdSeen::InFlight => {
                let mut r = refuse(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "in_flight",
                    &format!(
                        "a mail with id {id:?} is being accepted now, and may yet be refused: \
                         send it again in a moment"
                    ),
                );
                r.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                return r;
            }
        }
    }
    let mail = Mail {
        files,
        id: m.id.clone(),
        ..Mail::new(&m.to, &source, &m.content, 0)
    };
    let outcome = hosted.mail_once(mail);
    if let (Ok(_), Some(id)) = (&outcome, &m.id) {
        s.settled(&slot.name, &m.to, id);
    }
    match outcome {
        Ok(crate::residents::Delivered::New) => {
            s.metrics.accepted(&slot.name, &m.to);
            accepted(false, durable)
        }
        // The resident's store held the id from before a restart.
        Ok(crate::residents::Delivered::Repeated) => accepted(true, durable),
        Err(e) => {
            if let Some(id) = &m.id {
                s.forget(&slot.name, &m.to, id);
            }
            match e {
                // A stop that began after the checks above (a restart, a reload, the service's
                // drain) refuses mail as the program's, not the resident's: the sender is told
                // to come back, not that there is no such resident (a client drops that mail).
                MailError::NoRecipient if s.draining() => draining(),
                MailError::NoRecipient if hosted.stopping() => stopping(&p),
                // A resident the program has (placed on another node of a cluster) that the
                // mail could not reach yet: a node just started takes a moment to join its
                // cluster. Its 404 read as "no such resident", and a client dropped the mail.
                MailError::NoRecipient if hosted.knows(&m.to) => not_open(&p),
                MailError::NoRecipient => no_resident(&m.to),
                MailError::MailboxFull => {
                    let mut r = refuse(
                        StatusCode::TOO_MANY_REQUESTS,
                        "mailbox_full",
                        &format!(
                            "{:?}'s mailbox is full: try again once it has served some",
                            m.to
                        ),
                    );
                    r.headers_mut()
                        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                    r
                }
                MailError::NotSaved => {
                    let mut r = refuse(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "not_saved",
                        "the mail could not be saved (in the state directory, the store, or for a resident on another node the cluster's NATS server): not accepted",
                    );
                    // When to ask again, as every other 503 here says.
                    r.headers_mut()
                        .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
                    r
                }
                other => refuse(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    other.as_str(),
                    other.as_str(),
                ),
            }
        }
    }
}

fn accepted(duplicate: bool, durable: bool) -> Response {
    (
        StatusCode::ACCEPTED,
        Json(json!({ "accepted": true, "duplicate": duplicate, "durable": durable })),
    )
        .into_response()
}

pub async fn unblock(State(s): Svc, Path((p, name)): Path<(String, String)>) -> Response {
    let (_, hosted) = match running(&s, &p) {
        Ok(x) => x,
        Err(r) => return *r,
    };
    match hosted.unblock(&name) {
        Some(was) => Json(json!({ "resident": name, "was_blocked": was })).into_response(),
        None => not_here(&hosted, &name),
    }
}

pub async fn dismiss(State(s): Svc, Path((p, name)): Path<(String, String)>) -> Response {
    let (_, hosted) = match running(&s, &p) {
        Ok(x) => x,
        Err(r) => return *r,
    };
    if hosted.dismiss(&name) {
        // Its mail went with it: an id sent again is a new mail.
        s.forget_dropped(&p, Some(&name));
        Json(json!({ "resident": name, "dismissed": true })).into_response()
    } else {
        not_here(&hosted, &name)
    }
}

pub async fn restart(State(s): Svc, Path(p): Path<String>) -> Response {
    let Some(slot) = s.program(&p) else {
        return no_program(&p);
    };
    if s.draining() {
        return refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            "draining",
            "the service is stopping",
        );
    }
    let restarted = carried_through(async move {
        let restarted = s.restart_if_loads(&slot).await;
        (slot, restarted)
    })
    .await;
    match restarted {
        Ok((slot, Ok(true))) => Json(slot.view()).into_response(),
        // Stopped, and its start failed: a 200 told `curl -f` and scripts it had worked.
        // One that starts again by itself (its state directory held, its store away) is told
        // as mail to it is: 503 and when.
        Ok((slot, Ok(false))) if slot.starts_again_in().is_some() => not_running(&slot, &p),
        Ok((slot, Ok(false))) => refuse(
            StatusCode::INTERNAL_SERVER_ERROR,
            "start_failed",
            &format!(
                "program {p:?} did not start: {}",
                slot.error().unwrap_or_else(|| "see the log".into())
            ),
        ),
        Ok((_, Err(e))) => refuse(
            StatusCode::UNPROCESSABLE_ENTITY,
            "does_not_load",
            &format!(
                "program {p:?} was not restarted: its file does not load ({e}); its run goes \
                 on as it was"
            ),
        ),
        Err(answer) => answer,
    }
}

pub async fn stop(State(s): Svc, Path(p): Path<String>) -> Response {
    let Some(slot) = s.program(&p) else {
        return no_program(&p);
    };
    match carried_through(async move {
        s.stop(&slot, "stopped through the API").await;
        slot
    })
    .await
    {
        Ok(slot) => Json(slot.view()).into_response(),
        Err(answer) => answer,
    }
}

/// Runs `change` (a stop, a restart) on a task of its own. A client that hangs up while the
/// old run stops (a proxy's timeout, `curl -m`) drops this future, not the change: dropped
/// mid-restart, the old run was stopped and the new one never started.
async fn carried_through<T: Send + 'static>(
    change: impl std::future::Future<Output = T> + Send + 'static,
) -> Result<T, Response> {
    tokio::spawn(change).await.map_err(|e| {
        refuse(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            &format!("the change failed: {e}"),
        )
    })
}

pub async fn events(
    State(s): Svc,
    guard: Option<axum::Extension<super::auth::Guard>>,
    headers: HeaderMap,
) -> Response {
    let after = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let admission = guard.map(|axum::Extension(g)| super::auth::Admission::of(&g, &headers));
    let revoked = async move {
        match admission {
            Some(a) => a.revoked().await,
            None => std::future::pending().await,
        }
    };
    s.events.stream(after, Box::pin(revoked)).into_response()
}

pub async fn healthz() -> Response {
    Json(json!({ "ok": true })).into_response()
}

/// Readiness, for a probe that carries no token: each program's name and state, never its
/// file, error or traceback (an error may hold what a program was connecting to, password and
/// all); those are the token's, under `/api/programs`. Nor its residents: a probe every few
/// seconds need not list ten thousand.
pub async fn readyz(State(s): Svc) -> Response {
    let programs: Vec<Value> = s
        .programs()
        .iter()
        // How many of its sources and residents failed for good (their errors are the
        // token's, under `/api/programs`): a program running on without its watcher.
        .map(|p| json!({ "name": p.name, "state": p.phase(), "failed": p.failures() }))
        .collect();
    let status = if s.ready() && !s.draining() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        Json(json!({ "ready": status == StatusCode::OK, "programs": programs })),
    )
        .into_response()
}

pub async fn metrics(State(s): Svc) -> Response {
    let text = tokio::task::spawn_blocking(move || s.scrape())
        .await
        .unwrap_or_default();
    ([(header::CONTENT_TYPE, super::metrics::CONTENT_TYPE)], text).into_response()
}

/// The program `p` and its run, or the answer saying why there is none.
fn running(s: &Service, p: &str) -> Result<(Arc<Slot>, Arc<Hosted>), Box<Response>> {
    let Some(slot) = s.program(p) else {
        return Err(Box::new(no_program(p)));
    };
    match slot.hosted() {
        Some(h) => Ok((slot, h)),
        None => Err(Box::new(not_running(&slot, p))),
    }
}

/// Why program `p`, which has no run, takes no request now, and when to ask again if that is
/// known.
pub(super) fn not_running(slot: &Slot, p: &str) -> Response {
    // Between a restart's stop and its start: as while it stops, a moment (it was a bare 503
    // without Retry-After, among its neighbours' "try again in a moment").
    if slot.restarting() {
        return stopping(p);
    }
    match slot.starts_again_in() {
        // Its start met something that passes (its store or cluster unreachable, its state
        // directory or node name held by another process): it starts by itself once it has.
        // Said as the start said it: "its store or cluster could not be reached" sent people
        // looking at a database while another process held the state directory.
        Some(wait) => {
            let secs = wait.as_secs().max(1);
            let why = slot
                .error()
                .unwrap_or_else(|| "its start failed".to_string());
            let mut r = refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                "not_running",
                &format!(
                    "program {p:?} is not running ({why}); its start is tried again in {secs}s"
                ),
            );
            if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
                r.headers_mut().insert(header::RETRY_AFTER, v);
            }
            r
        }
        None => refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_running",
            &format!("program {p:?} is not running"),
        ),
    }
}

/// A query string that does not read (`?limit=ten`), answered as every refusal is.
/// The query as sent leads: serde's text names the field, not the value (`offset: invalid
/// digit found in string` of `offset=-1`).
fn bad_query(uri: &axum::http::Uri, e: &QueryRejection) -> Response {
    let text = e.body_text();
    let cause = text
        .strip_prefix("Failed to deserialize query string: ")
        .unwrap_or(&text);
    refuse(
        StatusCode::BAD_REQUEST,
        "bad_request",
        &format!(
            "the query {:?} does not read: {cause}",
            uri.query().unwrap_or_default()
        ),
    )
}

fn no_program(p: &str) -> Response {
    refuse(
        StatusCode::NOT_FOUND,
        "no_program",
        &format!("no program named {p:?}"),
    )
}

/// The service is stopping: no new mail.
fn draining() -> Response {
    refuse(
        StatusCode::SERVICE_UNAVAILABLE,
        "draining",
        "the service is stopping: no new mail",
    )
}

/// A program that is stopping (restarting, reloading, stopped through the API) takes no mail
/// for now: `503` and when to try again, not the `404` that reads as "no such resident".
fn stopping(p: &str) -> Response {
    let mut r = refuse(
        StatusCode::SERVICE_UNAVAILABLE,
        "not_running",
        &format!("program {p:?} is stopping (a restart or a reload): try again in a moment"),
    );
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    r
}

/// A program whose watch is not up yet: its residents take mail once it is.
fn not_open(p: &str) -> Response {
    let mut r = refuse(
        StatusCode::SERVICE_UNAVAILABLE,
        "not_open",
        &format!(
            "program {p:?} has not reached its watch yet (ai.watch): its residents take mail once \
             it has; try again in a moment"
        ),
    );
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
    r
}

/// Why `name` has no conversation, unblock or dismiss here: it runs on another node of the
/// cluster (`409 elsewhere`, naming it), is between nodes (`503`, a moment), or there is no
/// such resident (`404`). Each was the unknown name's 404, word for word.
fn not_here(hosted: &Hosted, name: &str) -> Response {
    match hosted.resident(name) {
        Some(info)
            if info.node.is_some()
                && info.state == crate::residents::resident::State::Elsewhere =>
        {
            refuse(
                StatusCode::CONFLICT,
                "elsewhere",
                &format!(
                    "{name:?} runs on node {:?}: ask that node",
                    info.node.unwrap_or_default()
                ),
            )
        }
        Some(info) if info.state == crate::residents::resident::State::Unplaced => {
            let mut r = refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                "unplaced",
                &format!("{name:?} is being handed to another node: ask again in a moment"),
            );
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("2"));
            r
        }
        _ => no_resident(name),
    }
}

fn no_resident(name: &str) -> Response {
    refuse(
        StatusCode::NOT_FOUND,
        "no_recipient",
        &format!("no resident named {name:?}"),
    )
}

#[cfg(test)]
mod tests {
    use super::mail_source;

    #[test]
    fn a_mails_source_names_its_caller_and_colonys_own_labels_are_refused() {
        assert_eq!(mail_source(None, None).unwrap(), "api");
        assert_eq!(mail_source(Some("ops"), Some("local")).unwrap(), "ops");
        assert_eq!(mail_source(None, Some("token")).unwrap(), "api");
        assert_eq!(mail_source(None, Some("bob")).unwrap(), "api:bob");
        assert_eq!(
            mail_source(Some("ops"), Some("bob")).unwrap(),
            "ops (api:bob)"
        );
        for spoof in ["mcp:alice (mcp-1-7)", "MCP:alice", " api:alice"] {
            let err = mail_source(Some(spoof), Some("bob")).unwrap_err();
            assert!(err.contains("colony's own labels"), "{spoof}: {err}");
        }
    }
}
