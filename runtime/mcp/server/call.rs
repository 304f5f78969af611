//! One `tools/call` from outside: an exported tool run through the same dispatch a turn uses
//! (arguments checked against its schema before the handler runs, its deadline, its rate), or
//! an exported resident mailed the message and waited for, with progress while it works. Every
//! call ends in one audit line naming the caller.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};

use super::exports::{Client, Exports, Report, Reporter, ResidentExport};
use crate::residents::{DeliveryKind, Mail, Route};
use crate::store::AuditEntry;
use crate::turn::dispatch::{CallContext, run_call};
use crate::turn::{EventKind, ToolDef, ToolEvent};
use crate::vocab::{FileRef, ToolCall};

/// Who made a call, as the audit log and the rate limits name them (`mcp:stdio`,
/// `mcp:token`, `mcp:loopback`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller(pub String);

impl Caller {
    /// The audit log's `resident` column for calls from outside.
    pub fn label(&self) -> String {
        format!("mcp:{}", self.0)
    }
}

/// How a call ended, for the client.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub text: String,
    pub files: Vec<FileRef>,
    pub is_error: bool,
}

static CALLS: AtomicU64 = AtomicU64::new(0);

/// A call id no other call of this process has.
pub fn call_id() -> String {
    format!(
        "mcp-{}-{}",
        std::process::id(),
        CALLS.fetch_add(1, Ordering::Relaxed)
    )
}

/// Runs `tool` with `args` for `caller`; its handler's reports and questions (`ctx.progress`,
/// `ctx.sample` ...) go to `client`.
pub async fn tool(
    route: &Route,
    exports: &Exports,
    tool: &ToolDef,
    args: Map<String, Value>,
    caller: &Caller,
    client: Option<Client>,
) -> Outcome {
    // A stop waits for this call as for a turn in flight, up to its grace.
    let _in_flight = route.hold();
    let call = ToolCall {
        id: call_id(),
        name: tool.spec.name.clone(),
        arguments: Value::Object(args).to_string(),
        opaque: None,
    };
    let _reporting = client.map(|c| exports.reporting(&call.id, c));
    let script = route.script();
    let tools = std::slice::from_ref(tool);
    let pin = Map::new();
    // The tool's rate limits hold for MCP callers as for the program's own residents.
    let config = route.core().config();
    let cx = CallContext {
        script: &*script,
        tools,
        pin: &pin,
        step: 0,
        provenance: None,
        workspace: None,
        hooks: None,
        files: &[],
        rates: config.rate.as_ref(),
        refused: None,
    };
    let line = AuditOnEnd::new(route, caller, &call);
    let mut answer = run_call(&cx, &call).await;
    // Content blocks a client cannot show are the call's error, in the audit log as for the
    // client (it read an error where the log said `ok`).
    if !answer.result.is_error
        && let Some(problem) = super::content::unshowable_blocks(&answer.result.content)
    {
        answer.event.kind = EventKind::Error;
        answer.event.outcome = problem.chars().take(500).collect();
        answer.result.is_error = true;
        answer.result.content = problem;
    }
    line.finish(&answer.event);
    Outcome {
        text: answer.result.content,
        files: answer.files,
        is_error: answer.result.is_error,
    }
}

/// The schema of an exported resident's tool.
pub fn resident_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "message": { "type": "string", "description": "What to tell it; its reply is the answer." }
        },
        "required": ["message"],
        "additionalProperties": false
    })
}

/// How often a client waiting for a resident hears that it still works.
const HEARTBEAT: Duration = Duration::from_secs(1);

/// Mails `resident` the call's `message` (from `mcp:<caller>`) and answers its reply, or an
/// error once its deadline passes, the mail is refused, or the program stops.
pub async fn resident(
    route: &Route,
    resident: &ResidentExport,
    args: Map<String, Value>,
    caller: &Caller,
    reporter: Option<Reporter>,
) -> Outcome {
    let started = Instant::now();
    let id = call_id();
    let call = ToolCall {
        id: id.clone(),
        name: resident.name.clone(),
        arguments: Value::Object(args.clone()).to_string(),
        opaque: None,
    };
    let line = AuditOnEnd::new(route, caller, &call);
    let (kind, outcome) = ask_resident(route, resident, &args, caller, &id, reporter).await;
    let event = ToolEvent {
        step: 0,
        call_id: id,
        name: resident.name.clone(),
        kind,
        outcome: outcome.text.chars().take(500).collect(),
        duration: started.elapsed(),
    };
    line.finish(&event);
    outcome
}

/// The audit line of one call from outside, written when it ends, or when it is dropped
/// before (the client cancelled it, went away, or colony ended while it ran): every call that
/// started leaves a line, a cancelled one as `cancelled`. Before, only calls that ran to their
/// end did, and one that ran 30 s before its cancel left no trace.
struct AuditOnEnd<'a> {
    route: &'a Route,
    caller: &'a Caller,
    call: &'a ToolCall,
    started: Instant,
    written: bool,
}

impl<'a> AuditOnEnd<'a> {
    fn new(route: &'a Route, caller: &'a Caller, call: &'a ToolCall) -> AuditOnEnd<'a> {
        AuditOnEnd {
            route,
            caller,
            call,
            started: Instant::now(),
            written: false,
        }
    }

    fn finish(mut self, event: &ToolEvent) {
        self.written = true;
        audit(self.route, self.caller, self.call, event);
    }
}

impl Drop for AuditOnEnd<'_> {
    fn drop(&mut self) {
        if self.written {
            return;
        }
        let event = ToolEvent {
            step: 0,
            call_id: self.call.id.clone(),
            name: self.call.name.clone(),
            kind: EventKind::Cancelled,
            outcome: "cancelled before it ended (the client cancelled the call or went away, or \
                      colony ended)"
                .into(),
            duration: self.started.elapsed(),
        };
        audit(self.route, self.caller, self.call, &event);
    }
}

fn failed(kind: EventKind, text: String) -> (EventKind, Outcome) {
    (
        kind,
        Outcome {
            text,
            files: Vec::new(),
            is_error: true,
        },
    )
}

async fn ask_resident(
    route: &Route,
    export: &ResidentExport,
    args: &Map<String, Value>,
    caller: &Caller,
    id: &str,
    reporter: Option<Reporter>,
) -> (EventKind, Outcome) {
    let schema = ToolDef::new(
        &export.name,
        "",
        resident_schema(),
        None,
        crate::turn::Handler::ViewFile,
    );
    if let Ok(def) = schema {
        let violations = def.violations(&Value::Object(args.clone()));
        if !violations.is_empty() {
            return failed(
                EventKind::Schema,
                format!(
                    "the arguments do not match the tool's schema: {}",
                    violations.join("; ")
                ),
            );
        }
    }
    let message = args.get("message").and_then(Value::as_str).unwrap_or("");
    let Some(resident) = route.resident(&export.name) else {
        // A stopping program's residents leave first: not "not hired" while the drain runs.
        let why = match route.stop_reason() {
            Some(reason) => format!(
                "{} takes no more calls: the program is stopping ({reason})",
                export.name
            ),
            None => format!(
                "{} is not running (the program has not hired it, or it is gone)",
                export.name
            ),
        };
        return failed(EventKind::Error, why);
    };
    // Each call's mail has a sender of its own, so its reply finds its way back here.
    let source = format!("{} ({id})", caller.label());
    let reply = resident.await_reply(&source);
    // However the call ends (answered, timed out, cancelled by the client: then this future is
    // dropped where it waits), its mail not yet served is taken back: it was served later all
    // the same, at a model's cost, into the resident's conversation.
    let _awaiting = Awaiting {
        resident: resident.clone(),
        source: source.clone(),
    };
    if let Err(e) = route.mail(Mail::new(&export.name, &source, message, 0)) {
        let why = match e {
            // A caller read the bare kind; the log said more.
            crate::residents::MailError::MailboxFull => {
                let n = resident.mailbox_capacity();
                format!(
                    "mailbox_full: {} holds its {n} waiting {}, the most it takes: try again \
                     once it has served some",
                    export.name,
                    if n == 1 { "mail" } else { "mails" }
                )
            }
            e => route.refusal(e, &export.name, 0),
        };
        return failed(EventKind::Error, why);
    }
    let beat = async {
        let Some(report) = reporter else {
            return std::future::pending().await;
        };
        let mut n = 0.0;
        loop {
            tokio::time::sleep(HEARTBEAT).await;
            n += 1.0;
            // In an outage the resident holds the mail and tries its model again: the caller
            // is told it waits for the model, not that it works.
            let doing = if resident.state() == crate::residents::resident::State::Outage {
                match resident.failing_because() {
                    Some(why) => format!("is waiting to try again: {why}"),
                    None => "is waiting for its model to answer again".to_string(),
                }
            } else {
                "is working".to_string()
            };
            report(Report::Progress {
                progress: n,
                total: None,
                message: Some(format!("{} {doing} ({n:.0} s)", export.name)),
            });
        }
    };
    // A blocked resident does not reply until someone unblocks it (its settings are wrong, its
    // key refused): the caller is told now, not at the call's deadline.
    let blocked = async {
        loop {
            if let Some(e) = resident.blocked_by() {
                return e;
            }
            tokio::time::sleep(HEARTBEAT).await;
        }
    };
    let mut reply = reply;
    let answer = |r: Result<crate::residents::Delivery, _>| match r {
        // The turn ended without a word for the caller.
        Ok(d) if d.kind == DeliveryKind::Reply && d.text.trim().is_empty() => failed(
            EventKind::Error,
            format!(
                "{} ended its turn without a reply (stop: {})",
                export.name,
                d.stop.unwrap_or("end_turn")
            ),
        ),
        Ok(d) if d.kind == DeliveryKind::Reply => (
            EventKind::Ok,
            Outcome {
                text: d.text,
                files: Vec::new(),
                is_error: false,
            },
        ),
        Ok(d) => failed(EventKind::Error, d.text),
        Err(_) => failed(
            EventKind::Cancelled,
            format!("{} ended before it replied", export.name),
        ),
    };
    let started = Instant::now();
    let outcome = tokio::select! {
        r = &mut reply => answer(r),
        _ = tokio::time::sleep(export.deadline) => failed(
            EventKind::Deadline,
            format!(
                "{} did not reply within {} s{}",
                export.name,
                export.deadline.as_secs_f64(),
                match resident.failing_because() {
                    Some(why) => format!(": {why}"),
                    None => String::new(),
                }
            ),
        ),
        reason = route.stopped() => {
            let stopped = || failed(
                EventKind::Cancelled,
                format!("the program stopped before {} replied: {reason}", export.name),
            );
            // A turn in flight has the grace a stop gives it: its reply, if it comes within
            // the grace (and the call's deadline), is the answer. Mail not yet taken up is
            // not served after a stop.
            let left = export.deadline.saturating_sub(started.elapsed());
            if resident.state() == crate::residents::resident::State::Busy {
                // Unless the program is ended now (a second signal): its turn is cut, and the
                // caller waited out the grace for a reply that was not coming, unanswered when
                // the service exited first. The program's own watch may hear that signal and
                // cut its turns before the host does (or instead, when the drain ends first).
                tokio::select! {
                    r = tokio::time::timeout(route.grace().min(left), &mut reply) => match r {
                        Ok(r) => answer(r),
                        Err(_) => stopped(),
                    },
                    _ = route.abandoned() => stopped(),
                    () = route.cut() => stopped(),
                }
            } else {
                stopped()
            }
        }
        e = blocked => failed(
            EventKind::Error,
            format!(
                "{} is blocked and cannot reply until it is unblocked: {}: {}",
                export.name, e.kind, e.message
            ),
        ),
        _ = beat => unreachable!("the heartbeat never ends"),
    };
    outcome
}

/// A caller awaiting a resident's reply; when it is dropped, the resident forgets it
/// ([`crate::residents::resident::Resident::forget_reply`]).
struct Awaiting {
    resident: std::sync::Arc<crate::residents::resident::Resident>,
    source: String,
}

impl Drop for Awaiting {
    fn drop(&mut self) {
        let withdrawn = self.resident.forget_reply(&self.source);
        if withdrawn > 0 {
            tracing::info!(
                ai = %self.resident.name(),
                "a call ended before its mail was served: the mail is taken back"
            );
        }
    }
}

/// One audit line for a call from outside, in the program's store.
pub fn audit(route: &Route, caller: &Caller, call: &ToolCall, event: &ToolEvent) {
    let entry = crate::residents::persist::audit_entry(&caller.label(), call, event);
    write(route, &entry);
}

/// One audit line for a request refused before it reached a tool (a foreign `Origin`, a
/// missing token): `tool` names what was asked, `outcome` why it was refused.
pub fn refused(route: &Route, caller: &Caller, tool: &str, outcome: &str, message: &str) {
    let at_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    let entry = AuditEntry {
        at_ms,
        resident: caller.label(),
        tool: tool.to_string(),
        args_hash: String::new(),
        duration_ms: 0.0,
        outcome: outcome.to_string(),
        message: Some(crate::secrets::redact(message)),
    };
    write(route, &entry);
}

fn write(route: &Route, entry: &AuditEntry) {
    if let Some(store) = route.store()
        && let Err(e) = store.audit(entry)
    {
        tracing::error!("cannot write the audit line of an MCP call: {e}");
    }
}

/// A reporter that forwards to `send` in order, from any thread.
pub fn reporter(send: impl Fn(Report) + Send + Sync + 'static) -> Reporter {
    Arc::new(send)
}
