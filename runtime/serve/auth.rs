//! Who may call the service: a bearer token (when one is set, and always off loopback),
//! compared in constant time, on everything but the health endpoints; and no browser page of
//! another origin (a request whose `Origin` is not the service's own is refused with `403`, so
//! a web page the operator visits cannot drive the API with their browser).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

/// The token, if any. Its text never appears in an answer, a log line or the page.
#[derive(Clone, Default)]
pub struct Guard {
    token: Option<Arc<[u8]>>,
}

impl Guard {
    pub fn new(token: Option<String>) -> Guard {
        Guard {
            token: token.map(|t| Arc::from(t.into_bytes())),
        }
    }

    pub fn has_token(&self) -> bool {
        self.token.is_some()
    }

    /// Whether `headers` carry the token (`Authorization: Bearer T`, or the dashboard's
    /// `colony_token` cookie, which the browser sends with its event stream).
    pub fn admits(&self, headers: &HeaderMap) -> bool {
        let Some(token) = &self.token else {
            return true;
        };
        let bearer = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        let cookie = headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|c| c.trim().strip_prefix("colony_token="))
            .next();
        [bearer, cookie]
            .into_iter()
            .flatten()
            .any(|given| bool::from(given.as_bytes().ct_eq(token)))
    }
}

/// Whether a request with these headers comes from a page of another origin: its `Origin` (a
/// browser sends one with every cross-site request and every POST) names another host and port
/// than the `Host` it was sent to.
pub fn foreign_origin(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return false;
    };
    let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else {
        return true;
    };
    let Ok(origin) = origin.to_str() else {
        return true;
    };
    let authority = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    authority != Some(host)
}

/// Who made a request, as the rate limits name it ([`super::rate`]): put in the request's
/// extensions once its token is checked.
#[derive(Debug, Clone)]
pub struct Caller(pub String);

impl Caller {
    /// The caller that presented the service's token.
    pub const TOKEN: &str = "token";
    /// A caller of a loopback service that has no token.
    pub const LOCAL: &str = "local";
}

/// The middleware in front of the API, the metrics and the page.
pub async fn check(State(guard): State<Guard>, mut request: Request, next: Next) -> Response {
    if foreign_origin(request.headers()) {
        return refuse(
            StatusCode::FORBIDDEN,
            "forbidden",
            "requests from another origin are refused",
        );
    }
    if !guard.admits(request.headers()) {
        let mut answer = refuse(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "a bearer token is required (Authorization: Bearer ...)",
        );
        answer.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            "Bearer".parse().expect("a header"),
        );
        return answer;
    }
    let caller = if guard.has_token() {
        Caller::TOKEN
    } else {
        Caller::LOCAL
    };
    request.extensions_mut().insert(Caller(caller.to_string()));
    next.run(request).await
}

/// The middleware in front of everything: a foreign `Origin` is refused even where no token is
/// asked for.
pub async fn same_origin(request: Request, next: Next) -> Response {
    if foreign_origin(request.headers()) {
        return refuse(
            StatusCode::FORBIDDEN,
            "forbidden",
            "requests from another origin are refused",
        );
    }
    next.run(request).await
}

/// An error answer: `{ "error": kind, "message": ... }`.
pub fn refuse(status: StatusCode, kind: &str, message: &str) -> Response {
    (
        status,
        axum::Json(serde_json::json!({ "error": kind, "message": message })),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn the_token_is_the_bearer_or_the_cookie_and_nothing_like_it() {
        let g = Guard::new(Some("s3cret-token".into()));
        assert!(g.admits(&headers(&[("authorization", "Bearer s3cret-token")])));
        assert!(g.admits(&headers(&[("cookie", "a=b; colony_token=s3cret-token")])));
        assert!(!g.admits(&headers(&[])));
        assert!(!g.admits(&headers(&[("authorization", "Bearer s3cret-toke")])));
        assert!(!g.admits(&headers(&[("authorization", "Bearer s3cret-tokenX")])));
        assert!(!g.admits(&headers(&[("authorization", "s3cret-token")])));
        assert!(Guard::new(None).admits(&headers(&[])));
    }

    #[test]
    fn an_origin_is_foreign_unless_it_names_the_host_asked() {
        assert!(!foreign_origin(&headers(&[("host", "127.0.0.1:7878")])));
        assert!(!foreign_origin(&headers(&[
            ("host", "127.0.0.1:7878"),
            ("origin", "http://127.0.0.1:7878")
        ])));
        assert!(foreign_origin(&headers(&[
            ("host", "127.0.0.1:7878"),
            ("origin", "http://evil.example")
        ])));
        assert!(foreign_origin(&headers(&[
            ("host", "127.0.0.1:7878"),
            ("origin", "http://127.0.0.1:7879")
        ])));
        assert!(foreign_origin(&headers(&[("origin", "null")])));
    }
}
