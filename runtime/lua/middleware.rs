//! `ai.with_retries`, `ai.with_breaker`, `ai.with_context`: middleware as Lua values, for
//! `middleware = { ... }` on `ai.route`, `ai.spawn` or `ai.take_turn`. The list reads outermost
//! first: `{ ai.with_context{...}, ai.with_breaker{...}, ai.with_retries{...} }` is the usual
//! stack. Each value becomes the core's [`LayerSpec`], its Lua callbacks closures that call into
//! the VM; the stack itself is built by [`crate::infer::stack`].

use std::sync::Arc;
use std::time::Duration;

use mlua::{Lua, Table, UserData, Value};
use serde_json::json;

use super::bridge::{self, FnId, HandlerOutcome, LuaBridge};
use super::convert::{arg, check_fields, misuse};
use crate::core::Core;
use crate::infer::SharedInfer;
use crate::infer::breaker::BreakerPolicy;
use crate::infer::context::BeforeStep;
use crate::infer::retries::RetryPolicy;
use crate::infer::stack::{self, LayerSpec, TransitionHook};
use crate::residents::Route;

/// One middleware layer, as a script made it.
#[derive(Clone)]
pub enum Layer {
    Retries(RetryPolicy),
    Breaker {
        policy: BreakerPolicy,
        on_transition: Option<FnId>,
    },
    Context {
        system_suffix: Option<String>,
        before_step: Option<FnId>,
    },
}

impl UserData for Layer {}

pub fn register(lua: &Lua, ai: &Table) -> mlua::Result<()> {
    ai.set(
        "with_retries",
        lua.create_function(|lua, opts: Value| retries(arg(lua, "ai.with_retries", 1, opts)?))?,
    )?;
    ai.set(
        "with_breaker",
        lua.create_function(|lua, opts: Value| {
            breaker(lua, arg(lua, "ai.with_breaker", 1, opts)?)
        })?,
    )?;
    ai.set(
        "with_context",
        lua.create_function(|lua, opts: Value| {
            context(lua, arg(lua, "ai.with_context", 1, opts)?)
        })?,
    )?;
    Ok(())
}

fn millis(opts: &Table, who: &str, key: &str) -> mlua::Result<Option<Duration>> {
    match opts.get::<Option<f64>>(key) {
        Ok(Some(ms)) => super::convert::millis_option(who, key, ms).map(Some),
        Ok(None) => Ok(None),
        Err(_) => Err(misuse(format!(
            "{who}: {key} must be a number of milliseconds (0 or more)"
        ))),
    }
}

/// A count option: a whole number from 1, strictly (`attempts = 2.5` was 2, `0` was 1, `"3"`
/// was read as 3 and `math.huge` retried for ever).
fn count(opts: &Table, who: &str, key: &str) -> mlua::Result<Option<u32>> {
    match opts.get::<Value>(key)? {
        Value::Nil => Ok(None),
        Value::Integer(n) => super::convert::count_option(who, key, n as f64).map(Some),
        Value::Number(n) => super::convert::count_option(who, key, n).map(Some),
        other => Err(misuse(format!(
            "{who}: {key} must be a whole number from 1, not a {}",
            other.type_name()
        ))),
    }
}

/// A first wait and a longest wait, each given or its default: given both, the first may not be
/// longer (refused, naming both); given one, the other's default yields to it.
fn waits(
    who: &str,
    (first_key, first): (&str, Option<Duration>),
    (most_key, most): (&str, Option<Duration>),
    (first_default, most_default): (Duration, Duration),
) -> mlua::Result<(Duration, Duration)> {
    match (first, most) {
        (Some(a), Some(b)) if a > b => Err(misuse(format!(
            "{who}: {first_key} ({} ms) is longer than {most_key} ({} ms)",
            a.as_millis(),
            b.as_millis()
        ))),
        (Some(a), Some(b)) => Ok((a, b)),
        (Some(a), None) => Ok((a, most_default.max(a))),
        (None, Some(b)) => Ok((first_default.min(b), b)),
        (None, None) => Ok((first_default, most_default)),
    }
}

/// `ai.with_retries{ attempts = 6, base_ms = 2000, cap_ms = 60000 }`.
fn retries(opts: Option<Table>) -> mlua::Result<Layer> {
    let who = "ai.with_retries";
    let mut policy = RetryPolicy::default();
    if let Some(opts) = opts {
        check_fields(&opts, who, &["attempts", "base_ms", "cap_ms"])?;
        if let Some(n) = count(&opts, who, "attempts")? {
            policy.attempts = n;
        }
        let (base, cap) = (
            millis(&opts, who, "base_ms")?,
            millis(&opts, who, "cap_ms")?,
        );
        (policy.base, policy.cap) = waits(
            who,
            ("base_ms", base),
            ("cap_ms", cap),
            (policy.base, policy.cap),
        )?;
    }
    Ok(Layer::Retries(policy))
}

/// `ai.with_breaker{ threshold = 3, first_probe_ms = 30000, max_probe_ms = 600000,
/// on_transition = function(from, to, info) end }`.
fn breaker(lua: &Lua, opts: Option<Table>) -> mlua::Result<Layer> {
    let who = "ai.with_breaker";
    let mut policy = BreakerPolicy::default();
    let mut on_transition = None;
    if let Some(opts) = opts {
        check_fields(
            &opts,
            who,
            &[
                "threshold",
                "first_probe_ms",
                "max_probe_ms",
                "on_transition",
            ],
        )?;
        if let Some(n) = count(&opts, who, "threshold")? {
            policy.threshold = n;
        }
        let (first, most) = (
            millis(&opts, who, "first_probe_ms")?,
            millis(&opts, who, "max_probe_ms")?,
        );
        (policy.first_probe, policy.max_probe) = waits(
            who,
            ("first_probe_ms", first),
            ("max_probe_ms", most),
            (policy.first_probe, policy.max_probe),
        )?;
        match opts.get::<Value>("on_transition")? {
            Value::Nil => {}
            Value::Function(f) => on_transition = Some(bridge::register(lua, f)),
            _ => return Err(misuse(format!("{who}: on_transition must be a function"))),
        }
    }
    Ok(Layer::Breaker {
        policy,
        on_transition,
    })
}

/// `ai.with_context{ system_suffix = "...", before_step = function(info) return "..." end }`.
fn context(lua: &Lua, opts: Option<Table>) -> mlua::Result<Layer> {
    let who = "ai.with_context";
    let Some(opts) = opts else {
        return Err(misuse(format!(
            "{who}: give system_suffix or before_step (or both)"
        )));
    };
    check_fields(&opts, who, &["system_suffix", "before_step"])?;
    let system_suffix: Option<String> = opts
        .get("system_suffix")
        .map_err(|_| misuse(format!("{who}: system_suffix must be a string")))?;
    let before_step = match opts.get::<Value>("before_step")? {
        Value::Nil => None,
        Value::Function(f) => Some(bridge::register(lua, f)),
        _ => return Err(misuse(format!("{who}: before_step must be a function"))),
    };
    Ok(Layer::Context {
        system_suffix,
        before_step,
    })
}

/// The layers of `middleware = {...}` in the order given.
pub fn read_layers(value: Value, who: &str) -> mlua::Result<Vec<Layer>> {
    let list = match value {
        Value::Nil => return Ok(Vec::new()),
        Value::Table(t) => t,
        other => {
            return Err(misuse(format!(
                "{who}: middleware must be a list of ai.with_* values, not {}",
                other.type_name()
            )));
        }
    };
    let mut layers = Vec::new();
    for (i, v) in list.sequence_values::<Value>().enumerate() {
        let layer = match v? {
            Value::UserData(ud) => ud.borrow::<Layer>().map(|l| l.clone()).ok(),
            _ => None,
        };
        layers.push(layer.ok_or_else(|| {
            misuse(format!(
                "{who}: middleware[{}] is not an ai.with_retries, ai.with_breaker or \
                 ai.with_context value",
                i + 1
            ))
        })?);
    }
    Ok(layers)
}

/// The stack `layers` make around `core`: the first layer outermost (see
/// [`crate::infer::stack::build`]). A breaker keeps its state where `route` keeps the one at
/// `breaker_key` (the program's store, and the route's view for a host), and its
/// `on_transition` runs on the VM, named for the breaker's owner.
pub fn build_stack(
    core: Core,
    layers: &[Layer],
    bridge: &LuaBridge,
    route: &Route,
    breaker_key: &str,
) -> SharedInfer {
    let who = format!("[{}] on_transition", stack::breaker_owner(breaker_key));
    let specs: Vec<LayerSpec> = layers
        .iter()
        .map(|layer| layer.spec(bridge, &who))
        .collect();
    stack::build(
        Arc::new(core),
        &specs,
        Some(route.breaker_store(breaker_key)),
    )
}

impl Layer {
    /// The core's spec of this layer: its Lua callbacks become closures that call into the VM
    /// through `bridge` (`who` names an `on_transition` in the errors it raises).
    fn spec(&self, bridge: &LuaBridge, who: &str) -> LayerSpec {
        match self {
            Layer::Retries(policy) => LayerSpec::Retries(*policy),
            Layer::Breaker {
                policy,
                on_transition,
            } => LayerSpec::Breaker {
                policy: *policy,
                on_transition: on_transition.map(|func| transition_hook(bridge, func, who)),
            },
            Layer::Context {
                system_suffix,
                before_step,
            } => LayerSpec::Context {
                system_suffix: system_suffix.clone(),
                before_step: before_step.map(|func| before_step_hook(bridge, func)),
            },
        }
    }
}

/// `on_transition(from, to, info)`, posted to the VM: the breaker's lock is held while it is told.
fn transition_hook(bridge: &LuaBridge, func: FnId, who: &str) -> TransitionHook {
    let bridge = bridge.clone();
    let who = who.to_string();
    Arc::new(move |from, to, info| {
        let mut info = json!({
            "failures": info.failures,
            "last_error": info.last_error,
            "next_probe_ms": info.next_probe_in.map(|d| d.as_millis() as u64),
            "at_ms": info.at_ms,
        });
        // Absent is nil in Lua, not json.null.
        if let Some(map) = info.as_object_mut() {
            map.retain(|_, v| !v.is_null());
        }
        bridge.post(
            func,
            who.clone(),
            vec![json!(from.as_str()), json!(to.as_str()), info],
        );
    })
}

/// `before_step(info)`, called on the VM before each step; what it returns is added to the
/// system prompt, and a failure adds nothing (it is logged).
fn before_step_hook(bridge: &LuaBridge, func: FnId) -> BeforeStep {
    let bridge = bridge.clone();
    Arc::new(move |req| {
        let bridge = bridge.clone();
        let info = json!({
            "model": req.model,
            "system": req.system,
            "messages": req.messages.len(),
        });
        Box::pin(async move {
            match bridge.call_tool(func, info, json!({})).await {
                HandlerOutcome::Value(text) | HandlerOutcome::Attached(text, _) => Some(text),
                HandlerOutcome::Gone => None,
                HandlerOutcome::Refused(e)
                | HandlerOutcome::Thrown(e)
                | HandlerOutcome::Deadline(e) => {
                    tracing::warn!("before_step failed: {e}");
                    None
                }
                HandlerOutcome::Raised(fault) => {
                    tracing::warn!("before_step raised: {fault}");
                    None
                }
            }
        })
    })
}
