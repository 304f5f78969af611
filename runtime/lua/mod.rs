//! The Lua host: one VM per program, on its own OS thread.
//!
//! The VM lives on a current-thread tokio runtime inside a `LocalSet`, because an mlua VM is not
//! `Send`. A script's own model calls (`ai.ask`) are driven on that runtime, with a connection
//! pool of its own: they are I/O-bound, and crossing to the core's multi-thread runtime and back
//! cost two thread wake-ups per call (measured: 1.49x a bare reqwest call instead of 1.10x). Only
//! the calling coroutine waits, so the script reads as if it were synchronous while others run.
//! Work that belongs to the core (residents) stays on the core and reaches the VM by message
//! ([`bridge`]). Each Lua module registers itself from its own file (`ai` in `ai`, `tools`,
//! `turn`, `structured`, `parallel`, `middleware` and `residents`; `json`, `http`, `fs`, `store`, `mcp`; `term` for front ends on a terminal;
//! `colony` for what a script may know of colony itself).
//!
//! Lua cannot wait inside a `table.sort` comparator or a `string.gsub` callback (the C functions
//! calling them cannot yield): calling `ai.ask` there fails with "attempt to yield across a
//! C-call boundary". Compute first, then sort.

pub mod ai;
pub mod bridge;
pub mod colony;
pub mod convert;
pub mod fields;
pub mod files;
pub mod fs;
pub mod http;
pub mod json;
pub mod mcp;
pub mod mcp_ask;
pub mod mcp_client;
pub mod mcp_export;
pub mod messages;
pub mod middleware;
pub mod options;
pub mod parallel;
pub mod proc;
pub mod resident_spec;
pub mod residents;
pub mod sandbox;
pub mod store;
pub mod structured;
pub mod term;
pub mod thrown;
pub mod tools;
pub mod turn;
pub mod watchdog;

use std::path::{Path, PathBuf};

use mlua::{Function, Lua, LuaOptions, MultiValue, StdLib, Table, Value};

use crate::core::Core;
use crate::residents::{Lifecycle, Route};
use crate::script::Fault;

pub use residents::HostSetup;

/// The Lua memory a program may hold when its host does not say (`--max-memory`): 1 GiB.
pub const DEFAULT_MAX_MEMORY: usize = 1 << 30;

/// A script that failed: the message is already in `file:line: message` form with its traceback.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ScriptError(pub String);

/// Runs the script at `path` with `args` (visible as `arg` and `...`), to completion.
pub fn run_file(core: Core, path: &Path, args: Vec<String>) -> Result<(), ScriptError> {
    start_file(core, path, args, HostSetup::default())?.join()
}

/// Runs Lua source under the chunk name `name` on a fresh VM thread and waits for it. The source
/// is not a file: relative paths in `fs.*` resolve against the current directory.
pub fn run_source(
    core: Core,
    name: &str,
    source: Vec<u8>,
    args: Vec<String>,
) -> Result<(), ScriptError> {
    run_source_with(core, name, source, args, HostSetup::default())
}

/// [`run_source`] with what the host lends the program (a front end's own store, say).
pub fn run_source_with(
    core: Core,
    name: &str,
    source: Vec<u8>,
    args: Vec<String>,
    host: HostSetup,
) -> Result<(), ScriptError> {
    start(core, name, source, args, None, host)?.join()
}

/// A program running on its own Lua thread.
pub struct Running {
    /// The program's life: mail its residents, list them, stop it (what `colony run` and an
    /// embedding application drive).
    pub lifecycle: Lifecycle,
    thread: std::thread::JoinHandle<Result<(), ScriptError>>,
}

impl Running {
    /// The route the program's residents live on.
    pub fn route(&self) -> &Route {
        self.lifecycle.route()
    }

    /// Waits for the script to end (blocking the calling thread).
    pub fn join(self) -> Result<(), ScriptError> {
        self.thread
            .join()
            .unwrap_or_else(|_| Err(ScriptError("the Lua thread panicked".into())))
    }

    pub fn is_finished(&self) -> bool {
        self.thread.is_finished()
    }
}

/// The most of a program's source that is read: a file past it (`/dev/zero`, a log given by
/// mistake) is refused, not read until memory runs out.
pub const MAX_SOURCE: u64 = 64 << 20;

/// The text of the program at `path`, up to [`MAX_SOURCE`].
fn read_source(path: &Path) -> Result<Vec<u8>, ScriptError> {
    use std::io::Read;
    let cannot = |why: String| ScriptError(format!("cannot read {}: {why}", path.display()));
    let file = std::fs::File::open(path).map_err(|e| cannot(e.to_string()))?;
    let mut source = Vec::new();
    file.take(MAX_SOURCE + 1)
        .read_to_end(&mut source)
        .map_err(|e| cannot(e.to_string()))?;
    if source.len() as u64 > MAX_SOURCE {
        return Err(cannot(format!(
            "over {} MiB, more than a program's source",
            MAX_SOURCE >> 20
        )));
    }
    Ok(without_preamble(source))
}

/// The source without what Lua's own file loader (`luaL_loadfilex`, which `require` uses)
/// skips: a UTF-8 byte-order mark, and a first line beginning `#` (`#!/usr/bin/env -S colony
/// run`, so a script can be run as a command). The line's newline stays, so line numbers are
/// the file's. Both were syntax errors at line 1.
fn without_preamble(mut source: Vec<u8>) -> Vec<u8> {
    if source.starts_with(b"\xEF\xBB\xBF") {
        source.drain(..3);
    }
    if source.first() == Some(&b'#') {
        let end = source
            .iter()
            .position(|&b| b == b'\n')
            .unwrap_or(source.len());
        source.drain(..end);
    }
    source
}

/// Whether the script at `path` reads and compiles, without running any of it: `Err` says why
/// as a run would (`file:line: message`). What a host checks before it replaces a run that works
/// with the file's new text.
pub fn compiles(path: &Path) -> Result<(), ScriptError> {
    let source = read_source(path)?;
    let lua = Lua::new();
    lua.load(source.as_slice())
        .set_name(format!("@{}", path.display()))
        .into_function()
        .map(drop)
        .map_err(|e| ScriptError(plain(&e)))
}

/// Starts the script at `path` on its own thread with what `host` lends it, and returns once
/// its VM is built (the script then runs on).
pub fn start_file(
    core: Core,
    path: &Path,
    args: Vec<String>,
    host: HostSetup,
) -> Result<Running, ScriptError> {
    let source = read_source(path)?;
    // Relative paths in `fs.*` resolve against the script's folder, wherever colony was started.
    let dir = std::path::absolute(path)
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf));
    start(core, &path.display().to_string(), source, args, dir, host)
}

/// `require` looks in the script's folder first (`DIR/?.lua`, `DIR/?/init.lua`): Lua's own
/// path begins with the current directory, so a script run from elsewhere (`colony run
/// proj/main.lua`, a service's working directory) did not find its modules, or found another
/// folder's file of the same name. A folder whose name holds `;` or `?`, which a path cannot
/// carry, is left out.
fn modules_from(lua: &Lua, dir: &std::path::Path) -> mlua::Result<()> {
    let dir = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
    let Some(dir) = dir.to_str().filter(|d| !d.contains([';', '?'])) else {
        return Ok(());
    };
    let package: Table = lua.globals().get("package")?;
    let path: String = package.get("path")?;
    let dir = dir.trim_end_matches('/');
    package.set("path", format!("{dir}/?.lua;{dir}/?/init.lua;{path}"))
}

/// The Lua thread's stack.
const LUA_STACK: usize = 16 << 20;

fn start(
    core: Core,
    name: &str,
    source: Vec<u8>,
    args: Vec<String>,
    dir: Option<PathBuf>,
    host: HostSetup,
) -> Result<Running, ScriptError> {
    let name = name.to_string();
    let (life_tx, life_rx) = std::sync::mpsc::channel();
    let thread = std::thread::Builder::new()
        .name("colony-lua".into())
        // A tool that calls itself, or ai.parallel inside ai.parallel, nests Rust frames (about
        // 20 KB a level in a debug build) between the Lua ones: with the default 2 MiB the
        // stack overflowed at about a hundred levels and the process aborted, before Lua's own
        // limit of 200 nested C calls ("C stack overflow", an error pcall catches) was reached.
        // Only the pages touched are ever mapped.
        .stack_size(LUA_STACK)
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| ScriptError(format!("cannot start the Lua thread's runtime: {e}")))?;
            let local = tokio::task::LocalSet::new();
            let launch = Launch {
                core,
                name,
                source,
                args,
                dir,
                host,
            };
            let ended = local.block_on(&rt, run_on_this_thread(launch, life_tx));
            drop(local);
            // A blocking call the program was ended in (`fs.read` of a FIFO nobody writes, of
            // a stdin nobody closes) is left to the process's end: dropped, the runtime waits
            // for its blocking tasks, and this thread, and so the run, never ended.
            rt.shutdown_background();
            ended
        })
        .map_err(|e| ScriptError(format!("cannot start the Lua thread: {e}")))?;
    match life_rx.recv() {
        Ok(lifecycle) => Ok(Running { lifecycle, thread }),
        // The VM could not be built: the thread says why.
        Err(_) => Err(thread
            .join()
            .unwrap_or_else(|_| Err(ScriptError("the Lua thread panicked".into())))
            .err()
            .unwrap_or_else(|| ScriptError("the Lua thread ended early".into()))),
    }
}

/// What a program is started from: its source, its arguments and what the host lends it.
struct Launch {
    core: Core,
    name: String,
    source: Vec<u8>,
    args: Vec<String>,
    dir: Option<PathBuf>,
    host: HostSetup,
}

/// Builds a program's VM with colony's modules registered. The returned jobs must be served
/// ([`bridge::serve`]) on the VM's thread for tools and callbacks to run.
pub fn new_vm(core: Core) -> mlua::Result<(Lua, bridge::LuaJobs)> {
    new_vm_with(core, &HostSetup::default())
}

/// [`new_vm`] with what an embedding application lends the program.
pub fn new_vm_with(core: Core, host: &HostSetup) -> mlua::Result<(Lua, bridge::LuaJobs)> {
    let lua = Lua::new_with(StdLib::ALL_SAFE, LuaOptions::default())?;
    let memory = host.max_memory.unwrap_or(DEFAULT_MAX_MEMORY);
    lua.set_memory_limit(memory)?;
    lua.set_app_data(convert::MemoryLimit(memory));
    watchdog::install(&lua, host.interrupt.clone())?;
    thrown::install(&lua)?;
    lua.set_app_data(core.with_own_client());
    lua.set_app_data(bridge::Functions::default());
    let (bridge, jobs) = bridge::channel();
    let given = host.store.clone().or_else(|| {
        host.store_opening
            .clone()
            .map(|s| s as std::sync::Arc<dyn crate::store::Store>)
    });
    let durable = given.is_some();
    let store =
        given.unwrap_or_else(|| std::sync::Arc::new(crate::store::memory::MemoryStore::new()));
    lua.set_app_data(store::ProgramStore(store.clone()));
    // Only a store the program opened (on disk) gains from a shared transaction; the in-memory
    // default an embedding gets writes each line at once.
    if durable {
        lua.set_app_data(turn::ScriptAudit(
            crate::store::audit_batch::AuditBatch::new(store.clone()),
        ));
    }
    // Residents call models from the core's runtime, on its shared pool.
    let route = Route::with_store(core, bridge.clone(), Some(store));
    if let Some(observer) = &host.observer {
        route.set_observer(observer.clone());
    }
    if let Some(placement) = &host.placement {
        route.set_placement(placement.clone());
    }
    lua.set_app_data(Lifecycle::new(route, host.mails_in));
    lua.set_app_data(resident_spec::RouteDefaults::new(host.deliveries.clone()));
    lua.set_app_data(residents::HostTools(
        host.tools
            .iter()
            .map(|t| (t.spec.name.clone(), t.clone()))
            .collect(),
    ));
    lua.set_app_data(bridge);
    if let Some(exports) = &host.exports {
        lua.set_app_data(exports.clone());
    }
    guard_coroutines(&lua)?;
    let json = json::register(&lua)?;
    let ai = ai::register(&lua)?;
    tools::register(&lua, &ai)?;
    turn::register(&lua, &ai)?;
    structured::register(&lua, &ai)?;
    parallel::register(&lua, &ai)?;
    middleware::register(&lua, &ai)?;
    residents::register(&lua, &ai)?;
    let http = http::register(&lua)?;
    let fs = fs::register(&lua)?;
    let proc = proc::register(&lua)?;
    proc::replace_os_execute(&lua)?;
    proc::replace_os_exit(&lua)?;
    let store = store::register(&lua)?;
    let term = term::register(&lua)?;
    let colony = colony::register(&lua)?;
    let mcp = mcp::register(&lua)?;
    let globals = lua.globals();
    globals.set("term", term.clone())?;
    globals.set("colony", colony.clone())?;
    globals.set("mcp", mcp.clone())?;
    globals.set("store", store.clone())?;
    globals.set("json", json.clone())?;
    globals.set("ai", ai.clone())?;
    globals.set("http", http.clone())?;
    globals.set("fs", fs.clone())?;
    globals.set("proc", proc.clone())?;
    // `require("json")`, `require("ai")`, `require("http")`, `require("fs")` and
    // `require("data").json` find the built-in modules.
    let preload: Table = globals.get::<Table>("package")?.get("preload")?;
    let data = lua.create_table()?;
    data.set("json", json)?;
    preload.set("data", constant(&lua, data)?)?;
    preload.set("json", constant(&lua, globals.get::<Value>("json")?)?)?;
    preload.set("ai", constant(&lua, globals.get::<Value>("ai")?)?)?;
    preload.set("http", constant(&lua, http)?)?;
    preload.set("fs", constant(&lua, fs)?)?;
    preload.set("proc", constant(&lua, proc)?)?;
    preload.set("store", constant(&lua, store)?)?;
    preload.set("term", constant(&lua, term)?)?;
    preload.set("colony", constant(&lua, colony)?)?;
    preload.set("mcp", constant(&lua, mcp)?)?;
    // Last, so the wrappers wrap the standard library as the script will find it.
    sandbox::install(&lua, host.permissions.clone())?;
    Ok((lua, jobs))
}

/// A script's own coroutines cannot carry a wait: colony's waiting functions suspend the
/// coroutine that runs the script, and a coroutine the script made would instead receive
/// mlua's internal "pending" marker as if it were a yielded value. `coroutine.resume` and
/// `coroutine.wrap` are wrapped to turn that into a clear error that names the way to do it.
fn guard_coroutines(lua: &Lua) -> mlua::Result<()> {
    let guard: Function = lua
        .load(
            r#"
local pending, enter, leave, is_stop, caught = ...
local resume, create, error = coroutine.resume, coroutine.create, error
local message = "ai.* and other waiting calls cannot run inside a coroutine the script created: "
  .. "use ai.parallel(f1, f2, ...) to run work concurrently"
local function checked(co, ok, first, ...)
  leave(co)
  if not ok and is_stop(first) then error(first, 0) end
  if ok and first == pending then return false, message end
  if not ok then return false, caught(first) end
  return ok, first, ...
end
coroutine.resume = function(co, ...)
  enter(co)
  return checked(co, resume(co, ...))
end
coroutine.wrap = function(f)
  local co = create(f)
  return function(...)
    enter(co)
    local results = table.pack(checked(co, resume(co, ...)))
    if not results[1] then error(results[2], 2) end
    return table.unpack(results, 2, results.n)
  end
end
"#,
        )
        .set_name("=colony.coroutine")
        .into_function()?;
    // The watchdog sets its hook on a coroutine the script made only while it is resumed.
    let (enter, leave) = watchdog::resume_marks(lua)?;
    guard.call::<()>((
        Value::LightUserData(Lua::poll_pending()),
        enter,
        leave,
        watchdog::is_stop(lua)?,
        watchdog::caught(lua)?,
    ))
}

/// A `package.preload` loader that returns `value`.
fn constant(lua: &Lua, value: impl mlua::IntoLua) -> mlua::Result<Function> {
    let value = value.into_lua(lua)?;
    lua.create_function(move |_, ()| Ok(value.clone()))
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn run_on_this_thread(
    launch: Launch,
    lifecycle_out: std::sync::mpsc::Sender<Lifecycle>,
) -> Result<(), ScriptError> {
    let Launch {
        core,
        name,
        source,
        args,
        dir,
        host,
    } = launch;
    let (lua, jobs) = new_vm_with(core, &host)
        .map_err(|e| ScriptError(format!("cannot build the Lua VM: {e}")))?;
    // The store opened beside the VM: nothing of the script runs before it is open, or at all
    // if it cannot be.
    if let Some(opening) = &host.store_opening {
        opening.wait().map_err(|e| ScriptError(e.to_string()))?;
    }
    if let Some(dir) = dir {
        modules_from(&lua, &dir).map_err(|e| ScriptError(plain(&e)))?;
        lua.set_app_data(fs::ScriptDir(dir));
    }
    let lifecycle = residents::lifecycle(&lua);
    if let Some(exports) = &host.exports {
        lifecycle.serve_exports(exports.clone());
    }
    if host.leaves_signals {
        lua.set_app_data(residents::SignalsLeft);
    } else if host.signals_from_start {
        residents::listen_for_signals(&lua);
    }
    let _ = lifecycle_out.send(lifecycle.clone());
    drop(lifecycle_out);
    // However the script ends, its program stops: a host waiting for the watch to open (or for
    // it to end) learns that it never will.
    struct StopOnEnd(Lifecycle);
    impl Drop for StopOnEnd {
        fn drop(&mut self) {
            self.0.script_ended();
        }
    }
    let _stop_on_end = StopOnEnd(lifecycle.clone());
    tokio::task::spawn_local(bridge::serve(lua.clone(), jobs));
    let setup = || -> mlua::Result<(Function, Function, Function, MultiValue)> {
        let arg = lua.create_table()?;
        arg.set(0, name.as_str())?;
        for (i, a) in args.iter().enumerate() {
            arg.set(i + 1, a.as_str())?;
        }
        lua.globals().set("arg", arg)?;
        let varargs = args
            .iter()
            .map(|a| lua.create_string(a).map(Value::String))
            .collect::<mlua::Result<MultiValue>>()?;
        let runner: Function = lua
            .load("local main, handler = ... return xpcall(main, handler, select(3, ...))")
            .set_name("=colony")
            .into_function()?;
        let handler = lua.create_function(|lua, err: Value| {
            let err = thrown::recovered(lua, err);
            let message = positioned(lua, &err);
            let trace = lua.traceback(Some(&message), 1)?;
            Ok(tidy_traceback(&trace.to_string_lossy()))
        })?;
        let main = lua
            .load(source.as_slice())
            .set_name(format!("@{name}"))
            .into_function()?;
        Ok((runner, main, handler, varargs))
    };
    let (runner, main, handler, varargs) = setup().map_err(|e| ScriptError(plain(&e)))?;
    let mut call_args = MultiValue::new();
    call_args.push_back(Value::Function(main));
    call_args.push_back(Value::Function(handler));
    call_args.extend(varargs);
    // The main chunk has no deadline, but a stop asked while it spins ends it, and one that
    // abandons the program ends it wherever it waits.
    let interrupt = lua.app_data_ref::<watchdog::Interrupt>().map(|i| i.clone());
    // A host that ends the program (`Route::abandon`) ends it as a signal does: from the core's
    // runtime, since this thread may be spinning in Lua code.
    let _host_abandons = interrupt.clone().map(|interrupt| {
        let route = lifecycle.route().clone();
        let task = route.core().handle().clone().spawn(async move {
            let why = route.abandoned().await;
            interrupt.abandon(&why);
        });
        AbortOnDrop(task.abort_handle())
    });
    let chunk = watchdog::guarded(
        &lua,
        watchdog::Limit::default(),
        runner.call_async::<MultiValue>(call_args),
    );
    let result = match interrupt {
        // The end first: a turn whose tool the end stopped is done by the next poll, and
        // polled first the chunk went on with its empty result (the line after `ai.run`)
        // before it was dropped.
        Some(interrupt) => tokio::select! {
            biased;
            why = interrupt.abandoned() => {
                return Err(ScriptError(format!("colony: the program was ended by {why}")));
            }
            result = chunk => result,
        },
        None => chunk.await,
    };
    // A program served over MCP keeps answering calls after its main chunk returns, until
    // it is stopped. One whose chunk failed is never ready: a client's lists wait for its
    // route to stop instead, and nobody is told it exports nothing.
    // (The runner answers `true` and the chunk's values, or `false` and its error.)
    let returned = matches!(
        result.as_ref().map(|v| v.front()),
        Ok(Some(Value::Boolean(true)))
    );
    if let (Some(exports), true) = (&host.exports, returned) {
        exports.set_ready();
    }
    // Residents hired and never run: the script ended without `ai.watch`, so no source ran
    // and no mail was served, and the run ended with 0 and no word.
    if returned && !host.linger {
        let waiting = lifecycle.awaiting_watch();
        if !waiting.is_empty() {
            tracing::warn!(
                "the script ended without calling ai.watch: {} spawned and never ran ({}); \
                 ai.watch() runs them",
                if waiting.len() == 1 {
                    "1 resident was".to_string()
                } else {
                    format!("{} residents were", waiting.len())
                },
                waiting.join(", ")
            );
        }
    }
    if host.linger && host.exports.as_ref().is_some_and(|e| !e.is_empty()) && returned {
        lifecycle.stopped().await;
        lifecycle.finish_calls().await;
    }
    // A short script's audit log is pruned all the same (`[store] keep_audit`).
    lifecycle.first_prune().await;
    // The MCP servers the program kept open are shut down in order, not killed.
    lifecycle.close_servers().await;
    let result = result.map_err(|e| ScriptError(plain(&e)))?;
    let mut values = result.into_iter();
    match values.next() {
        Some(Value::Boolean(true)) => Ok(()),
        // Out of memory in the main chunk said "not enough memory", not which limit.
        _ => Err(ScriptError(match values.next() {
            Some(other) => memory_or(&other),
            None => "the script failed".into(),
        })),
    }
}

/// What Lua says when an allocation fails (the program is at `--max-memory`).
const LUA_OUT_OF_MEMORY: &str = "not enough memory";
/// What colony says instead.
const OUT_OF_MEMORY: &str = "memory: the program's Lua memory reached its limit (--max-memory)";

/// The text of an error Lua raised without a message handler: a memory error named as such,
/// anything else as [`describe_error`] says it.
fn memory_or(err: &Value) -> String {
    match err {
        Value::Error(e) if matches!(**e, mlua::Error::MemoryError(_)) => OUT_OF_MEMORY.into(),
        Value::String(s) if s.as_bytes() == LUA_OUT_OF_MEMORY.as_bytes() => OUT_OF_MEMORY.into(),
        other => describe_error(other),
    }
}

/// The text of a Lua error value: strings as they are, colony's error tables as `kind: message`.
pub fn describe_error(err: &Value) -> String {
    match err {
        Value::String(s) => s.to_string_lossy(),
        Value::Table(t) => {
            let kind: Option<String> = t.get("kind").ok();
            let message: Option<String> = t.get("message").ok();
            match (kind, message) {
                (Some(k), Some(m)) => format!("{k}: {m}"),
                (None, Some(m)) => m,
                // `nil, { kind = "not_found" }`: its kind is what it says.
                (Some(k), None) => k,
                // An error object of the script's own says itself through `__tostring`; any
                // other table is shown as JSON (`nil, { code = 28 }` read "(error table
                // without a message)").
                _ => own_tostring(err).unwrap_or_else(|| {
                    serde_json::to_string(err)
                        .unwrap_or_else(|_| "(error table without a message)".into())
                }),
            }
        }
        Value::Error(e) => cause(e),
        Value::Nil => "nil".into(),
        // `nil, 42`: the number itself (it read "(error value of type integer)").
        Value::Integer(_) | Value::Number(_) | Value::Boolean(_) => {
            err.to_string().unwrap_or_else(|_| err.type_name().into())
        }
        other => format!("(error value of type {})", other.type_name()),
    }
}

/// Whether `err` is a table that says nothing of itself (no `kind`, no `message`, no
/// `__tostring`): raised, it is told as `a table was thrown: {...}`.
fn bare_table(err: &Value) -> bool {
    let Value::Table(t) = err else {
        return false;
    };
    t.get::<Option<Value>>("kind").ok().flatten().is_none()
        && t.get::<Option<Value>>("message").ok().flatten().is_none()
        && own_tostring(err).is_none()
}

/// What a table says of itself through its `__tostring`, if it has one.
fn own_tostring(value: &Value) -> Option<String> {
    match value {
        Value::Table(_) => value.to_string().ok().filter(|s| !s.starts_with("table: ")),
        _ => None,
    }
}

/// The innermost message of an error raised through Rust callbacks, without mlua's traceback
/// (the host adds its own).
fn cause(e: &mlua::Error) -> String {
    match e {
        mlua::Error::CallbackError { cause: inner, .. } => cause(inner),
        other => plain(other),
    }
}

/// The text of an error value being raised, in `file:line: message` form: an error raised by a
/// Rust function carries no position, so it gets the script line that called it, as Lua does for
/// its own errors. Call it from a message handler (the stack is still the raiser's).
fn positioned(lua: &Lua, err: &Value) -> String {
    let message = describe_error(err);
    if bare_table(err) {
        return format!("a table was thrown: {message}");
    }
    match err {
        Value::Error(_) => match calling_line(lua) {
            Some(at) => format!("{at}: {message}"),
            None => message,
        },
        _ => message,
    }
}

/// A message handler for `xpcall` around a script's function that the core called (a tool
/// handler): it returns `{ err, message = "file:line: ...", traceback = "stack traceback:..." }`,
/// the raised value kept as it is (a thrown table stays a table).
fn traced_handler(lua: &Lua) -> mlua::Result<Function> {
    lua.create_function(|lua, err: Value| {
        let err = thrown::recovered(lua, err);
        let t = lua.create_table()?;
        t.set("message", positioned(lua, &err))?;
        let trace = lua.traceback(None, 1)?;
        t.set("traceback", tidy_traceback(&trace.to_string_lossy()))?;
        t.set(1, err)?;
        Ok(t)
    })
}

/// What a script's function called from Rust raised, as a [`Fault`]: `file:line: message` (an
/// error from one of colony's functions gets the line of the script that called it, read from
/// the traceback mlua took where it was raised) and the script's frames of the traceback.
pub fn fault(e: &mlua::Error) -> Fault {
    let spun = matches!(watchdog::Stop::of(e), Some(watchdog::Stop::Deadline(_)));
    Fault { spun, ..raised(e) }
}

/// [`fault`]'s message and traceback.
fn raised(e: &mlua::Error) -> Fault {
    // The innermost callback error was raised nearest to the script.
    let mut e = e;
    let mut trace: Option<&str> = None;
    while let mlua::Error::CallbackError { cause, traceback } = e {
        trace = Some(traceback);
        e = cause;
    }
    match e {
        // A Lua error: its message has its position, mlua appended the traceback.
        mlua::Error::RuntimeError(m) if m.contains("\nstack traceback:") => {
            let (message, rest) = m.split_once("\nstack traceback:").unwrap_or((m, ""));
            Fault {
                message: message.to_string(),
                traceback: Some(tidy_traceback(&format!("stack traceback:{rest}"))),
                during: None,
                spun: false,
            }
        }
        other => {
            let message = plain(other);
            let Some(trace) = trace else {
                return Fault::from(message);
            };
            let trace = tidy_traceback(trace);
            let message = match first_script_frame(&trace) {
                Some(at) => format!("{at}: {message}"),
                None => message,
            };
            Fault {
                message,
                traceback: Some(trace),
                during: None,
                spun: false,
            }
        }
    }
}

/// `file:line` of the first frame of a (tidied) traceback that is the script's own.
fn first_script_frame(trace: &str) -> Option<String> {
    trace.lines().skip(1).find_map(|l| {
        let l = l.trim_start();
        let (at, _) = l.split_once(": in ")?;
        let (file, line) = at.rsplit_once(':')?;
        (!file.starts_with('[') && !line.is_empty() && line.bytes().all(|b| b.is_ascii_digit()))
            .then(|| at.to_string())
    })
}

/// `file:line` of the innermost Lua frame of the script (not colony's own chunks).
fn calling_line(lua: &Lua) -> Option<String> {
    (1..64).find_map(|level| {
        lua.inspect_stack(level, |d| {
            let src = d.source();
            let short = src.short_src?.to_string();
            let line = d.current_line()?;
            // colony's own chunks are named `=colony...` (the runner, the watchdog's `pcall`).
            let own = src
                .source
                .as_deref()
                .is_some_and(|s| s.starts_with("=colony"));
            (src.what != "C" && !own && short != "colony" && !short.starts_with("__mlua"))
                .then(|| format!("{short}:{line}"))
        })
        .flatten()
    })
}

/// Drops the frames colony itself adds (the runner chunk, `xpcall`, mlua's async poll loop), so
/// a traceback shows the script's own frames.
fn tidy_traceback(trace: &str) -> String {
    // The watchdog's `pcall` and `xpcall` end in a tail call: its marker goes with them.
    let mut dropped = false;
    trace
        .lines()
        .filter(|l| {
            let l = l.trim_start();
            let own = l.starts_with("[C]: in function 'xpcall'")
                || l.starts_with("colony:")
                || l.starts_with("colony.tool:")
                || l.starts_with("colony.watchdog:")
                || l.starts_with("colony.sandbox:")
                || l.starts_with("colony.coroutine:")
                || l.starts_with("[C]: in upvalue 'raw_xpcall'")
                || l.starts_with("[C]: in upvalue 'raw_pcall'")
                || l.starts_with("__mlua_async_poll")
                // mlua's index chunk, which calls a value's own `__index` for a field it lacks.
                || l.starts_with("__mlua_index")
                || l.starts_with("[C]: in upvalue '__index'")
                || l.starts_with("[C]: in local 'poll'")
                || l.starts_with("[C]: in upvalue 'get_future'")
                || l.starts_with("[C]: in ?")
                || (dropped && l == "(...tail calls...)");
            dropped = own;
            !own
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// What a Lua function called from Rust raised, as one message: the text of `error("...")` with
/// its position, without the traceback mlua appends to errors that crossed a Rust callback.
pub fn raised_message(e: &mlua::Error) -> String {
    match e {
        mlua::Error::CallbackError { cause, .. } => raised_message(cause),
        mlua::Error::WithContext { context, cause } => {
            format!("{context}: {}", raised_message(cause))
        }
        mlua::Error::RuntimeError(m) => match m.split_once("\nstack traceback:") {
            Some((message, _)) => message.to_string(),
            None => m.clone(),
        },
        other => plain(other),
    }
}

/// mlua's errors as a person wants to read them: the Lua message, without Rust wrapping.
pub fn plain(e: &mlua::Error) -> String {
    match e {
        mlua::Error::SyntaxError { message, .. } => message.clone(),
        mlua::Error::RuntimeError(m) => m.clone(),
        mlua::Error::CallbackError { cause, traceback } => {
            format!("{}\n{traceback}", plain(cause))
        }
        mlua::Error::WithContext { context, cause } => format!("{context}: {}", plain(cause)),
        mlua::Error::MemoryError(_) => OUT_OF_MEMORY.into(),
        other => other.to_string(),
    }
}
