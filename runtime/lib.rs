//! colony: a Rust runtime in which Lua programs host AIs.
//!
//! # Module map
//!
//! `ARCHITECTURE.md` at the repository root says how these fit: the layers, the crossing between
//! the Lua thread and the core, the life of a mail, the store's guarantees. From the bottom up:
//!
//! - [`vocab`]: the provider-neutral types (messages, parts, tool specs and calls, usage, stop
//!   reasons, requests and responses). Everything above the wire speaks only these.
//! - [`duration`]: the one reading of every duration colony is given (numbers and text), with
//!   a clear error for negative, NaN or absurd values and a documented maximum.
//! - [`secrets`]: keeps keys out of every log, error, transcript and cassette.
//! - [`said`]: a log line a busy path would repeat (a mail refused, a call retried) said at
//!   most once a period, with how many went unsaid.
//! - [`store`]: the durable store behind the `Store` trait (key-value workspaces, persisted
//!   conversations with their backlog and journal, breaker states, the audit log); `sqlite` is
//!   the embedded default, `memory` the one for tests and front ends, `state_dir` a program's
//!   state directory and its single-process lock.
//! - [`files`]: what a file is (content type from the caller, its bytes or its name; the closed
//!   kind), `forms` (the per-provider table), `window` (only the newest file-bearing message
//!   inlines), `view` (the `view_file` tool), `shed` (a refused attachment becomes a note),
//!   `library` (the program's files by hash).
//! - [`providers`]: the catalogue of known providers and one module per wire style
//!   (`anthropic`, `openai`, `gemini` with `request`, `schema`, `response`, `streamed_call`,
//!   `opaque`), each a `Codec` that builds requests and parses whole or
//!   streamed (`sse`) responses; `errors` classifies failures; `wire_names` reshapes tool names;
//!   `text_tools` is the fallback for models without native tools; `structured` answers that
//!   validate against a schema; `body` bounded response bodies; `replay` answers from cassettes.
//!   `Providers::call` is the one call that reaches a model.
//! - [`config`]: settings by use-type (`chat`, `code`, `helper`, `general`) from the TOML config,
//!   the environment and the catalogue, resolved into an endpoint for each request.
//! - [`core`]: what a program talks to: the config (read again when its file changes), the
//!   providers and the multi-thread runtime, with `Core::prepare` / `Core::settle` (overrides to
//!   a neutral request and an endpoint), `Core::call_provider` (the innermost step), and `Ask::under` (a resident's settings
//!   under its route's).
//! - [`script`]: the seam through which the core reaches the script hosting a program: the
//!   `Script` trait (run a handler, a callback, a source), `FnId`, `HandlerOutcome`, `Fault`,
//!   `Provenance` and the typed `ToolContext` of a tool call.
//! - [`turn`]: one model turn as a value: `take_turn` (the loop, the step cap), `dispatch` (one
//!   tool call; every failure an error result), `tools` (definitions, schemas, globs),
//!   `model_call` (one model call, streamed, with the refused-attachment retry), `compaction`
//!   and `estimate` (staying inside the window).
//! - [`mcp`]: the MCP client on `rmcp`: server `spec`s (config, Lua, `mcpServers` files), a
//!   `session` per server (Streamable HTTP or stdio; paging, deadlines with `notifications/cancelled`,
//!   re-initialising, restarting a dead child), `http_client`, `handler`, `naming`
//!   (`<server>__<tool>`), `result` shaping, `toolset` (a turn's servers at once, reported),
//!   `resource_tools` (resources as read-only tools), `dynamic` (`mcp_connect`), the tool
//!   `cache`, `elicit` and `sampling` (a server's questions for the user and its model),
//!   `oauth` and `enterprise` (OAuth 2.1, enterprise-managed authorization), `resources`.
//! - [`residents`]: AIs hosted as residents: the `lifecycle` of a running program (residents
//!   before the watch, the watch, sources, the stop, the grace), the `route` (table, nursery,
//!   stop, settling when all is idle or blocked), each `resident`'s loop, outage path and blocked
//!   state, `mail` and the mailbox, `persist` (the order of writes that makes a restart safe),
//!   `supervision` (restart policies), `observe` (what residents do, for an observer outside),
//!   `breakers` (where each breaker of the program's model calls stands).
//! - [`infer`]: inference middleware, the layers that serve one step of every turn around the
//!   core: `Infer::step` (`DynInfer`/`SharedInfer` for stacks chosen at run time), `clock`, `retries`
//!   (`with_retries`), `breaker` (`with_breaker`, its state and `BreakerStore`), `context`
//!   (`with_context`), `stack` (a stack from a host's `LayerSpec`s; each owner's breaker key),
//!   `scripted` (a fake step for tests).
//! - [`structured`]: answers that are JSON matching a schema: ask, validate locally, correct once
//!   (`ask_structured`, behind `ai.infer_structured`).
//! - [`rate`]: rate limits (`"10/min"`) as token buckets, for tools and callers.
//! - [`permissions`]: what a program may reach beyond colony's own calls (`--allow-*`): hosts,
//!   paths resolved before they are checked, processes, the environment.
//! - [`cluster`]: several `colony serve` nodes sharing a program: residents placed by leases in
//!   PostgreSQL (rendezvous hashing over the live nodes, taken over when a node is gone), mail
//!   between nodes over NATS JetStream. The core's side of it is `residents::placement`.
//! - [`serve`]: `colony serve`: programs as a service on one HTTP listener (control API,
//!   events, metrics, dashboard); `host` is its one adapter to the program lifecycle (through
//!   `embed`), `programs` the config's programs and their permissions.
//! - [`lua`]: the Lua host. One VM per program on its own thread; each Lua module registers
//!   itself from its own file and only translates between Lua values and the core. `bridge`: the
//!   Lua side of the seam (`Script` for the VM); `convert`, `messages`, `files`: values both
//!   ways. The `ai` module: `ai` (`ask`, `models`, `sleep` ...), `tools` (`ai.tool`), `turn`
//!   (`take_turn`, `run`), `structured` (`infer_structured`), `parallel`, `middleware` (the
//!   `ai.with_*` values), `residents` (`ai.spawn`/`mail`/`watch`/`stop` ..., translations into
//!   the lifecycle) and `resident_spec` (an `ai.spawn` table read, `ai.route`'s defaults).
//!   `http`: `get`/`post`/`request` on the VM's pooled client, with a timeout, a body limit and
//!   redirects that leave the origin stripped of the script's headers; a 404 is a response, not `err`.
//!   `fs`: `read`/`write`/`list`/`stat`/`exists` on tokio::fs, relative to the script's folder.
//!   `proc`: `run` on tokio's process API, killed at its timeout. `sandbox`: the program's
//!   permissions checked by those modules, and wrappers around `io`, `os` and `load`.
//!   `watchdog`: the instruction-count hook that stops code that never waits (deadlines, signals).
//!   `store`: the program's store by workspace. `mcp`: `connect`/`tools`/`call`/`close`/`servers`/
//!   `cached_tools`, and the server specs that `mcp = {...}` on turns and residents shares;
//!   `mcp_export` what a program offers as an MCP server, `mcp_ask` a handler's `ctx.sample` and
//!   `ctx.elicit`.
//!   `json`. `term`: the terminal for front ends (line editor, Markdown rendering, spinner,
//!   Ctrl-C that cancels a call in flight); `colony`: colony's own commands, scripts, examples
//!   and config.
//! - [`embed`]: colony inside a Rust application: a `Runtime` with native tools, `Program`s to
//!   mail, list, stop and restart through their `Lifecycle`; `Lend` for a host of several
//!   programs (a store, an observer, a deliveries channel, permissions each).
//! - [`shipped`]: the Lua front ends (`scripts/`) and example programs compiled into the binary.
//! - [`cli`]: the `colony` command, one file per subcommand, and its panic report (`panic`).
//!
//! The Lua VM runs on a thread of its own; its async functions suspend only the calling coroutine,
//! so a script reads synchronously. The core is `Send` and runs on the multi-thread runtime.

pub mod cli;
pub mod cluster;
pub mod config;
pub mod core;
pub mod duration;
pub mod embed;
pub mod files;
pub mod infer;
pub mod lua;
pub mod mcp;
pub mod permissions;
pub mod providers;
pub mod rate;
pub mod residents;
pub mod said;
pub mod script;
pub mod secrets;
pub mod serve;
pub mod shipped;
pub mod signals;
pub mod store;
pub mod structured;
pub mod tls;
pub mod turn;
pub mod vocab;
