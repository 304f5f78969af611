//! Lua code that never waits cannot freeze the program.
//!
//! The VM runs on one thread, so a tool handler spinning in a loop holds every other script
//! function of its program, and no timer or signal handler on that thread can run to stop it. An
//! instruction-count hook (every [`EVERY`] instructions) looks at the callback that is running:
//! each callback the core starts (a tool handler, a source, a `deliver_to`, a hook) runs
//! [`guarded`] with its [`Limit`], and the hook stops it with a [`Stop`] error once that limit is
//! passed. A tool is stopped at its own deadline (its `timeout`), or at once when its caller gave
//! up; any other callback once it has run [`MAX_SLICE`] without waiting. When the process is
//! told to stop ([`Interrupt`], SIGINT or SIGTERM), Lua code that runs [`INTERRUPT_GRACE`]
//! without waiting is stopped from then on: the main chunk too.
//!
//! A [`Stop`] cannot be caught: `pcall` and `xpcall` are wrapped to raise it again, so a
//! handler that wraps its loop in `pcall` is still stopped.

use std::cell::RefCell;
use std::future::Future;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mlua::{Function, HookTriggers, Lua, Value, VmState};

/// How often the hook looks, in VM instructions (about 10 to 50 µs of Lua work).
const EVERY: u32 = 1000;
/// The longest a callback without a deadline of its own (a source, a `deliver_to`, a hook) may
/// run without waiting.
pub const MAX_SLICE: Duration = Duration::from_secs(10);
/// How long Lua code that was running when the stop was asked may go on before it is stopped.
pub const INTERRUPT_GRACE: Duration = Duration::from_millis(500);

/// What a callback may do before it is stopped.
#[derive(Default)]
pub struct Limit {
    /// Stopped at this instant, waiting or not (a tool's deadline).
    pub deadline: Option<Instant>,
    /// Stopped once it has run this long without waiting.
    pub slice: Option<Duration>,
    /// Stopped as soon as this answers true (its caller gave up).
    pub abandoned: Option<Box<dyn Fn() -> bool>>,
}

impl Limit {
    /// A callback with no deadline of its own.
    pub fn callback() -> Limit {
        Limit {
            slice: Some(MAX_SLICE),
            ..Limit::default()
        }
    }
}

/// Why the hook stopped Lua code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Stop {
    /// Past its deadline, or too long without waiting.
    #[error("deadline: {0}")]
    Deadline(String),
    /// The process was told to stop.
    #[error("interrupted: the program is stopping ({0}) and this code did not wait")]
    Interrupted(String),
}

impl Stop {
    /// The stop `e` carries, if it is one.
    pub fn of(e: &mlua::Error) -> Option<&Stop> {
        e.downcast_ref::<Stop>()
    }
}

/// The process's request to stop, shared between the signal handler and the VM's hook.
#[derive(Clone, Default)]
pub struct Interrupt(Arc<Mutex<Option<(Instant, String)>>>);

impl Interrupt {
    /// Asks Lua code that is running (and not waiting) to stop; `why` names the signal.
    pub fn raise(&self, why: &str) {
        let mut at = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if at.is_none() {
            *at = Some((Instant::now(), why.to_string()));
        }
    }

    fn raised(&self) -> Option<(Instant, String)> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// The callback the VM's thread is polling, and when this poll began.
struct Running {
    since: Instant,
    limit: Rc<Limit>,
}

thread_local! {
    static RUNNING: RefCell<Option<Running>> = const { RefCell::new(None) };
}

/// Runs `work` under `limit`: while it is polled, the hook holds it to that limit.
pub async fn guarded<F: Future>(limit: Limit, work: F) -> F::Output {
    let limit = Rc::new(limit);
    let mut work = std::pin::pin!(work);
    std::future::poll_fn(move |cx| {
        let outer = RUNNING.replace(Some(Running {
            since: Instant::now(),
            limit: limit.clone(),
        }));
        let polled = work.as_mut().poll(cx);
        RUNNING.set(outer);
        polled
    })
    .await
}

/// Runs `work` as a callback without a deadline of its own (a source, a `deliver_to`, a hook):
/// stopped once it runs [`MAX_SLICE`] without waiting.
pub async fn as_callback<F: Future>(work: F) -> F::Output {
    guarded(Limit::callback(), work).await
}

/// Installs the hook on the VM (before any thread is made, so every coroutine has it) and makes
/// `pcall` and `xpcall` pass a [`Stop`] on.
pub fn install(lua: &Lua, interrupt: Interrupt) -> mlua::Result<()> {
    lua.set_app_data(interrupt.clone());
    // Only for the benches' with-and-without comparison (benches/README: the hook's cost): a VM
    // without the hook cannot stop code that spins, so nothing else reads this.
    if std::env::var_os("COLONY_BENCH_NO_WATCHDOG").is_none() {
        lua.set_global_hook(
            HookTriggers::new().every_nth_instruction(EVERY),
            move |_, _| check(&interrupt),
        )?;
    }
    let is_stop = lua.create_function(|_, v: Value| {
        Ok(matches!(v, Value::Error(e) if Stop::of(&e).is_some()))
    })?;
    let wrap: Function = lua
        .load(UNCATCHABLE)
        .set_name("=colony.watchdog")
        .into_function()?;
    wrap.call::<()>(is_stop)
}

fn check(interrupt: &Interrupt) -> mlua::Result<VmState> {
    let stop = RUNNING.with_borrow(|running| {
        let running = running.as_ref()?;
        let now = Instant::now();
        let limit = &running.limit;
        // Once the stop is asked, nothing may run long without waiting (a source that
        // crashes and restarts spinning included).
        if let Some((at, why)) = interrupt.raised()
            && now >= at + INTERRUPT_GRACE
            && now.duration_since(running.since) >= INTERRUPT_GRACE
        {
            return Some(Stop::Interrupted(why));
        }
        if limit.deadline.is_some_and(|d| now >= d) {
            return Some(Stop::Deadline(
                "it ran past its timeout without finishing".into(),
            ));
        }
        if limit.abandoned.as_ref().is_some_and(|gone| gone()) {
            return Some(Stop::Deadline(
                "its caller stopped waiting (the call's timeout)".into(),
            ));
        }
        if let Some(slice) = limit.slice
            && now.duration_since(running.since) >= slice
        {
            return Some(Stop::Deadline(format!(
                "it ran {} s without waiting (a callback may run at most {} s at a time)",
                slice.as_secs_f64(),
                slice.as_secs_f64()
            )));
        }
        None
    });
    match stop {
        Some(stop) => Err(mlua::Error::external(stop)),
        None => Ok(VmState::Continue),
    }
}

/// `pcall` and `xpcall` that raise a [`Stop`] again instead of returning it (an `xpcall`
/// handler does not see it either).
const UNCATCHABLE: &str = r#"
local is_stop = ...
local raw_pcall, raw_xpcall, error = pcall, xpcall, error
local function pass(ok, ...)
  if not ok and is_stop((...)) then error((...), 0) end
  return ok, ...
end
pcall = function(f, ...) return pass(raw_pcall(f, ...)) end
xpcall = function(f, handler, ...)
  return pass(raw_xpcall(f, function(e)
    if is_stop(e) then return e end
    return handler(e)
  end, ...))
end
"#;

/// Raises the VM's [`Interrupt`] on SIGINT and SIGTERM from a task on `runtime` (the VM's own
/// thread may be the one spinning), for as long as the returned guard lives. The watch starts
/// it: before a watch, a signal ends the process as it always did.
///
/// The route is told to stop first: a source the interrupt cuts short must find the program
/// stopping, or its restart policy would start it again before the watch hears the signal.
pub fn listen(
    lua: &Lua,
    runtime: &tokio::runtime::Handle,
    route: crate::residents::Route,
) -> Option<Listening> {
    let interrupt = lua.app_data_ref::<Interrupt>()?.clone();
    let task = runtime.spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            return;
        };
        loop {
            let why = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            };
            route.stop(why);
            interrupt.raise(why);
        }
    });
    Some(Listening(task.abort_handle()))
}

/// The signal listener of [`listen`]; dropping it ends the listener.
pub struct Listening(tokio::task::AbortHandle);

impl Drop for Listening {
    fn drop(&mut self) {
        self.0.abort();
    }
}
