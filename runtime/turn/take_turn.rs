//! The turn loop.

use futures::future::join_all;
use serde_json::Value;
use tracing::Instrument;

use super::compaction;
use super::dispatch::{Answer, CANCELLED, CallContext, run_call};
use super::estimate;
use super::tools::narrow;
use super::{EventKind, StepReport, ToolEvent, TurnError, TurnHooks, TurnOutcome, TurnSpec};
use crate::config::Overrides;
use crate::core::Core;
use crate::files;
use crate::infer::DynInfer;
use crate::providers::ProviderError;
use crate::script::{FnId, Script};
use crate::vocab::{
    InferRequest, Inferred, Message, Part, Role, Stop, ToolCall, ToolChoice, ToolResult, Usage,
};

/// What the model reads on the last allowed step, so it answers instead of asking for tools.
pub const BUDGET_NOTE: &str = "[colony] The tool budget of this turn is exhausted: answer now, \
    without calling tools.";

/// The result given to a call left unanswered at the step cap.
pub const UNRUN_NOTE: &str =
    "not run: the tool budget of this turn was exhausted before this call could run";

/// Runs one turn to its end. Never fails as a whole: a provider error ends the turn with
/// `stop = error` and the transcript so far.
/// Each model call goes through `stack` (the middleware; `core` itself for none); `core` settles
/// each request's settings.
pub async fn take_turn(
    core: &Core,
    stack: &dyn DynInfer,
    script: &dyn Script,
    spec: TurnSpec,
) -> TurnOutcome {
    let span = tracing::info_span!("turn", max_steps = spec.max_steps);
    run(core, stack, script, spec).instrument(span).await
}

async fn run(
    core: &Core,
    stack: &dyn DynInfer,
    script: &dyn Script,
    mut spec: TurnSpec,
) -> TurnOutcome {
    // The config's rate limits, as the turn begins.
    let config = core.config();
    let mut offered = match &spec.dynamic {
        None => narrow(&spec.tools, &spec.allow, &spec.deny),
        Some(d) => {
            d.refresh().await;
            narrow(&with_dynamic(&spec), &spec.allow, &spec.deny)
        }
    };
    // One request for the whole turn: each step appends to its messages and re-resolves only the
    // settings (so a rotated key lands mid-turn); nothing is copied per step.
    let messages = std::mem::take(&mut spec.ask.messages);
    let mut req = InferRequest {
        model: String::new(),
        system: spec.ask.system.take(),
        // The window is fixed for the whole turn: what its steps append never changes what
        // went before (see files::window).
        files_from: Some(files::window::turn_window(&messages)),
        messages,
        tools: offered.iter().map(|t| t.spec.clone()).collect(),
        tool_choice: spec.ask.tool_choice.clone(),
        max_tokens: None,
        temperature: None,
        stop_sequences: std::mem::take(&mut spec.ask.stop_sequences),
        extra: spec.ask.extra.take(),
        response_schema: None,
    };
    let mut out = TurnOutcome {
        reply: String::new(),
        stop: Stop::Error,
        steps: 0,
        usage: Usage::default(),
        tool_events: Vec::new(),
        messages: Vec::new(),
        compactions: 0,
        error: None,
        resumed: false,
        reported_tokens: None,
    };
    // Carried over from the conversation's previous turn: what was reported then, plus what
    // was appended since (the new mail) at ~4 bytes a token.
    let appended: usize = req
        .messages
        .iter()
        .rev()
        .take_while(|m| m.role == Role::User)
        .map(|m| m.text_len() + 32)
        .sum();
    let mut window = compaction::Window::carried(spec.reported_tokens, appended);
    // How the files travel, for colony's own estimate of each request; the estimate has a say
    // while there is a reply to summarise and until a compaction fails to bring it under.
    let wire = core
        .resolve(&spec.ask.overrides)
        .ok()
        .map(|r| (r.endpoint.style, r.endpoint.reads));
    let mut estimating = true;
    let max_steps = spec.max_steps.max(1);
    let hooks = spec.hooks.clone();
    // A transcript that ends with calls and no results is a step cut off by a restart: answer
    // its calls first (the journal reuses what finished), then carry on inferring.
    let pending: Vec<ToolCall> = match req.messages.last() {
        Some(m) if m.role == Role::Assistant => m.tool_calls().cloned().collect(),
        _ => Vec::new(),
    };
    // A model that takes no tools (`tools = "none"`) is not offered view_file either.
    let takes_tools = core.resolve(&spec.ask.overrides).map_or(true, |r| {
        r.endpoint.tools_level != crate::providers::ToolsLevel::None
    });
    let deny_view = if takes_tools {
        spec.deny.clone()
    } else {
        vec![files::view::NAME.to_string()]
    };
    offer_view_file(&mut offered, &mut req, &deny_view);
    // A call writes its record: the hooks may get ready for it while the model is asked
    // (or a cut-off step's calls run).
    if let Some(h) = &hooks
        && (!offered.is_empty() || !pending.is_empty())
    {
        h.turn_begins();
    }
    if !pending.is_empty() {
        let held = viewable(&offered, &req.messages);
        let cx = context(script, &spec, 0, &offered, &held, config.rate.as_ref());
        let answers = match run_calls(&cx, &pending, spec.on_tool, &mut out.tool_events).await {
            Ran::Answered(answers) => answers,
            Ran::Cancelled => return cancelled(out, req.messages),
            Ran::Unsaved(e) => return not_saved(out, req.messages, e),
        };
        req.messages.push(results_message(answers));
        out.resumed = true;
        if let Some(h) = &hooks
            && let Err(e) = h.step_done(&req.messages)
        {
            return not_saved(out, req.messages, e);
        }
    } else if let Some(h) = &hooks
        && req.messages.last().is_some_and(|m| m.role == Role::Tool)
    {
        // A turn taken up again after its step's save failed (a full disk) holds results
        // that may not be on disk: they are saved before a model reads them.
        if let Err(e) = h.step_done(&req.messages) {
            return not_saved(out, req.messages, e);
        }
    }
    // The model answered a compaction with no summary: not asked again this turn.
    let mut summary_refused = false;
    for step in 1..=max_steps {
        // Tools a dynamic source added (or took away) during the last step count from this one.
        if let Some(d) = spec.dynamic.as_ref().filter(|_| step > 1) {
            d.refresh().await;
            offered = narrow(&with_dynamic(&spec), &spec.allow, &spec.deny);
            req.tools = offered.iter().map(|t| t.spec.clone()).collect();
            offer_view_file(&mut offered, &mut req, &deny_view);
        }
        let estimated = if spec.compaction.enabled
            && estimating
            && req.messages.iter().any(|m| m.role == Role::Assistant)
        {
            estimate::tokens(&req, wire)
        } else {
            0
        };
        if spec.compaction.enabled
            && !summary_refused
            && window.would_overflow(&spec.compaction, estimated)
        {
            // Boxed: a compaction is rare, and inline its future would be part of every turn's.
            let before = out.usage;
            let compacted = Box::pin(compaction::compact(
                core,
                stack,
                &spec,
                &req,
                &mut out.usage,
            ))
            .await;
            // Its summary call spent too, cut turn or not.
            if let Some(h) = &spec.hooks {
                h.spent(&out.usage.since(&before));
            }
            match compacted {
                // No summary: asked again at every step, it would be refused again at a cost.
                Ok(None) => summary_refused = true,
                Ok(Some(messages)) => {
                    // The latest request's files (or the last round's) inline; the earlier
                    // ones the compaction kept are reference lines.
                    req.files_from =
                        Some(files::window::newest_with_files(&messages).unwrap_or(messages.len()));
                    req.messages = messages;
                    // What a compaction keeps (the latest request, the last round) can be past
                    // the threshold on its own: compacting again would not help.
                    if estimating
                        && estimate::tokens(&req, wire) as f64
                            > compaction::threshold(&spec.compaction)
                    {
                        tracing::warn!(
                            "the compacted transcript is still past the compaction threshold; \
                             the rest of this turn compacts on the provider's count only"
                        );
                        estimating = false;
                    }
                    offer_view_file(&mut offered, &mut req, &deny_view);
                    out.compactions += 1;
                    window = compaction::Window::default();
                    out.reported_tokens = None;
                }
                Err(e) => {
                    out.error = Some(TurnError {
                        message: format!("compaction failed: {e}"),
                        ..TurnError::from_provider(&e)
                    });
                    out.messages = req.messages;
                    return out;
                }
            }
        }
        let last = step == max_steps;
        if last && !req.tools.is_empty() && step > 1 {
            req.messages.push(Message::user(BUDGET_NOTE));
        }
        if last {
            req.tool_choice = ToolChoice::None;
        }
        let attempt = model_step(
            core,
            stack,
            script,
            &spec.ask.overrides,
            &mut req,
            spec.on_text,
        )
        .await;
        let inferred = match attempt {
            Ok(i) => i,
            Err(e) => {
                out.error = Some(TurnError::from_provider(&e));
                out.messages = req.messages;
                return out;
            }
        };
        out.steps = step;
        out.usage.add(&inferred.usage);
        if let Some(h) = &spec.hooks {
            h.spent(&inferred.usage);
        }
        window.reported(&inferred.usage);
        out.reported_tokens = window.reported_tokens();
        // An answer that says the model failed is no reply: the turn ends with the error, the
        // answer left out, and is tried again as a transient failure is.
        if let Some(e) = ProviderError::failed_answer(&inferred) {
            out.error = Some(TurnError::from_provider(&e));
            out.messages = req.messages;
            return out;
        }
        req.messages.push(inferred.message.clone());
        let calls = inferred.tool_calls();
        // The reply must be on disk before its calls run, and a final answer before it is
        // handed on: delivered unsaved, its mail stayed in the saved backlog and was answered
        // again after a restart. An answer that cannot be saved is let go; the turn is taken
        // up again (the model asked again) once the store takes writes.
        if let Some(h) = &hooks
            && let Err(e) = h.inferred(&req.messages)
        {
            if calls.is_empty() {
                req.messages.pop();
            }
            return not_saved(out, req.messages, e);
        }
        if calls.is_empty() {
            out.reply = inferred.text();
            out.stop = inferred.stop;
            report(script, spec.on_step, step, &inferred, &[]).await;
            out.messages = req.messages;
            return out;
        }
        // The results whole, for the script (`on_step`); the message holds them as the model
        // reads them (see `dispatch::for_the_model`).
        let mut whole: Option<Vec<ToolResult>> = None;
        let answered: Message = if last {
            let noted = unrun(&calls, step, hooks.as_deref(), &mut out.tool_events);
            if let Some(written) = hooks.as_ref().and_then(|h| h.settled()) {
                written.await;
            }
            noted
        } else {
            let held = viewable(&offered, &req.messages);
            let cx = context(script, &spec, step, &offered, &held, config.rate.as_ref());
            match run_calls(&cx, &calls, spec.on_tool, &mut out.tool_events).await {
                Ran::Answered(answers) => {
                    whole = Some(answers.iter().map(|a| a.result.clone()).collect());
                    results_message(answers)
                }
                Ran::Cancelled => return cancelled(out, req.messages),
                Ran::Unsaved(e) => return not_saved(out, req.messages, e),
            }
        };
        let results: Vec<ToolResult> = answered.tool_results().cloned().collect();
        window.unsent(&results);
        let whole = whole.unwrap_or(results);
        report(script, spec.on_step, step, &inferred, &whole).await;
        req.messages.push(answered);
        if let Some(h) = &hooks
            && let Err(e) = h.step_done(&req.messages)
        {
            return not_saved(out, req.messages, e);
        }
        if last {
            out.reply = inferred.text();
            out.stop = Stop::MaxSteps;
            out.messages = req.messages;
            return out;
        }
    }
    unreachable!("the last step always returns")
}

fn context<'a>(
    script: &'a dyn Script,
    spec: &'a TurnSpec,
    step: u32,
    offered: &'a [super::ToolDef],
    files: &'a [crate::vocab::FileRef],
    rates: Option<&'a crate::rate::RateConfig>,
) -> CallContext<'a> {
    CallContext {
        script,
        tools: offered,
        pin: &spec.pin,
        step,
        provenance: spec.provenance.as_ref(),
        workspace: spec.workspace.as_deref(),
        hooks: spec.hooks.as_deref(),
        files,
        rates,
        refused: None,
    }
}

/// The turn's own tools and, when it has a dynamic source, what that source offers now.
fn with_dynamic(spec: &TurnSpec) -> Vec<super::tools::ToolDef> {
    let mut tools = spec.tools.clone();
    if let Some(d) = &spec.dynamic {
        tools.extend(d.current());
    }
    tools
}

/// Runs a step's calls at once, telling `on_tool` of each as it ends; `None` when the program
/// ended while they ran.
/// What became of a step's calls.
enum Ran {
    Answered(Vec<Answer>),
    /// The end of the program cut a call off.
    Cancelled,
    /// Their start could not be journaled (the store cannot write): none ran.
    Unsaved(String),
}

async fn run_calls(
    cx: &CallContext<'_>,
    calls: &[ToolCall],
    on_tool: Option<FnId>,
    events: &mut Vec<ToolEvent>,
) -> Ran {
    // Every call that will run is journaled as started before any runs.
    let starting: Vec<&ToolCall> = calls
        .iter()
        .filter(|c| super::dispatch::will_run(cx, c))
        .collect();
    let refusal = match cx.hooks.map_or(Ok(()), |h| h.starting(&starting)) {
        Ok(()) => None,
        Err(super::NotStarted::Refused(why)) => Some(why),
        Err(super::NotStarted::Unsaved(why)) => return Ran::Unsaved(why),
    };
    let cx = &CallContext {
        refused: refusal.as_deref(),
        ..*cx
    };
    let mut answers = Vec::with_capacity(calls.len());
    let mut cut_off = false;
    let each = calls.iter().map(|c| async move {
        let answer = run_call(cx, c).await;
        tell_tool(cx.script, on_tool, c, &answer.event).await;
        answer
    });
    for answer in join_all(each).await {
        cut_off |= answer.event.kind == EventKind::Cancelled;
        events.push(answer.event.clone());
        answers.push(answer);
    }
    match cut_off {
        false => Ran::Answered(answers),
        true => Ran::Cancelled,
    }
}

/// Whether `message` is the results a turn wrote for the calls it did not run at its last step
/// ([`UNRUN_NOTE`]): a conversation that ends with it ended its turn there, though it ends with
/// tool results as one stopped mid-turn does.
pub fn ended_at_step_limit(message: &Message) -> bool {
    message.role == Role::Tool
        && message.parts.iter().all(|p| match p {
            Part::ToolResult(r) => r.is_error && r.content == UNRUN_NOTE,
            _ => false,
        })
}

/// The results of calls left unanswered at the step cap: each is noted as not run, in the
/// turn's `tool_events` and (through the hooks) the audit log, like a call that ran.
fn unrun(
    calls: &[ToolCall],
    step: u32,
    hooks: Option<&dyn TurnHooks>,
    events: &mut Vec<ToolEvent>,
) -> Message {
    let mut parts = Vec::with_capacity(calls.len());
    for c in calls {
        let result = ToolResult {
            call_id: c.id.clone(),
            name: c.name.clone(),
            content: UNRUN_NOTE.into(),
            is_error: true,
        };
        let event = ToolEvent {
            step,
            call_id: c.id.clone(),
            name: c.name.clone(),
            kind: EventKind::NotRun,
            outcome: UNRUN_NOTE.into(),
            duration: std::time::Duration::ZERO,
        };
        if let Some(h) = hooks {
            h.finished(c, &result, &[], &event);
        }
        events.push(event);
        parts.push(Part::ToolResult(result));
    }
    Message::new(Role::Tool, parts)
}

/// The message of a step's results, each followed by the files it carries.
fn results_message(answers: Vec<Answer>) -> Message {
    let mut parts = Vec::with_capacity(answers.len());
    for answer in answers {
        parts.push(Part::ToolResult(super::dispatch::for_the_model(
            answer.result,
        )));
        parts.extend(answer.files.into_iter().map(Part::File));
    }
    Message::new(Role::Tool, parts)
}

/// The conversation's files, for `view_file`: gathered only when the turn offers it (a step
/// of a turn without files does not walk the conversation for them).
fn viewable(offered: &[super::ToolDef], messages: &[Message]) -> Vec<crate::vocab::FileRef> {
    if offered
        .iter()
        .any(|t| matches!(t.handler, super::Handler::ViewFile))
    {
        files::view::files_of(messages)
    } else {
        Vec::new()
    }
}

/// Offers `view_file` for the whole turn when its conversation holds a file before the window
/// (a reference line), unless the turn denies it or has a tool of that name. Decided at the
/// start (and after a compaction), never mid-turn: the tools sent must not change.
fn offer_view_file(offered: &mut Vec<super::ToolDef>, req: &mut InferRequest, deny: &[String]) {
    if offered.iter().any(|t| t.spec.name == files::view::NAME)
        || !files::window::has_older_files(req)
    {
        return;
    }
    let tool = files::view::tool();
    if narrow(std::slice::from_ref(&tool), &[], deny).is_empty() {
        return;
    }
    req.tools.push(tool.spec.clone());
    offered.push(tool);
}

/// Tells `on_tool` that `call` ended: its event, its arguments and whether it went well. A call
/// cut off by the end of the program is not told of (nothing is listening any more).
async fn tell_tool(script: &dyn Script, on_tool: Option<FnId>, call: &ToolCall, event: &ToolEvent) {
    let Some(func) = on_tool else { return };
    if event.kind == EventKind::Cancelled {
        return;
    }
    let mut value = serde_json::to_value(event).unwrap_or(Value::Null);
    if let Value::Object(map) = &mut value {
        map.insert("arguments".into(), Value::String(call.arguments.clone()));
        map.insert("ok".into(), Value::Bool(event.kind == EventKind::Ok));
    }
    if let Err(e) = script.call(func, vec![value]).await {
        tracing::warn!("on_tool failed: {e}");
    }
}

/// Ends a turn early with `stop = error` and the transcript so far.
fn ended(mut out: TurnOutcome, messages: Vec<Message>, kind: &str, message: String) -> TurnOutcome {
    out.error = Some(TurnError {
        kind: kind.into(),
        message,
        ..TurnError::default()
    });
    out.messages = messages;
    out
}

/// The program ended while a step's tools ran: nothing of the step is committed (a restart finds
/// its calls in the journal).
fn cancelled(out: TurnOutcome, messages: Vec<Message>) -> TurnOutcome {
    ended(out, messages, "cancelled", CANCELLED.into())
}

/// A step's progress could not be saved: nothing more runs until it can be.
fn not_saved(out: TurnOutcome, messages: Vec<Message>, message: String) -> TurnOutcome {
    ended(out, messages, "store", message)
}

/// One model call (with the refused-attachment retry), text deltas forwarded to the script's
/// `on_text` in order; a callback that raises is logged, and the call goes on.
async fn model_step(
    core: &Core,
    stack: &dyn DynInfer,
    script: &dyn Script,
    overrides: &Overrides,
    req: &mut InferRequest,
    on_text: Option<FnId>,
) -> Result<Inferred, ProviderError> {
    let forward = on_text.map(|func| {
        move |delta: String| async move {
            if let Err(e) = script.call(func, vec![Value::String(delta)]).await {
                tracing::warn!("the stream callback failed: {e}");
            }
            Ok::<(), std::convert::Infallible>(())
        }
    });
    match super::model_call::call_model(core, stack, overrides, req, forward).await {
        Ok(result) => result,
        Err(never) => match never {},
    }
}

async fn report(
    script: &dyn Script,
    on_step: Option<FnId>,
    step: u32,
    inferred: &Inferred,
    results: &[ToolResult],
) {
    let Some(func) = on_step else { return };
    let report = StepReport {
        step,
        text: inferred.text(),
        calls: inferred.tool_calls(),
        results: results.to_vec(),
        usage: inferred.usage,
    };
    let value = serde_json::to_value(&report).unwrap_or(Value::Null);
    if let Err(e) = script.call(func, vec![value]).await {
        tracing::warn!("on_step failed: {e}");
    }
}
