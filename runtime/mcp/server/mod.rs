//! colony as an MCP server: a program's `exportable = true` tools, the residents it marked
//! `export = true` (each a tool that mails the resident and answers its reply), its resources
//! and prompts, served on `rmcp`'s server over stdio (`colony mcp serve`) or Streamable HTTP
//! (`/mcp` on `colony serve`).
//!
//! - [`ask`]: what a handler asks its client (`ctx.sample`, `ctx.elicit`).
//! - [`exports`]: what a program offers, filled by its host as the script runs.
//! - [`handler`]: the session's [`rmcp::ServerHandler`] over the programs' offers.
//! - [`call`]: one `tools/call` (arguments checked against the schema before any handler runs,
//!   the caller in the audit log).
//! - [`content`]: resources, templates and prompts made by the script's functions.
//! - [`stdio`]: one program on stdin and stdout.
//! - [`paced`]: reading no further request while answers wait to be written.
//! - [`streams`]: the Streamable HTTP sessions, with a call's stream closed mid-call and
//!   resumed (SSE polling).
//!
//! The core never reaches the script here but through [`crate::script::Script`].

pub mod ask;
pub mod call;
pub mod content;
pub mod exports;
pub mod handler;
pub mod paced;
pub mod stdio;
pub mod streams;

pub use ask::{Asker, Question, Unanswered};
pub use call::Caller;
pub use exports::{Client, Exports, Report, ResidentExport};
pub use handler::{Offer, One, Programs, Server};
pub use streams::Streams;
