//! Hosting AIs as residents (DESIGN §5).
//!
//! This folder will hold the route (the table of addressable AIs, the nursery, the watch), the
//! resident loop, its mailbox and backlog, sources and supervision. What is here so far is the
//! layer every resident's model calls go through:
//!
//! - [`middleware`]: serving one inference step ([`middleware::Infer`]) and the layers that wrap
//!   it, `with_retries` ([`middleware::Retries`]) inside `with_breaker` ([`middleware::Breaker`]).

pub mod middleware;
