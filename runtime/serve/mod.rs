//! `colony serve`: resident programs as a long-running service, on one HTTP listener.
//!
//! - [`host`]: the one adapter to how a program is started and driven (through
//!   [`crate::embed`], the lifecycle `colony run` shares, and its state directory); nothing
//!   else here names those.
//! - [`service`]: the programs hosted (each in a slot that outlives its runs), what their
//!   residents are observed doing, restart, reload (SIGHUP) and drain (SIGTERM).
//! - [`api`]: the JSON control API under `/api`, the health endpoints and the scrape.
//! - [`events`]: Server-Sent Events with a bounded replay buffer for `Last-Event-ID`.
//! - [`metrics`]: the Prometheus text format of counters, histograms and gauges.
//! - [`programs`]: the config's `[[serve.programs]]`, with each program's permissions.
//! - [`auth`]: the bearer token and the `Origin` rule.
//! - [`refusal`]: every refusal in JSON, the routing's own included.
//! - [`rate`]: the per-caller rate limits (`429` with `Retry-After`).
//! - [`protected_resource`]: `/mcp`'s OAuth protected-resource metadata (RFC 9728).
//! - [`dashboard`]: the page at `/`, compiled in.
//! - [`mcp`]: the hosted programs' exports over MCP at `/mcp` (Streamable HTTP).
//! - [`mcp_sessions`]: which caller opened each `/mcp` session (it answers that caller alone).

pub mod api;
pub mod auth;
pub mod conn;
pub mod dashboard;
pub mod events;
pub mod host;
pub mod mcp;
pub mod mcp_sessions;
pub mod metrics;
pub mod programs;
pub mod protected_resource;
pub mod rate;
pub mod refusal;
pub mod service;

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::middleware::{from_fn, from_fn_with_state};
use axum::routing::{get, post};
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::timeout::RequestBodyTimeoutLayer;

pub use auth::Guard;
pub use host::Launch;
pub use service::{Programs, Reloaded, Service};

/// The largest request body the service reads (a mail with its files, base64).
pub const BODY_LIMIT: usize = 8 * 1024 * 1024;

/// How long a request body may stop coming before its request ends (between two pieces of it,
/// not for the whole).
pub const BODY_PATIENCE: std::time::Duration = std::time::Duration::from_secs(30);

/// The default listen address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7878";

/// Every route of the service: the health endpoints and the page open to all (but a foreign
/// `Origin`), everything else behind `guard`.
pub fn router(service: Arc<Service>, guard: Guard) -> Router {
    let over_mcp = mcp::routes(service.clone(), guard.clone());
    let guarded = Router::new()
        .route("/api/programs", get(api::programs))
        .route("/api/programs/{p}", get(api::program))
        .route("/api/programs/{p}/residents", get(api::residents))
        .route("/api/programs/{p}/residents/{name}", get(api::resident))
        .route(
            "/api/programs/{p}/residents/{name}/conversation",
            get(api::conversation),
        )
        .route(
            "/api/programs/{p}/residents/{name}/unblock",
            post(api::unblock),
        )
        .route(
            "/api/programs/{p}/residents/{name}/dismiss",
            post(api::dismiss),
        )
        .route("/api/programs/{p}/mail", post(api::mail))
        .route("/api/programs/{p}/restart", post(api::restart))
        .route("/api/programs/{p}/stop", post(api::stop))
        .route("/api/events", get(api::events))
        .route("/metrics", get(api::metrics))
        // Inside the token check: a caller is known by its token before its rate is read.
        .layer(from_fn_with_state(service.clone(), rate::check))
        .layer(from_fn_with_state(guard, auth::check));
    // The page holds no data (it asks the API for everything, with the token): a browser
    // that has no token yet must be able to load it to be asked for one.
    let open = Router::new()
        .route("/", get(dashboard::page))
        .route("/healthz", get(api::healthz))
        .route("/readyz", get(api::readyz))
        .merge(protected_resource::routes())
        .layer(from_fn(auth::same_origin));
    guarded
        .merge(open)
        .merge(over_mcp)
        .layer(RequestBodyLimitLayer::new(BODY_LIMIT))
        // A body that stops coming (a client that sent its headers and part of a mail) ends
        // its request, rather than holding a connection and its socket for ever.
        .layer(RequestBodyTimeoutLayer::new(BODY_PATIENCE))
        // The limit is that layer's alone: axum's extractors apply 2 MiB of their own, which
        // refused a mail of 3 MB as over the service's limit.
        .layer(DefaultBodyLimit::disable())
        .layer(from_fn(refusal::as_json))
        .with_state(service)
}
