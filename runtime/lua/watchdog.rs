//! Lua code that never waits cannot freeze the program.
//!
//! The VM runs on one thread, so a tool handler spinning in a loop holds every other script
//! function of its program, and no timer or signal handler on that thread can run to stop it.
//! Each callback the core starts (a tool handler, a source, a `deliver_to`, a hook, the main
//! chunk) runs [`guarded`] with its [`Limit`]. A tool is stopped at its own deadline (its
//! `timeout`), or at once when its caller gave up; any other callback once it has run
//! [`MAX_SLICE`] without waiting. When the process is told to stop ([`Interrupt`], SIGINT or
//! SIGTERM), Lua code that runs [`INTERRUPT_GRACE`] without waiting is stopped from then on.
//!
//! **The hook is set only when a stop is due.** While any instruction-count hook is set, Lua
//! 5.4 runs every instruction of the hooked coroutine through its hook check (its "trap" mode),
//! not only every [`EVERY`]th: Lua-heavy code ran twice as slow under a hook set for good
//! (benches/tool_roundtrip: a handler of 10,000 Lua steps, 289 µs against 145 µs). So a thread
//! of the VM's own, the watchdog, looks every [`TICK`] at what the VM's thread is running (the
//! callbacks being polled, and the coroutines they resumed, learnt from mlua's resume events and
//! from `coroutine.resume`), and when the innermost callback's stop is due it sets the hook on
//! those coroutines. The hook then stops the code within [`EVERY`] instructions, and is taken
//! off again when the poll ends. A stop comes at most one [`TICK`] late.
//!
//! Setting a hook from another thread while Lua runs is what `lua.c` does from its SIGINT
//! handler; Lua's source says `lua_sethook` "can be called during a signal, under 'reasonable'
//! assumptions", and its loops look for a hook set meanwhile at every jump. A hook is only ever
//! set on a coroutine that is kept alive meanwhile (pinned or being resumed), under the lock the
//! VM's thread takes to end a poll.
//!
//! A [`Stop`] cannot be caught: `pcall`, `xpcall` and `coroutine.resume` are wrapped to raise
//! it again, so a handler that wraps its loop in `pcall` is still stopped.

use std::cell::RefCell;
use std::collections::HashSet;
use std::ffi::CStr;
use std::future::Future;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use mlua::thread::{ThreadEvent, ThreadTriggers};
use mlua::{Function, Lua, Thread, Value, ffi};

/// How often the hook looks once it is set, in VM instructions (about 10 to 50 µs of Lua work).
const EVERY: i32 = 1000;
/// How often the watchdog looks at a VM that is running a callback: a stop is at most this late.
const TICK: Duration = Duration::from_millis(10);
/// After this many ticks with no callback running, the watchdog sleeps until one starts.
const IDLE_TICKS: u32 = 100;
/// Where the hook finds the function that raises the stop (the VM's registry).
const CHECK_KEY: &CStr = c"colony.watchdog.check";
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
    /// Stopped as soon as this answers true (its caller gave up). Asked from the watchdog's
    /// thread too.
    pub abandoned: Option<Box<dyn Fn() -> bool + Send + Sync>>,
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
pub struct Interrupt(Arc<Interrupted>);

#[derive(Default)]
pub struct Interrupted {
    raised: Mutex<Option<(Instant, String)>>,
    /// Set (under `raised`'s lock) once the watch has returned ([`Interrupt::lower`]): a stop
    /// asked for the watch comes too late to be raised.
    lowered: std::sync::atomic::AtomicBool,
    /// Set when the program is to end at once, whatever it waits for.
    abandoned: Mutex<Option<String>>,
    abandon: tokio::sync::Notify,
    /// `term.interruptible` calls running: SIGINT is theirs (it cancels the call), not the
    /// program's.
    sigint_taken: AtomicUsize,
    /// `term.interruptible` calls ended so far: one that a SIGINT did not end is seen as such.
    sigint_calls_ended: AtomicUsize,
    /// SIGINTs `term.interruptible` calls gave way to ([`SigintTaken::gave_way`]): the signal
    /// listener may hear one only after the call it cancelled has ended, and must not then take
    /// it for the program's.
    sigints_given_way: AtomicUsize,
    /// Set when a host asks the `term.interruptible` calls running to give way, naming the
    /// signal ([`Interrupt::end_interruptible`]).
    calls_ended: Mutex<Option<String>>,
    end_calls: tokio::sync::Notify,
}

impl Interrupt {
    /// Asks Lua code that is running (and not waiting) to stop; `why` names the signal.
    pub fn raise(&self, why: &str) {
        let mut at = self.0.raised.lock().unwrap_or_else(|e| e.into_inner());
        if at.is_none() {
            *at = Some((Instant::now(), why.to_string()));
        }
    }

    /// [`Interrupt::raise`] for a stop of the watch (a signal it heard, `--max-time` while it
    /// runs): not once the watch has returned ([`Interrupt::lower`]), whichever of the two runs
    /// first, so what the script does after its watch runs to its end.
    pub fn raise_for_watch(&self, why: &str) {
        let mut at = self.0.raised.lock().unwrap_or_else(|e| e.into_inner());
        if at.is_none() && !self.0.lowered.load(Ordering::Acquire) {
            *at = Some((Instant::now(), why.to_string()));
        }
    }

    fn raised(&self) -> Option<(Instant, String)> {
        self.0
            .raised
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Ends the program at once, code that waits too (an `ai.sleep`, a model call, a hook of
    /// the watch): the main chunk is dropped where it stands. `why` names the signal.
    pub fn abandon(&self, why: &str) {
        // Raised under the lock `lower` takes: a stop lowered meanwhile is raised again.
        let mut abandoned = self.0.abandoned.lock().unwrap_or_else(|e| e.into_inner());
        if abandoned.is_none() {
            *abandoned = Some(why.to_string());
        }
        self.raise(why);
        drop(abandoned);
        self.0.abandon.notify_waiters();
        self.0.abandon.notify_one();
    }

    /// The stop is over (the watch it stopped has returned): Lua code may run long without
    /// waiting again (a script's report after its watch), until the next stop. An abandoned
    /// program stays stopped.
    pub fn lower(&self) {
        let abandoned = self.0.abandoned.lock().unwrap_or_else(|e| e.into_inner());
        if abandoned.is_none() {
            let mut raised = self.0.raised.lock().unwrap_or_else(|e| e.into_inner());
            self.0.lowered.store(true, Ordering::Release);
            *raised = None;
        }
    }

    /// SIGINT is the caller's while the returned guard lives (`term.interruptible`: Ctrl-C
    /// cancels the call it runs), not a reason to end the program.
    pub fn take_sigint(&self) -> SigintTaken {
        self.0.sigint_taken.fetch_add(1, Ordering::AcqRel);
        SigintTaken(self.0.clone())
    }

    fn sigint_taken(&self) -> bool {
        self.0.sigint_taken.load(Ordering::Acquire) > 0
    }

    /// Whether a `term.interruptible` call is running: a host that wants the script to end on
    /// its own terms ([`Interrupt::end_interruptible`]) can have it give way first.
    pub fn interruptible_running(&self) -> bool {
        self.sigint_taken()
    }

    /// Ends the `term.interruptible` calls running and those that start later as a Ctrl-C ends
    /// one, `why` (the signal) answered with it: the script keeps what it had and ends itself
    /// (`colony chat` saves the exchange cut short). The host abandons it if it does not.
    pub fn end_interruptible(&self, why: &str) {
        let mut ended = self.0.calls_ended.lock().unwrap_or_else(|e| e.into_inner());
        if ended.is_none() {
            *ended = Some(why.to_string());
        }
        drop(ended);
        self.0.end_calls.notify_waiters();
    }

    /// Waits until [`Interrupt::end_interruptible`]; answers why.
    pub async fn interruptible_ended(&self) -> String {
        loop {
            let notified = self.0.end_calls.notified();
            if let Some(why) = self
                .0
                .calls_ended
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
            {
                return why;
            }
            notified.await;
        }
    }

    fn sigint_calls_ended(&self) -> usize {
        self.0.sigint_calls_ended.load(Ordering::Acquire)
    }

    fn sigints_given_way(&self) -> usize {
        self.0.sigints_given_way.load(Ordering::Acquire)
    }

    /// What abandoned the program, once something did.
    pub fn abandoned_by(&self) -> Option<String> {
        self.0
            .abandoned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Waits until the program is abandoned; answers why.
    pub async fn abandoned(&self) -> String {
        loop {
            let notified = self.0.abandon.notified();
            if let Some(why) = self.abandoned_by() {
                return why;
            }
            notified.await;
        }
    }
}

/// SIGINT held by a caller of its own ([`Interrupt::take_sigint`]) until dropped.
pub struct SigintTaken(Arc<Interrupted>);

impl SigintTaken {
    /// The call ended because of a SIGINT: that signal was the call's. The signal listener runs
    /// on another thread and may hear the same signal after this guard is gone; it counts
    /// these so as not to end the program on it.
    pub fn gave_way(&self) {
        self.0.sigints_given_way.fetch_add(1, Ordering::AcqRel);
    }
}

/// What the signal listener makes of the SIGINTs `term.interruptible` calls took: it hears
/// each signal on a thread of its own, before or after the call that took it has seen it.
struct SigintClaims {
    /// SIGINTs given way to ([`SigintTaken::gave_way`]) that the listener has matched with
    /// one it heard.
    claimed: usize,
}

impl SigintClaims {
    fn new(interrupt: &Interrupt) -> SigintClaims {
        SigintClaims {
            claimed: interrupt.sigints_given_way(),
        }
    }

    /// Whether a call already gave way to a SIGINT the listener has not matched yet: the one
    /// just heard is that one (the call saw it first), and it is now matched.
    fn already_taken(&mut self, interrupt: &Interrupt) -> bool {
        if interrupt.sigints_given_way() > self.claimed {
            self.claimed += 1;
            true
        } else {
            false
        }
    }
}

impl Drop for SigintTaken {
    fn drop(&mut self) {
        self.0.sigint_calls_ended.fetch_add(1, Ordering::AcqRel);
        self.0.sigint_taken.fetch_sub(1, Ordering::AcqRel);
    }
}

/// How long a `term.interruptible` call may take to give way to the SIGINT that cancels it
/// before the signal is the program's: code that spins or is blocked outside Lua does not
/// give way.
const CANCEL_PATIENCE: Duration = Duration::from_secs(1);

/// One poll of a callback: since when (as the watchdog first saw it: a poll costs no clock
/// read, and a slice is at most one tick longer), and under what limit.
struct Polled {
    since: Option<Instant>,
    limit: Arc<Limit>,
}

/// A coroutine of the VM, for the watchdog to set the hook on.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct State(*mut ffi::lua_State);

// SAFETY: the watchdog only passes the pointer to `lua_sethook`, which may be called from
// another thread, and only while the coroutine is alive: a state is listed in `Watch::running`
// only while the VM's thread keeps it alive (pinned until the poll ends, or being resumed), and
// it is taken off the list under the same lock the watchdog holds while it sets hooks.
unsafe impl Send for State {}

/// What the VM's thread is running, as the watchdog sees it.
#[derive(Default)]
struct Watch {
    /// The callbacks being polled, the innermost last (a callback can run another inside).
    polls: Vec<Polled>,
    /// The coroutines running Lua code for them. A set: `ai.parallel` of 20,000 functions
    /// resumes 20,000 coroutines in one poll, and a list searched at each resume made that
    /// quadratic (0.2 s of the Lua thread; 6 s for 40,000).
    running: HashSet<State>,
    /// The hook is set on every coroutine in `running`.
    armed: bool,
    /// The watchdog sleeps until a callback starts.
    parked: bool,
    /// The VM is gone: the watchdog ends.
    quit: bool,
}

struct Shared {
    watch: Mutex<Watch>,
    wake: Condvar,
    interrupt: Interrupt,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Watch> {
        self.watch.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The VM's side of its watchdog, kept in its app data.
struct Dog {
    shared: Arc<Shared>,
    /// The coroutines mlua resumed during the poll, kept alive until it ends.
    pins: RefCell<Vec<Thread>>,
}

impl Dog {
    /// A poll of a callback under `limit` begins.
    fn enter(&self, limit: Arc<Limit>) {
        let mut watch = self.shared.lock();
        watch.polls.push(Polled { since: None, limit });
        if watch.parked {
            watch.parked = false;
            self.shared.wake.notify_one();
        }
    }

    /// The poll ends; the outermost one takes the hook off what it set it on.
    fn leave(&self) {
        let mut watch = self.shared.lock();
        watch.polls.pop();
        if !watch.polls.is_empty() {
            return;
        }
        if watch.armed {
            for state in &watch.running {
                // SAFETY: on the VM's thread, with the coroutine pinned or being resumed.
                unsafe { ffi::lua_sethook(state.0, None, 0, 0) };
            }
            watch.armed = false;
        }
        watch.running.clear();
        drop(watch);
        // Cleared, not taken: the next call reuses the buffer instead of allocating one.
        self.pins.borrow_mut().clear();
    }

    /// mlua resumes `thread` (a callback's coroutine, at each of its polls).
    fn resumed(&self, thread: Thread) {
        let state = State(thread.state());
        if self.run(state) {
            self.pins.borrow_mut().push(thread);
        }
    }

    /// `state` runs Lua code for the callback being polled: listed (and hooked, if the stop is
    /// already due). False when no callback is being polled, or it was listed already.
    fn run(&self, state: State) -> bool {
        let mut watch = self.shared.lock();
        if watch.polls.is_empty() || !watch.running.insert(state) {
            return false;
        }
        if watch.armed {
            arm(state);
        }
        true
    }

    /// `state`, resumed by `coroutine.resume`, has stopped running.
    fn ran(&self, state: State) {
        let mut watch = self.shared.lock();
        if watch.running.remove(&state) && watch.armed {
            // SAFETY: on the VM's thread, while the script still holds the coroutine.
            unsafe { ffi::lua_sethook(state.0, None, 0, 0) };
        }
    }

    /// The stop due for the innermost callback, if any: what the hook raises.
    fn due(&self) -> Option<Stop> {
        let watch = self.shared.lock();
        due(watch.polls.last()?, &self.shared.interrupt, Instant::now())
    }
}

impl Drop for Dog {
    fn drop(&mut self) {
        self.shared.lock().quit = true;
        self.shared.wake.notify_one();
    }
}

/// The stop due for `polled` at `now`, if any.
fn due(polled: &Polled, interrupt: &Interrupt, now: Instant) -> Option<Stop> {
    let limit = &polled.limit;
    // Once the stop is asked, nothing may run long without waiting (a source that crashes
    // and restarts spinning included).
    let running = polled
        .since
        .map_or(Duration::ZERO, |since| now.duration_since(since));
    if let Some((at, why)) = interrupt.raised()
        && now >= at + INTERRUPT_GRACE
        && running >= INTERRUPT_GRACE
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
        && running >= slice
    {
        return Some(Stop::Deadline(format!(
            "it ran {} s without waiting (a callback may run at most {} s at a time)",
            slice.as_secs_f64(),
            slice.as_secs_f64()
        )));
    }
    None
}

/// Sets the hook on `state`.
fn arm(state: State) {
    // SAFETY: see `State`: the coroutine is alive while it is listed.
    unsafe { ffi::lua_sethook(state.0, Some(hook), ffi::LUA_MASKCOUNT, EVERY) };
}

/// The hook, every [`EVERY`] instructions once set: calls the VM's check, which raises the
/// [`Stop`] as a Lua error (through mlua, so it reaches Rust as the error it is).
unsafe extern "C-unwind" fn hook(state: *mut ffi::lua_State, _: *mut ffi::lua_Debug) {
    // SAFETY: a hook runs on the VM's thread with room on the stack for this (Lua gives a hook
    // LUA_MINSTACK slots); the check takes no arguments and returns none.
    unsafe {
        if ffi::lua_getfield(state, ffi::LUA_REGISTRYINDEX, CHECK_KEY.as_ptr())
            == ffi::LUA_TFUNCTION
        {
            ffi::lua_call(state, 0, 0);
        } else {
            ffi::lua_pop(state, 1);
        }
    }
}

/// The watchdog's thread: every [`TICK`] while a callback runs, sets the hook once its stop is
/// due; sleeps while none does.
fn watch(shared: Arc<Shared>) {
    let mut idle = 0;
    let mut watch = shared.lock();
    loop {
        if watch.quit {
            return;
        }
        match watch.polls.is_empty() {
            true => {
                idle += 1;
                if idle >= IDLE_TICKS {
                    watch.parked = true;
                    while watch.parked && !watch.quit {
                        watch = shared.wake.wait(watch).unwrap_or_else(|e| e.into_inner());
                    }
                    idle = 0;
                    continue;
                }
            }
            false => {
                idle = 0;
                let now = Instant::now();
                for polled in &mut watch.polls {
                    polled.since.get_or_insert(now);
                }
                let polled = watch.polls.last().expect("a poll");
                if !watch.armed && due(polled, &shared.interrupt, now).is_some() {
                    for state in &watch.running {
                        arm(*state);
                    }
                    watch.armed = true;
                }
            }
        }
        watch = shared
            .wake
            .wait_timeout(watch, TICK)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

/// Runs `work` under `limit`: while it is polled, the watchdog holds it to that limit.
pub fn guarded<F: Future>(lua: &Lua, limit: Limit, work: F) -> impl Future<Output = F::Output> {
    let dog = lua.app_data_ref::<Rc<Dog>>().map(|d| Rc::clone(&d));
    let limit = Arc::new(limit);
    async move {
        let Some(dog) = dog else {
            return work.await;
        };
        /// Ends the poll however it ends (a panic included).
        struct Polling<'a>(&'a Dog);
        impl Drop for Polling<'_> {
            fn drop(&mut self) {
                self.0.leave();
            }
        }
        let mut work = std::pin::pin!(work);
        std::future::poll_fn(move |cx| {
            dog.enter(limit.clone());
            let _polling = Polling(&dog);
            work.as_mut().poll(cx)
        })
        .await
    }
}

/// Runs `work` as a callback without a deadline of its own (a source, a `deliver_to`, a hook):
/// stopped once it runs [`MAX_SLICE`] without waiting.
pub fn as_callback<F: Future>(lua: &Lua, work: F) -> impl Future<Output = F::Output> {
    guarded(lua, Limit::callback(), work)
}

/// Starts the VM's watchdog and makes `pcall` and `xpcall` pass a [`Stop`] on.
pub fn install(lua: &Lua, interrupt: Interrupt) -> mlua::Result<()> {
    lua.set_app_data(interrupt.clone());
    let wrap: Function = lua
        .load(UNCATCHABLE)
        .set_name("=colony.watchdog")
        .into_function()?;
    wrap.call::<()>((is_stop(lua)?, caught(lua)?))?;
    // Only for the benches' with-and-without comparison (benches/README: the watchdog's cost):
    // a VM without it cannot stop code that spins, so nothing else reads this.
    if std::env::var_os("COLONY_BENCH_NO_WATCHDOG").is_some() {
        return Ok(());
    }
    let shared = Arc::new(Shared {
        watch: Mutex::default(),
        wake: Condvar::new(),
        interrupt,
    });
    let theirs = shared.clone();
    std::thread::Builder::new()
        .name("colony-watchdog".into())
        .spawn(move || watch(theirs))
        .map_err(|e| mlua::Error::external(format!("cannot start the watchdog thread: {e}")))?;
    let dog = Rc::new(Dog {
        shared,
        pins: RefCell::default(),
    });
    let checks = dog.clone();
    let check = lua.create_function(move |_, ()| match checks.due() {
        Some(stop) => Err(mlua::Error::external(stop)),
        None => Ok(()),
    })?;
    let key = CHECK_KEY.to_str().expect("an ASCII key");
    lua.set_named_registry_value(key, check)?;
    let resumes = dog.clone();
    lua.set_thread_event_callback(ThreadTriggers::ON_RESUME, move |_, event| {
        if let ThreadEvent::Resume(thread) = event {
            resumes.resumed(thread);
        }
        Ok(())
    });
    lua.set_app_data(dog);
    Ok(())
}

/// `is_stop(e)`: whether the Lua error value `e` is a [`Stop`].
pub fn is_stop(lua: &Lua) -> mlua::Result<Function> {
    lua.create_function(|_, v: Value| Ok(matches!(v, Value::Error(e) if Stop::of(&e).is_some())))
}

/// `enter(co)` and `leave(co)`, for `coroutine.resume` to call around a resume: the watchdog
/// sets the hook on a coroutine only while it is being resumed.
pub fn resume_marks(lua: &Lua) -> mlua::Result<(Function, Function)> {
    let dog = lua.app_data_ref::<Rc<Dog>>().map(|d| Rc::clone(&d));
    let (entering, leaving) = (dog.clone(), dog);
    let enter = lua.create_function(move |_, co: Value| {
        if let (Some(dog), Value::Thread(co)) = (&entering, co) {
            dog.run(State(co.state()));
        }
        Ok(())
    })?;
    let leave = lua.create_function(move |_, co: Value| {
        if let (Some(dog), Value::Thread(co)) = (&leaving, co) {
            dog.ran(State(co.state()));
        }
        Ok(())
    })?;
    Ok((enter, leave))
}

/// `pcall` and `xpcall` that raise a [`Stop`] again instead of returning it (an `xpcall`
/// handler does not see it either).
///
/// An error colony raised (a refused argument, a failed call) reaches the script as the string
/// Lua's own errors are, its message without mlua's traceback.
const UNCATCHABLE: &str = r#"
local is_stop, caught = ...
local raw_pcall, raw_xpcall, error = pcall, xpcall, error
local function pass(ok, ...)
  if ok then return ok, ... end
  local e = ...
  if is_stop(e) then error(e, 0) end
  return false, caught(e)
end
pcall = function(f, ...) return pass(raw_pcall(f, ...)) end
xpcall = function(f, handler, ...)
  return pass(raw_xpcall(f, function(e)
    if is_stop(e) then return e end
    return handler(caught(e))
  end, ...))
end
"#;

/// `caught(e)`: an error raised through Rust (a userdata printing mlua's traceback, which `e:find`
/// cannot even read) as `file:line: message`, the script line that made the call; any other
/// value as it is.
pub fn caught(lua: &Lua) -> mlua::Result<Function> {
    lua.create_function(|lua, v: Value| match v {
        Value::Error(e) => match super::thrown::recover(lua, &e) {
            Some(thrown) => Ok(thrown),
            None => Ok(Value::String(lua.create_string(super::fault(&e).message)?)),
        },
        other => Ok(other),
    })
}

/// Raises the VM's [`Interrupt`] on SIGINT and SIGTERM (SIGHUP too under `colony run`:
/// [`crate::signals::stops`]) and on [`crate::residents::Route::interrupt`], from a task on
/// `runtime` (the VM's own thread may be the one spinning), for as long as the returned guard
/// lives. The watch starts it, or the
/// program's start when its host asks ([`super::HostSetup::signals_from_start`], `colony run`):
/// otherwise, before a watch, a signal ends the process by its default action, leaving the
/// store as a crash does.
///
/// A signal the watch hears stops the program (its turns get the grace; the watch's own
/// listener decides), and a third ends it wherever it waits (a hook of the watch that sleeps).
/// One that no watch hears, before the watch or after it, ends the program wherever it waits
/// at once, so that the run ends as any other and closes its store. SIGINT is not the
/// program's while a `term.interruptible` call runs ([`Interrupt::take_sigint`]), nor when
/// heard after such a call gave way to it ([`SigintClaims`]).
///
/// The route is told to stop first: a source the interrupt cuts short must find the program
/// stopping, or its restart policy would start it again before the watch hears the signal.
pub fn listen(
    lua: &Lua,
    runtime: &tokio::runtime::Handle,
    program: crate::residents::WeakLifecycle,
) -> Option<Listening> {
    let interrupt = lua.app_data_ref::<Interrupt>()?.clone();
    // Counted from here: a call that gave way before the listener was up took a signal it
    // will never hear.
    let mut claims = SigintClaims::new(&interrupt);
    let task = runtime.spawn(async move {
        let Ok(mut stops) = crate::signals::stops() else {
            return;
        };
        let Some(route) = program.upgrade().map(|p| p.route().clone()) else {
            return;
        };
        let mut interrupted = false;
        let mut signals = 0;
        // A SIGINT a `term.interruptible` call took: when it must have ended, and how many
        // such calls had ended then.
        let mut cancelling: Option<(tokio::time::Instant, usize)> = None;
        loop {
            let why = tokio::select! {
                signal = stops.recv() => {
                    if signal == "SIGINT" {
                        // One heard while a call ran, which has since given way: that was
                        // the call's; this one is new.
                        if cancelling.is_some() && claims.already_taken(&interrupt) {
                            cancelling = None;
                        }
                        if claims.already_taken(&interrupt) {
                            continue;
                        }
                    }
                    if signal == "SIGINT" && interrupt.sigint_taken() {
                        let due = tokio::time::Instant::now() + CANCEL_PATIENCE;
                        cancelling = Some((due, interrupt.sigint_calls_ended()));
                        continue;
                    }
                    signal.to_string()
                }
                () = tokio::time::sleep_until(
                    cancelling.map_or_else(tokio::time::Instant::now, |c| c.0)
                ), if cancelling.is_some() => {
                    let ended = cancelling.take().map_or(0, |c| c.1);
                    if claims.already_taken(&interrupt)
                        || !interrupt.sigint_taken()
                        || interrupt.sigint_calls_ended() != ended
                    {
                        continue;
                    }
                    // The call did not give way: the signal is the program's.
                    "SIGINT".to_string()
                }
                // Stopped as a signal stops it (`--max-time`), under the stop's own reason.
                () = route.interrupted(), if !interrupted => {
                    interrupted = true;
                    let why = route.stop_reason().unwrap_or_default();
                    route.stop(why.as_str());
                    interrupt.raise_for_watch(&why);
                    continue;
                }
            };
            signals += 1;
            // A signal no watch hears (before the watch, after it) ends the program where it
            // waits: tokio's handler, once installed, stays, so it would be heard by nobody and
            // ignored. During the watch the first stops it, the second cuts its grace short
            // (the watch's own listener), and a third ends the program whatever it waits for.
            // The watch's listener hears each signal too, and may end the watch on it before
            // this task runs: a signal the watch heard is not one after it.
            let watch = program
                .upgrade()
                .map_or(crate::residents::Watch::Ended, |p| p.watch_state());
            let unheard = match watch {
                crate::residents::Watch::NotYet => true,
                // Its listener may not be up yet: the stop reaches the watch all the same.
                crate::residents::Watch::Running => false,
                crate::residents::Watch::Ended => {
                    !route.watch_listening() && signals > route.signals_heard()
                }
            };
            if unheard || signals >= 3 {
                // The end says it ("the program was ended by SIGINT"); the third is told here
                // too, since the watch said the first two would let turns finish.
                if unheard {
                    tracing::info!("{why}: ending the program now");
                } else {
                    tracing::warn!("{why}, the third signal: ending the program now");
                }
                route.stop(why.as_str());
                interrupt.abandon(&why);
                continue;
            }
            route.stop(why.as_str());
            interrupt.raise_for_watch(&why);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The listener may hear a SIGINT only after the `term.interruptible` call it cancelled
    /// has ended (its thread was busy): that signal is still the call's, and the next is not.
    #[test]
    fn a_sigint_heard_after_the_call_it_cancelled_ended_was_the_calls() {
        let interrupt = Interrupt::default();
        let mut claims = SigintClaims::new(&interrupt);
        let taken = interrupt.take_sigint();
        taken.gave_way();
        drop(taken);
        assert!(!interrupt.sigint_taken());
        assert!(claims.already_taken(&interrupt));
        assert!(!claims.already_taken(&interrupt));
    }

    /// A call that gave way before the listener was up took a signal the listener never hears.
    #[test]
    fn a_listener_started_later_does_not_claim_earlier_signals() {
        let interrupt = Interrupt::default();
        interrupt.take_sigint().gave_way();
        let mut claims = SigintClaims::new(&interrupt);
        assert!(!claims.already_taken(&interrupt));
    }
}
