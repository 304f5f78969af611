//! Rate limits per caller of the service (`[rate] caller` and `[rate.callers]` in the config):
//! a caller over its limit is answered `429 Too Many Requests` with `Retry-After` (whole
//! seconds, rounded up) and nothing of its request is done.
//!
//! A caller is named by the token it presented ([`super::auth::Caller`]): the token's name in a
//! file of named tokens, `token` for a single unnamed one, `local` on a loopback service without
//! one. `/mcp` is limited the same way ([`super::mcp`]). The limits are read from
//! the config as each request arrives, so a reloaded config applies at once.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;

use super::Service;
use super::auth::Caller;
use super::refusal::refuse;

/// The middleware behind the token check, in front of the API and the metrics.
pub async fn check(State(service): State<Arc<Service>>, request: Request, next: Next) -> Response {
    let caller = request
        .extensions()
        .get::<Caller>()
        .map(|c| c.0.clone())
        .unwrap_or_else(|| Caller::LOCAL.to_string());
    match over(&service, &caller) {
        Some(answer) => answer,
        None => next.run(request).await,
    }
}

/// The `429` for `caller` when it is over its limit (its request then taken from its bucket
/// otherwise), `None` when it may go on.
pub fn over(service: &Service, caller: &str) -> Option<Response> {
    let config = service.core().config();
    let (rate, wait) = config.rate.as_ref()?.check_caller(caller).err()?;
    let secs = wait.as_secs_f64().ceil().max(1.0) as u64;
    let mut answer = refuse(
        StatusCode::TOO_MANY_REQUESTS,
        "rate_limited",
        &format!("caller {caller:?} allows {rate} requests; try again in {secs} s"),
    );
    answer.headers_mut().insert(
        header::RETRY_AFTER,
        secs.to_string()
            .parse()
            .expect("a number is a header value"),
    );
    Some(answer)
}
