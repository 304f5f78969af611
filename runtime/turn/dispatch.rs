//! Running one tool call. Every way a call can go wrong (a name nobody offered, arguments that
//! are not JSON or break the schema, a handler that raises, throws or overruns its deadline)
//! comes back as an error result the model can correct from, plus a [`ToolEvent`] saying which.

use std::time::Instant;

use serde_json::{Map, Value};
use tracing::Instrument;

use super::tools::{Handler, ToolDef};
use super::{EventKind, Recorded, ToolEvent, TurnHooks};
use crate::script::{Fault, HandlerOutcome, Provenance, Script, ToolContext};
use crate::vocab::{FileRef, ToolCall, ToolResult};

/// How much of a result a [`ToolEvent`] keeps; the model gets up to [`MAX_RESULT_CHARS`].
const EVENT_OUTCOME_CHARS: usize = 500;

/// The most of one tool result the model reads, in characters: a tool that answers megabytes
/// (a whole file, a database dump) would otherwise fill the context and the bill at every step.
/// The script's `on_step` still sees the whole result.
pub const MAX_RESULT_CHARS: usize = 100_000;

/// A result as the model reads it: at most [`MAX_RESULT_CHARS`] characters, and when cut, a
/// marker saying how much was left out.
pub fn for_the_model(mut result: ToolResult) -> ToolResult {
    let Some((cut_at, _)) = result.content.char_indices().nth(MAX_RESULT_CHARS) else {
        return result;
    };
    let total = result.content.chars().count();
    result.content.truncate(cut_at);
    result.content.push_str(&format!(
        "\n[colony: the result was cut here: {} of its {total} characters were left out \
         (a tool result is at most {MAX_RESULT_CHARS} characters for the model)]",
        total - MAX_RESULT_CHARS
    ));
    result
}

/// What a call runs with besides the call itself.
pub struct CallContext<'a> {
    /// The script whose handlers the calls run.
    pub script: &'a dyn Script,
    pub tools: &'a [ToolDef],
    pub pin: &'a Map<String, Value>,
    pub step: u32,
    pub provenance: Option<&'a Provenance>,
    pub workspace: Option<&'a str>,
    pub hooks: Option<&'a dyn TurnHooks>,
    /// The conversation's files, newest first, for `view_file`.
    pub files: &'a [FileRef],
    /// The config's rate limits (`[rate]`), as the turn began.
    pub rates: Option<&'a crate::rate::RateConfig>,
    /// Why the step's calls may not run (their start could not be journaled): each is
    /// answered with it instead.
    pub refused: Option<&'a str>,
}

/// A call's answer: the result for the model, the event for the caller, and the files the
/// result carries (they follow it in the conversation).
pub struct Answer {
    pub result: ToolResult,
    pub event: ToolEvent,
    pub files: Vec<FileRef>,
}

/// The result given to a call that was cut off by a restart and is not idempotent.
pub const INTERRUPTED: &str = "interrupted by a restart: the call had started but did not \
    finish, and the tool is not marked idempotent, so it was not run again";

struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What a call cut off by the end of the program reads.
pub const CANCELLED: &str = "cancelled: the program ended before the tool finished";

/// Whether `call` runs (and so is journaled as started first): not one the journal says
/// finished before a restart (its result is reused), nor one that started and did not finish
/// unless its tool is idempotent (answered as interrupted).
pub fn will_run(cx: &CallContext<'_>, call: &ToolCall) -> bool {
    match cx.hooks.map(|h| h.recorded(&call.id)) {
        None | Some(Recorded::Nothing) => true,
        Some(Recorded::Finished(..)) => false,
        Some(Recorded::Started) => cx
            .tools
            .iter()
            .find(|t| t.spec.name == call.name)
            .is_some_and(|t| t.idempotent),
    }
}

/// Runs `call` against the offered tools and answers it. A call the journal says finished
/// before a restart is answered with its recorded result, not run again.
pub async fn run_call(cx: &CallContext<'_>, call: &ToolCall) -> Answer {
    let recorded = cx
        .hooks
        .map(|h| h.recorded(&call.id))
        .unwrap_or(Recorded::Nothing);
    if let Recorded::Finished(result, files) = recorded {
        let event = ToolEvent {
            step: cx.step,
            call_id: call.id.clone(),
            name: call.name.clone(),
            kind: if result.is_error {
                EventKind::Error
            } else {
                EventKind::Ok
            },
            outcome: result.content.chars().take(EVENT_OUTCOME_CHARS).collect(),
            duration: std::time::Duration::ZERO,
        };
        return Answer {
            result,
            event,
            files,
        };
    }
    let idempotent = cx
        .tools
        .iter()
        .find(|t| t.spec.name == call.name)
        .is_some_and(|t| t.idempotent);
    let (result, event, files) = if recorded == Recorded::Started && !idempotent {
        let event = ToolEvent {
            step: cx.step,
            call_id: call.id.clone(),
            name: call.name.clone(),
            kind: EventKind::Interrupted,
            outcome: INTERRUPTED.into(),
            duration: std::time::Duration::ZERO,
        };
        let result = ToolResult {
            call_id: call.id.clone(),
            name: call.name.clone(),
            content: INTERRUPTED.into(),
            is_error: true,
        };
        (result, event, Vec::new())
    } else {
        match cx.refused {
            None => run(cx, call).await,
            Some(why) => not_journaled(cx, call, why.to_string()),
        }
    };
    // A call the end of the program cut off did not finish: the journal keeps it as started.
    if let Some(h) = cx.hooks
        && event.kind != EventKind::Cancelled
    {
        h.finished(call, &result, &files, &event);
        if let Some(written) = h.settled() {
            written.await;
        }
    }
    Answer {
        result,
        event,
        files,
    }
}

/// A call whose start could not be journaled: not run, an error result saying why.
fn not_journaled(
    cx: &CallContext<'_>,
    call: &ToolCall,
    why: String,
) -> (ToolResult, ToolEvent, Vec<FileRef>) {
    let event = ToolEvent {
        step: cx.step,
        call_id: call.id.clone(),
        name: call.name.clone(),
        kind: EventKind::NotRun,
        outcome: why.chars().take(EVENT_OUTCOME_CHARS).collect(),
        duration: std::time::Duration::ZERO,
    };
    let result = ToolResult {
        call_id: call.id.clone(),
        name: call.name.clone(),
        content: why,
        is_error: true,
    };
    (result, event, Vec::new())
}

async fn run(cx: &CallContext<'_>, call: &ToolCall) -> (ToolResult, ToolEvent, Vec<FileRef>) {
    let (tools, step) = (cx.tools, cx.step);
    let span = tracing::info_span!(
        "tool",
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = %call.name,
        gen_ai.tool.call.id = %call.id,
    );
    let started = Instant::now();
    let (kind, mut content, files, mut traceback) = outcome(cx, tools, call).instrument(span).await;
    if kind != EventKind::Ok {
        // A failure's message is colony's text (a handler's error, a refusal): a key it quotes
        // goes no further, not to the model, the transcript, the store or the log.
        content = crate::secrets::redact(&content);
        traceback = traceback.map(|t| crate::secrets::redact(&t));
    }
    let duration = started.elapsed();
    if kind != EventKind::Ok {
        log_failure(cx, call, kind, &content, traceback.as_deref());
    }
    let event = ToolEvent {
        step,
        call_id: call.id.clone(),
        name: call.name.clone(),
        kind,
        outcome: content.chars().take(EVENT_OUTCOME_CHARS).collect(),
        duration,
    };
    let result = ToolResult {
        call_id: call.id.clone(),
        name: call.name.clone(),
        content,
        is_error: kind != EventKind::Ok,
    };
    (result, event, files)
}

/// A failed call in a resident's turn is logged at WARN (nobody else may be watching): the
/// resident, the tool, the kind and the message, with the script's traceback for a Lua error,
/// at most once every 10 s for each resident's tool, with how many went unsaid (a tool that
/// fails at every call, fed every 200 ms, wrote 3 MB of log an hour). A script's own turn
/// (`ai.take_turn`, a front end's) sees its failures in `tool_events`.
fn log_failure(
    cx: &CallContext<'_>,
    call: &ToolCall,
    kind: EventKind,
    message: &str,
    traceback: Option<&str>,
) {
    static FAILURES: std::sync::LazyLock<crate::said::SaidEach> =
        std::sync::LazyLock::new(crate::said::SaidEach::new);
    let trace = traceback.map(|t| format!("\n{t}")).unwrap_or_default();
    match cx.provenance {
        Some(p) => {
            // The script (one per program) in the key: under `colony serve` two programs'
            // residents may share a name and a tool's.
            let program = cx.script as *const dyn crate::script::Script as *const () as usize;
            if let Some(unsaid) = FAILURES.say(&format!("{program:x}\n{}\n{}", p.to, call.name)) {
                tracing::warn!(
                    "[{}] tool {} failed ({}){}: {message}{trace}",
                    p.to,
                    call.name,
                    kind.as_str(),
                    crate::said::also(unsaid)
                )
            }
        }
        None => tracing::debug!(
            "tool {} failed ({}): {message}{trace}",
            call.name,
            kind.as_str()
        ),
    }
}

async fn outcome(
    cx: &CallContext<'_>,
    tools: &[ToolDef],
    call: &ToolCall,
) -> (EventKind, String, Vec<FileRef>, Option<String>) {
    match checked(cx, tools, call).await {
        Ok(Checked::Attached(text, files)) => (EventKind::Ok, text, files, None),
        Ok(Checked::Run(kind, text)) | Err((kind, text)) => (kind, text, Vec::new(), None),
        Ok(Checked::Raised(fault)) => {
            (EventKind::Error, fault.message, Vec::new(), fault.traceback)
        }
    }
}

/// What running a call gave: an outcome, a result with files, or what the handler raised.
enum Checked {
    Run(EventKind, String),
    Attached(String, Vec<FileRef>),
    Raised(Fault),
}

async fn checked(
    cx: &CallContext<'_>,
    tools: &[ToolDef],
    call: &ToolCall,
) -> Result<Checked, (EventKind, String)> {
    let (script, pin, step) = (cx.script, cx.pin, cx.step);
    let Some(tool) = tools.iter().find(|t| t.spec.name == call.name) else {
        let offered: Vec<&str> = tools.iter().map(|t| t.spec.name.as_str()).collect();
        let list = if offered.is_empty() {
            "none".to_string()
        } else {
            offered.join(", ")
        };
        return Err((
            EventKind::UnknownTool,
            format!("unknown tool {:?}: the tools offered are {list}", call.name),
        ));
    };
    let mut args = match call.decoded() {
        Ok(v) => v,
        Err(e) => {
            return Err((
                EventKind::BadArguments,
                format!("the arguments are not valid JSON ({e}): {}", call.arguments),
            ));
        }
    };
    if let Value::Object(map) = &mut args {
        for (k, v) in pin {
            if tool.has_property(k) {
                map.insert(k.clone(), v.clone());
            }
        }
    }
    let violations = tool.violations(&args);
    if !violations.is_empty() {
        return Err((
            EventKind::Schema,
            format!(
                "the arguments do not match the tool's schema: {}",
                violations.join("; ")
            ),
        ));
    }
    if let Some(rates) = cx.rates
        && let Err(refused) = rates.check_tool(&tool.spec.name)
    {
        return Err((EventKind::RateLimited, refused));
    }
    if let Some(limit) = &tool.rate
        && let Err(wait) = limit.check()
    {
        return Err((
            EventKind::RateLimited,
            format!(
                "rate_limited: {} allows {} calls; try again in {:.1} s",
                tool.spec.name,
                limit.rate(),
                wait.as_secs_f64().max(0.1)
            ),
        ));
    }
    let run: futures::future::BoxFuture<'_, HandlerOutcome> = match &tool.handler {
        Handler::ViewFile => {
            let handle = args.get("ref").and_then(Value::as_str).unwrap_or("");
            return Ok(match crate::files::view::answer(handle, cx.files) {
                Ok((text, file)) => Checked::Attached(text, vec![file]),
                Err(e) => Checked::Run(EventKind::Error, e.to_string()),
            });
        }
        Handler::Lua(func) => script.call_handler(
            *func,
            args,
            ToolContext {
                call_id: call.id.clone(),
                name: call.name.clone(),
                step,
                provenance: cx.provenance.cloned(),
                workspace: cx.workspace.map(str::to_string),
                deadline: std::time::Instant::now().checked_add(tool.timeout),
            },
        ),
        Handler::Attaching(f) => in_task(
            || f(args),
            |(text, files)| HandlerOutcome::Attached(text, files),
        ),
        Handler::Native(f) => in_task(
            || f(args),
            |v| {
                HandlerOutcome::Value(match v {
                    Value::String(s) => s,
                    v => v.to_string(),
                })
            },
        ),
    };
    let past_deadline = || {
        Checked::Run(
            EventKind::Deadline,
            format!(
                "the tool did not finish within its deadline of {} s",
                tool.timeout.as_secs_f64()
            ),
        )
    };
    // Whichever sees the deadline first (this timer, or the Lua hook stopping a handler that
    // never waits), the model reads the same result. A handler held in code neither can stop
    // (a C library call such as a backtracking string.find, os.execute) on the thread this
    // timer runs on ends late: past its deadline, it is the deadline's too.
    let started = tokio::time::Instant::now();
    let outcome = tokio::time::timeout(tool.timeout, run).await;
    let late = started.elapsed() > tool.timeout;
    Ok(match outcome {
        Err(_) | Ok(HandlerOutcome::Deadline(_)) => past_deadline(),
        Ok(_) if late => past_deadline(),
        Ok(HandlerOutcome::Value(text)) => Checked::Run(EventKind::Ok, text),
        Ok(HandlerOutcome::Attached(text, files)) => Checked::Attached(text, files),
        Ok(HandlerOutcome::Refused(message)) => Checked::Run(EventKind::Error, message),
        Ok(HandlerOutcome::Raised(fault)) => Checked::Raised(fault),
        Ok(HandlerOutcome::Thrown(message)) => Checked::Run(EventKind::Thrown, message),
        Ok(HandlerOutcome::Gone) => Checked::Run(EventKind::Cancelled, CANCELLED.to_string()),
    })
}

/// Runs a Rust tool in a task of its own, so a panicking tool fails its call, not the turn. A
/// deadline drops the returned future: the tool's task ends with it.
///
/// The tool is called here, under `catch_unwind`: one that panics before it returns its future
/// (in its synchronous part) took the resident down with it, and the mail it served was lost.
fn in_task<T: Send + 'static>(
    start: impl FnOnce() -> futures::future::BoxFuture<'static, Result<T, String>>,
    done: fn(T) -> HandlerOutcome,
) -> futures::future::BoxFuture<'static, HandlerOutcome> {
    let run = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(start)) {
        Ok(run) => run,
        Err(panic) => {
            let why = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".to_string());
            return Box::pin(async move {
                HandlerOutcome::Raised(format!("the tool panicked: {why}").into())
            });
        }
    };
    let task = tokio::spawn(run);
    Box::pin(async move {
        let _abort = AbortOnDrop(task.abort_handle());
        match task.await {
            Ok(Ok(v)) => done(v),
            Ok(Err(e)) => HandlerOutcome::Raised(e.into()),
            Err(e) => HandlerOutcome::Raised(format!("the tool panicked: {e}").into()),
        }
    })
}
