//! Reading an `ai.spawn` table into what the core hires: a [`ResidentSpec`] (settings under
//! the route's, tools, delivery, restart policy, middleware stack) and its [`Source`]s.
//!
//! The route's defaults (`ai.route{...}`) are kept here ([`RouteDefaults`]); the hiring itself is
//! the core's ([`crate::residents::Lifecycle::spawn`]).

use std::cell::RefCell;
use std::sync::Arc;

use mlua::{Function, Lua, Table, Value};
use tokio::sync::mpsc;

use super::ai::read_ask;
use super::bridge::{self, LuaBridge};
use super::convert::{flag, misuse};
use super::middleware::{Layer, build_stack, read_layers};
use super::tools::read_tools;
use super::turn::read_compaction;
use crate::core::Ask;
use crate::infer::SharedInfer;
use crate::residents::budget::{Budget, Budgets, Window};
use crate::residents::mail::CAPACITY;
use crate::residents::resident::DEFAULT_MAX_HOP;
use crate::residents::{
    Deliver, Delivery, Lifecycle, ResidentSpec, Restart, RestartPolicy, Source,
};
use crate::turn::DEFAULT_MAX_STEPS;

/// What `ai.route{...}` set: the settings and middleware every resident starts from, and the
/// stack the residents without their own middleware share. Lives in the VM's app data.
pub struct RouteDefaults(RefCell<Defaults>);

struct Defaults {
    /// `ai.route` was called (it may be, once).
    set: bool,
    template: Ask,
    layers: Vec<Layer>,
    stack: Option<SharedInfer>,
    /// Where `deliver_to = "host"` goes under an embedding application (else standard output).
    host: Option<mpsc::UnboundedSender<Delivery>>,
    /// `ai.route{ budget = ... }`: the program's, summed over its residents.
    budget: Option<Budget>,
}

impl RouteDefaults {
    pub fn new(host: Option<mpsc::UnboundedSender<Delivery>>) -> RouteDefaults {
        RouteDefaults(RefCell::new(Defaults {
            set: false,
            template: Ask::default(),
            layers: Vec::new(),
            stack: None,
            host,
            budget: None,
        }))
    }
}

fn bad(who: &str, what: impl std::fmt::Display) -> mlua::Error {
    misuse(format!("{who}: {what}"))
}

/// `ai.route{ provider / use / model ..., middleware = {...} }`: the defaults every resident
/// starts from. Once, before the first `ai.spawn`.
pub(super) fn route(lua: &Lua, opts: Option<Table>) -> mlua::Result<()> {
    let who = "ai.route";
    let defaults = lua
        .app_data_ref::<RouteDefaults>()
        .expect("the VM has route defaults");
    let mut d = defaults.0.borrow_mut();
    if d.set {
        return Err(bad(who, "the route is already open (call ai.route once)"));
    }
    let hired = lua
        .app_data_ref::<Lifecycle>()
        .is_some_and(|l| l.has_residents());
    if hired {
        return Err(bad(who, "call ai.route before the first ai.spawn"));
    }
    let (middleware, budget) = match &opts {
        Some(t) => (t.get::<Value>("middleware")?, t.get::<Value>("budget")?),
        None => (Value::Nil, Value::Nil),
    };
    let budget = read_budget(&budget, who)?;
    let (template, stream) = read_ask(lua, opts, who, &["middleware", "budget"])?;
    known_provider(who, &template)?;
    if stream.is_some() {
        return Err(bad(who, "stream is not a route setting"));
    }
    d.layers = read_layers(middleware, who)?;
    d.template = template;
    d.budget = budget;
    d.set = true;
    Ok(())
}

/// A provider a resident's settings name must be one colony knows: a misspelt one was taken at
/// the spawn, and blocked the resident at its first mail, far from the line that said it.
/// (`ai.ask` answers it at once, as `nil, err`.)
fn known_provider(who: &str, ask: &crate::core::Ask) -> mlua::Result<()> {
    match ask.overrides.provider.as_deref() {
        Some(p) if crate::providers::catalogue::find(p).is_none() => Err(bad(
            who,
            format!(
                "unknown provider {p:?} (known: {})",
                crate::providers::catalogue::ids().join(", ")
            ),
        )),
        _ => Ok(()),
    }
}

const SPAWN_FIELDS: &[&str] = &[
    "name",
    "tools",
    "sources",
    "deliver_to",
    "max_steps",
    "workspace",
    "persist_conversation",
    "middleware",
    "restart",
    "max_restarts",
    "restart_window_ms",
    "max_hop",
    "mailbox",
    "compact",
    "context_window",
    "compact_at",
    "compact_prompt",
    "mcp",
    "budget",
    "export",
    "on_elicit",
];

/// `ai.spawn{ name, system?, tools?, sources?, deliver_to?, max_steps?, middleware?, restart?,
/// max_hop?, mailbox?, mcp?, use / provider / model ... }` read into what the core hires, with
/// `mcp_tools` (the tools of its `mcp` servers, read again before each step) beside its own.
pub(super) fn read_spawn(
    lua: &Lua,
    lifecycle: &Lifecycle,
    opts: Table,
    mcp_tools: Option<std::sync::Arc<dyn crate::turn::DynamicTools>>,
) -> mlua::Result<(ResidentSpec, Vec<Source>)> {
    let who = "ai.spawn";
    let name: String = opts
        .get::<Option<String>>("name")
        .ok()
        .flatten()
        .filter(|n| !n.trim().is_empty())
        .ok_or_else(|| bad(who, "name (a non-empty string) is required"))?;
    let who = &format!("ai.spawn {name:?}");
    if name.contains('/') {
        return Err(bad(who, "a name cannot contain '/'"));
    }
    let persist = flag(&opts, "persist_conversation", who)?.unwrap_or(false);
    let workspace = opts
        .get::<Option<String>>("workspace")
        .map_err(|_| bad(who, "workspace must be a name (a string)"))?;
    if workspace
        .as_deref()
        .is_some_and(|w| w == crate::residents::budget::SPACE)
    {
        return Err(bad(
            who,
            "workspace \"colony/usage\" is colony's own (its usage)",
        ));
    }
    // The empty name is the global space: a resident given it saw every global key, where
    // README promises its tools and sources see its space alone.
    if workspace.as_deref() == Some("") {
        return Err(bad(
            who,
            "workspace is empty: name a space of its own, or leave it out for the global space",
        ));
    }
    let own_budget = read_budget(&opts.get::<Value>("budget")?, who)?;
    let tools_value = opts.get::<Value>("tools")?;
    let sources_value = opts.get::<Value>("sources")?;
    let deliver_value = opts.get::<Value>("deliver_to")?;
    let middleware = opts.get::<Value>("middleware")?;
    let (own, stream) = read_ask(lua, Some(opts.clone()), who, SPAWN_FIELDS)?;
    known_provider(who, &own)?;
    if stream.is_some() {
        return Err(bad(
            who,
            "stream is not a resident setting (use deliver_to)",
        ));
    }
    let mut inline = Vec::new();
    let tools = read_tools(lua, tools_value, who, &mut inline)?;
    let restart = read_policy(&opts, who, Restart::Permanent)?;
    let max_steps = positive(&opts, who, "max_steps")?.unwrap_or(DEFAULT_MAX_STEPS);
    let max_hop = match opts.get::<Option<f64>>("max_hop") {
        Ok(Some(n)) => super::convert::zero_or_more_option(who, "max_hop", n)?,
        Ok(None) => DEFAULT_MAX_HOP,
        Err(_) => return Err(bad(who, "max_hop must be a whole number (0 or more)")),
    };
    let mailbox = positive(&opts, who, "mailbox")?.map_or(CAPACITY, |n| n as usize);
    let compaction = read_compaction(&super::options::Options::read(lua, opts.clone(), who)?, who)?;
    let sources = read_sources(lua, &sources_value, who)?;
    let defaults = lua
        .app_data_ref::<RouteDefaults>()
        .expect("the VM has route defaults");
    let bridge = lua
        .app_data_ref::<LuaBridge>()
        .expect("the VM has a bridge")
        .clone();
    let deliver = match deliver_value {
        Value::Nil => Deliver::Nobody,
        Value::Function(f) => Deliver::Script(Arc::new(bridge.clone()), bridge::register(lua, f)),
        Value::String(s) if s == "host" => match &defaults.0.borrow().host {
            Some(tx) => Deliver::Channel(tx.clone()),
            None => Deliver::Stdout,
        },
        other => {
            let not = match &other {
                Value::String(s) => format!("{:?}", s.to_string_lossy()),
                other => other.type_name().to_string(),
            };
            return Err(bad(
                who,
                format!("deliver_to must be a function(reply, info) or \"host\", not {not}"),
            ));
        }
    };
    let layers = read_layers(middleware.clone(), who)?;
    // Residents call models from the core's runtime, on its shared pool.
    let route = lifecycle.route();
    let core = route.core().clone();
    let stack = if matches!(middleware, Value::Nil) {
        let mut d = defaults.0.borrow_mut();
        let layers = d.layers.clone();
        d.stack
            .get_or_insert_with(|| build_stack(core, &layers, &bridge, route, "ai/breaker"))
            .clone()
    } else {
        let key = format!("ai/breaker/{name}");
        build_stack(core, &layers, &bridge, route, &key)
    };
    let ask = own.under(&defaults.0.borrow().template);
    let budgets = Budgets {
        own: own_budget,
        program: defaults.0.borrow().budget.clone(),
    };
    let spec = ResidentSpec {
        name,
        ask,
        tools,
        changing_tools: mcp_tools,
        max_steps,
        max_hop,
        mailbox,
        compaction,
        deliver,
        restart,
        stack,
        persist,
        workspace,
        budgets,
    };
    Ok((spec, sources))
}

/// `budget = { tokens = N, cost = X, per = "day" }` (at least one of `tokens` and `cost`; `per`
/// is `"hour"`, `"day"` (the default) or `"month"`).
fn read_budget(value: &Value, who: &str) -> mlua::Result<Option<Budget>> {
    let t = match value {
        Value::Nil => return Ok(None),
        Value::Table(t) => t,
        other => {
            return Err(bad(
                who,
                format!(
                    "budget must be a table {{ tokens = N, cost = X, per = \"day\" }}, not {}",
                    shown(other)
                ),
            ));
        }
    };
    for pair in t.pairs::<Value, Value>() {
        let (k, _) = pair?;
        let known = matches!(&k, Value::String(s) if matches!(s.to_str().as_deref(), Ok("tokens" | "cost" | "per")));
        if !known {
            let k = match &k {
                Value::String(s) => s.to_string_lossy(),
                other => format!("{} key", super::convert::a_type(other.type_name())),
            };
            return Err(bad(
                who,
                format!("budget.{k} is not a budget field (tokens, cost, per)"),
            ));
        }
    }
    let tokens = match t.get::<Value>("tokens")? {
        Value::Nil => None,
        Value::Integer(n) if n > 0 => Some(n as u64),
        Value::Number(n) if n > 0.0 && n.fract() == 0.0 && n < 1e18 => Some(n as u64),
        other => {
            return Err(bad(
                who,
                format!(
                    "budget.tokens must be a whole number above 0, not {}",
                    shown(&other)
                ),
            ));
        }
    };
    let cost = match t.get::<Value>("cost")? {
        Value::Nil => None,
        Value::Integer(n) if n > 0 => Some(n as f64),
        Value::Number(n) if n > 0.0 && n.is_finite() => Some(n),
        other => {
            return Err(bad(
                who,
                format!(
                    "budget.cost must be an amount above 0 (in the price table's currency), not {}",
                    shown(&other)
                ),
            ));
        }
    };
    let per = match t.get::<Value>("per")? {
        Value::Nil => Window::Day,
        Value::String(s) => {
            Window::parse(&s.to_string_lossy()).map_err(|e| bad(who, format!("budget: {e}")))?
        }
        other => {
            return Err(bad(
                who,
                format!(
                    "budget.per must be \"hour\", \"day\" or \"month\", not a {}",
                    other.type_name()
                ),
            ));
        }
    };
    if tokens.is_none() && cost.is_none() {
        return Err(bad(who, "budget needs tokens = N, cost = X or both"));
    }
    Ok(Some(Budget { tokens, cost, per }))
}

/// A value as an error message shows it.
fn shown(v: &Value) -> String {
    match v {
        Value::Integer(n) => n.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => format!("{:?}", s.to_string_lossy()),
        other => format!("a {}", other.type_name()),
    }
}

fn positive(opts: &Table, who: &str, key: &str) -> mlua::Result<Option<u32>> {
    match opts.get::<Option<f64>>(key) {
        Ok(Some(n)) => super::convert::count_option(who, key, n).map(Some),
        Ok(None) => Ok(None),
        Err(_) => Err(bad(
            who,
            format!("{key} must be a whole number of 1 or more"),
        )),
    }
}

/// `restart = "permanent" | "transient" | "temporary"`, `max_restarts`, `restart_window_ms`.
pub(super) fn read_policy(t: &Table, who: &str, default: Restart) -> mlua::Result<RestartPolicy> {
    let restart = match t.get::<Value>("restart")? {
        Value::Nil => default,
        Value::String(s) => Restart::parse(&s.to_string_lossy()).ok_or_else(|| {
            bad(
                who,
                format!(
                    "restart = {:?} (expected \"permanent\", \"transient\" or \"temporary\")",
                    s.to_string_lossy()
                ),
            )
        })?,
        other => {
            return Err(bad(
                who,
                format!("restart cannot be a {}", other.type_name()),
            ));
        }
    };
    let mut policy = RestartPolicy::new(restart);
    match t.get::<Option<f64>>("max_restarts") {
        Ok(Some(n)) => {
            policy.max_restarts = super::convert::zero_or_more_option(who, "max_restarts", n)?
        }
        Ok(None) => {}
        Err(_) => return Err(bad(who, "max_restarts must be a whole number (0 or more)")),
    }
    match t.get::<Option<f64>>("restart_window_ms") {
        Ok(Some(ms)) if ms > 0.0 => {
            policy.window = super::convert::millis_option(who, "restart_window_ms", ms)?
        }
        Ok(None) => {}
        Ok(Some(ms)) => {
            return Err(bad(
                who,
                format!(
                    "restart_window_ms must be more than 0, not {}",
                    crate::duration::number_text(ms)
                ),
            ));
        }
        Err(_) => {
            return Err(bad(
                who,
                "restart_window_ms must be a number of milliseconds",
            ));
        }
    }
    Ok(policy)
}

/// `sources = { f, { f, restart = "permanent", max_restarts = 5 }, ... }`. A source is restarted
/// only after a crash unless it says otherwise (`transient`): one that returns has finished.
fn read_sources(lua: &Lua, value: &Value, who: &str) -> mlua::Result<Vec<Source>> {
    let list = match value {
        Value::Nil => return Ok(Vec::new()),
        Value::Table(t) => t,
        other => {
            return Err(bad(
                who,
                format!(
                    "sources must be a list of functions, not {}",
                    other.type_name()
                ),
            ));
        }
    };
    // `sources = { watch_folder = f }`: the named entries were no sources at all, nothing ran,
    // and the program ended 0 without a word.
    let len = list.raw_len();
    for pair in list.pairs::<Value, Value>() {
        let (k, _) = pair?;
        let listed = matches!(k, Value::Integer(i) if i >= 1 && (i as usize) <= len);
        if !listed {
            let key = super::convert::show_key(&k);
            return Err(misuse(format!(
                "{who}: sources must be a list of functions ({{ f, g }}), not a table with key \
                 {key}"
            )));
        }
    }
    let mut sources = Vec::new();
    for (i, v) in list.sequence_values::<Value>().enumerate() {
        let at = format!("{who}: sources[{}]", i + 1);
        match v? {
            Value::Function(func) => sources.push(Source {
                func: bridge::register(lua, func),
                policy: RestartPolicy::new(Restart::Transient),
            }),
            Value::Table(t) => {
                for pair in t.pairs::<Value, Value>() {
                    let (k, _) = pair?;
                    let ok = match &k {
                        Value::Integer(1) => true,
                        Value::String(s) => {
                            matches!(
                                s.to_string_lossy().as_str(),
                                "restart" | "max_restarts" | "restart_window_ms"
                            )
                        }
                        _ => false,
                    };
                    if !ok {
                        return Err(misuse(format!(
                            "{at}: a source table is {{ function, restart?, max_restarts?, restart_window_ms? }}"
                        )));
                    }
                }
                let func: Function = t
                    .get(1)
                    .map_err(|_| misuse(format!("{at}: the first entry must be the function")))?;
                let policy = read_policy(&t, &at, Restart::Transient)?;
                sources.push(Source {
                    func: bridge::register(lua, func),
                    policy,
                });
            }
            other => {
                return Err(misuse(format!(
                    "{at} must be a function, not {}",
                    other.type_name()
                )));
            }
        }
    }
    Ok(sources)
}

/// The names of the tools an `ai.spawn` table lists (tool values, definitions, or names).
pub(super) fn own_tool_names(opts: &Table) -> std::collections::HashSet<String> {
    use mlua::ObjectLike;
    let Ok(Value::Table(tools)) = opts.get::<Value>("tools") else {
        return Default::default();
    };
    tools
        .sequence_values::<Value>()
        .flatten()
        .filter_map(|v| match v {
            Value::String(s) => Some(s.to_string_lossy()),
            Value::Table(t) => t.get::<Option<String>>("name").ok().flatten(),
            Value::UserData(u) => u.get::<Option<String>>("name").ok().flatten(),
            _ => None,
        })
        .collect()
}
