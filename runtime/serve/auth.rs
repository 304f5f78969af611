//! Who may call the service: a bearer token (when one is set, and always off loopback),
//! compared in constant time, on everything but the health endpoints; and no browser page of
//! another origin (a request whose `Origin` is not the service's own is refused with `403`, so
//! a web page the operator visits cannot drive the API with their browser).

use std::sync::{Arc, RwLock};

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;
use subtle::ConstantTimeEq;

use super::refusal::refuse;

/// The tokens, if any, each with the name of its caller. Their text never appears in an
/// answer, a log line or the page. Every clone shares them, so a reload ([`Guard::replace`])
/// reaches the API, the page and `/mcp` at once.
#[derive(Clone, Default)]
pub struct Guard {
    tokens: Arc<RwLock<Tokens>>,
    /// Counts the reloads ([`Guard::replace`]): what a request was admitted for that goes on
    /// (an event stream) looks again at each ([`Admission::revoked`]).
    reloads: Arc<tokio::sync::watch::Sender<u64>>,
}

type Tokens = Arc<[(String, Box<[u8]>)]>;

fn tokens(named: Vec<(String, String)>) -> Tokens {
    named
        .into_iter()
        .map(|(name, t)| (name, t.into_bytes().into_boxed_slice()))
        .collect()
}

/// What a token file holds: one token (its first line; the caller is `token`), or one named
/// token a line, `NAME: TOKEN` (the caller is NAME). Blank lines and `#` comments are skipped.
/// `Err` names the line at fault.
pub fn read_tokens(text: &str) -> Result<Vec<(String, String)>, String> {
    let lines: Vec<(usize, &str)> = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim()))
        .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'))
        .collect();
    let named = |l: &str| {
        let (name, token) = l.split_once(':')?;
        let (name, token) = (name.trim(), token.trim());
        let ok = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
            && !token.is_empty()
            && !token.contains(char::is_whitespace);
        ok.then(|| (name.to_string(), token.to_string()))
    };
    match lines.as_slice() {
        [] => Err("the token is empty".into()),
        // The one-token form: a first line that names nobody. On a line of its own, `NAME:` is
        // a name only when a space follows it (`prod:Zx81` is a token with a colon in it).
        [(_, first), rest @ ..]
            if named(first).is_none() || (rest.is_empty() && !first.contains(": ")) =>
        {
            match rest.first() {
                None => Ok(vec![(Caller::TOKEN.into(), first.to_string())]),
                Some((n, _)) => Err(format!(
                    "line {n}: a file of one token holds it alone, on its first line (several \
                     tokens are named, one a line, as `NAME: TOKEN`)"
                )),
            }
        }
        _ => {
            let mut tokens: Vec<(String, String)> = Vec::new();
            for (n, l) in lines {
                let Some((name, token)) = named(l) else {
                    return Err(format!(
                        "line {n} is not `NAME: TOKEN` (a file of several tokens names each; \
                         NAME is letters, digits, `_`, `-` or `.`)"
                    ));
                };
                if name == Caller::LOCAL {
                    return Err(format!(
                        "line {n}: the name {name:?} is kept for callers without a token"
                    ));
                }
                if tokens.iter().any(|(other, _)| *other == name) {
                    return Err(format!("line {n}: the name {name:?} is given twice"));
                }
                if tokens.iter().any(|(_, other)| *other == token) {
                    return Err(format!(
                        "line {n}: {name:?} has the same token as another name"
                    ));
                }
                tokens.push((name, token));
            }
            Ok(tokens)
        }
    }
}

impl Guard {
    /// One token, or none; its caller is `token`.
    pub fn new(token: Option<String>) -> Guard {
        Guard::named(
            token
                .map(|t| vec![(Caller::TOKEN.to_string(), t)])
                .unwrap_or_default(),
        )
    }

    /// Named tokens (none: no token is asked).
    pub fn named(named: Vec<(String, String)>) -> Guard {
        Guard {
            tokens: Arc::new(RwLock::new(tokens(named))),
            reloads: Arc::default(),
        }
    }

    /// The tokens as they are now: a request is checked against one set, whole.
    fn now(&self) -> Tokens {
        self.tokens
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    pub fn has_token(&self) -> bool {
        !self.now().is_empty()
    }

    /// Puts `named` in place of the tokens (a token file read again at SIGHUP: a revoked token
    /// stops working, a new one starts). A service that asks for a token goes on asking: an
    /// empty set is refused, the tokens stay. Returns the names now admitted.
    pub fn replace(&self, named: Vec<(String, String)>) -> Result<Vec<String>, String> {
        if named.is_empty() && self.has_token() {
            return Err(
                "no token is left: a service that asks for a token cannot stop asking \
                        while it runs (restart it without one)"
                    .into(),
            );
        }
        let names = named.iter().map(|(name, _)| name.clone()).collect();
        *self
            .tokens
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = tokens(named);
        self.reloads.send_modify(|n| *n += 1);
        Ok(names)
    }

    /// Whether `headers` carry a token (`Authorization: Bearer T`, or the dashboard's
    /// `colony_token` cookie, which the browser sends with its event stream).
    #[cfg(test)]
    pub fn admits(&self, headers: &HeaderMap) -> bool {
        self.presented(headers).admitted()
    }

    /// What `headers` present, checked against one set of tokens whole (a reload between two
    /// looks admitted a request under one set and named its caller under the next).
    pub fn presented(&self, headers: &HeaderMap) -> Presented {
        let tokens = self.now();
        Presented {
            asked: !tokens.is_empty(),
            caller: caller_in(&tokens, headers),
        }
    }

    /// The name of the token `headers` carry, `None` when they carry none of them. Every token
    /// is compared, each in constant time, whichever matches.
    #[cfg(test)]
    pub fn caller(&self, headers: &HeaderMap) -> Option<String> {
        caller_in(&self.now(), headers)
    }
}

/// What a request was admitted with, for a response that goes on after it (an event stream):
/// a token taken out of the file at a reload ends it, as it refuses the next request.
#[derive(Clone)]
pub struct Admission {
    guard: Guard,
    /// The headers that carry a token (`Authorization`, the page's cookie), as presented.
    presented: HeaderMap,
}

impl Admission {
    pub fn of(guard: &Guard, headers: &HeaderMap) -> Admission {
        let mut presented = HeaderMap::new();
        for name in [header::AUTHORIZATION, header::COOKIE] {
            for value in headers.get_all(&name) {
                presented.append(name.clone(), value.clone());
            }
        }
        Admission {
            guard: guard.clone(),
            presented,
        }
    }

    /// Waits until a reload leaves what this request presented admitted no more.
    pub async fn revoked(self) {
        let mut reloads = self.guard.reloads.subscribe();
        while reloads.changed().await.is_ok() {
            if !self.guard.presented(&self.presented).admitted() {
                return;
            }
        }
        std::future::pending::<()>().await
    }
}

/// What a request presents ([`Guard::presented`]).
pub struct Presented {
    /// Whether the service asks for a token.
    pub asked: bool,
    /// The name of the token it carries, if it carries one of the service's.
    pub caller: Option<String>,
}

impl Presented {
    pub fn admitted(&self) -> bool {
        !self.asked || self.caller.is_some()
    }
}

/// The name of the token of `tokens` that `headers` carry.
fn caller_in(tokens: &Tokens, headers: &HeaderMap) -> Option<String> {
    // The scheme's name is case-insensitive (RFC 9110): `bearer T` was refused.
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim_start().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim().to_string());
    let cookie = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().strip_prefix("colony_token="))
        .next();
    // The page stores the token as `encodeURIComponent` writes it: a token with `+`, `/` or
    // `=` (base64) was never read back. Both forms are tried.
    let decoded = cookie.and_then(|c| {
        percent_encoding::percent_decode_str(c)
            .decode_utf8()
            .ok()
            .filter(|d| d != c)
            .map(|d| d.into_owned())
    });
    let mut found = None;
    let given = [bearer, cookie.map(str::to_string), decoded];
    for given in given.iter().flatten() {
        for (name, token) in tokens.iter() {
            if bool::from(given.as_bytes().ct_eq(token)) && found.is_none() {
                found = Some(name.clone());
            }
        }
    }
    found
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

/// Whether `host` (a `Host` header: a name or address, and a port) names this machine's
/// loopback: `localhost` (or a name under `.localhost`), `127.x.x.x` or `[::1]`. A service
/// without a token answers only such names: a page that renamed itself to point at 127.0.0.1
/// (DNS rebinding) sends its own name as the `Host`, and as its own `Origin`, so the origin
/// check alone let it drive the API.
pub fn loopback_host(host: &str) -> bool {
    let name = match host.rsplit_once(':') {
        // `[::1]:7878`, `[::1]`, `localhost:7878`, `127.0.0.1:7878`
        Some((name, port)) if !name.ends_with(':') && port.bytes().all(|b| b.is_ascii_digit()) => {
            name
        }
        _ => host,
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    let bare = name.trim_start_matches('[').trim_end_matches(']');
    name == "localhost"
        || name.ends_with(".localhost")
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Who made a request, as the rate limits name it ([`super::rate`]): the name of the token it
/// presented, put in the request's extensions once its token is checked.
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
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok());
    let presented = guard.presented(request.headers());
    if !presented.asked && host.is_some_and(|h| !loopback_host(h)) {
        return refuse(
            StatusCode::FORBIDDEN,
            "forbidden",
            "a service without a token answers only its loopback names (localhost, 127.0.0.1, \
             [::1]); give it a token (--token-file) to reach it by another name",
        );
    }
    if !presented.admitted() {
        let mut answer = refuse(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            if other_scheme(request.headers()) {
                // `Basic ...` was told "the bearer token is not one of this service's".
                "the Authorization header is not a bearer token (Authorization: Bearer ...)"
            } else if carries_a_token(request.headers()) {
                "the bearer token is not one of this service's"
            } else {
                "a bearer token is required (Authorization: Bearer ...)"
            },
        );
        answer.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            "Bearer".parse().expect("a header"),
        );
        return answer;
    }
    let caller = presented
        .caller
        .unwrap_or_else(|| Caller::LOCAL.to_string());
    request.extensions_mut().insert(Caller(caller));
    // For a response that goes on (an event stream) to look again at each reload.
    request.extensions_mut().insert(guard);
    next.run(request).await
}

/// Whether the request's `Authorization` is of another scheme than `Bearer` (`Basic`, say),
/// and no token cookie came with it.
fn other_scheme(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return false;
    };
    let bearer = value
        .to_str()
        .ok()
        .and_then(|v| v.split_whitespace().next())
        .is_some_and(|scheme| scheme.eq_ignore_ascii_case("bearer"));
    !bearer && !has_token_cookie(headers)
}

fn has_token_cookie(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.split(';').any(|c| c.trim().starts_with("colony_token=")))
}

/// Whether a request presents a token at all (a header, or the page's cookie), right or
/// wrong: a wrong one is told so, not that one is missing.
pub fn carries_a_token(headers: &HeaderMap) -> bool {
    headers.contains_key(header::AUTHORIZATION) || has_token_cookie(headers)
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
    fn each_named_token_is_its_callers_and_one_line_is_the_one_token_form() {
        let g = Guard::named(read_tokens("# who\nalice: tok-a-123\n\nbob: tok-b-456\n").unwrap());
        let bearer = |t: &str| headers(&[("authorization", &format!("Bearer {t}"))]);
        assert_eq!(g.caller(&bearer("tok-a-123")).as_deref(), Some("alice"));
        assert_eq!(g.caller(&bearer("tok-b-456")).as_deref(), Some("bob"));
        assert_eq!(g.caller(&bearer("tok-b-45")), None);
        assert!(!g.admits(&bearer("alice")));
        assert_eq!(
            read_tokens("s3cret-token\n").unwrap(),
            vec![("token".to_string(), "s3cret-token".to_string())]
        );
        let err = |t: &str| read_tokens(t).unwrap_err();
        assert!(err("").contains("empty"));
        assert!(err("alice: a\nplain\n").contains("line 2"));
        assert!(err("alice: a\nalice: b\n").contains("twice"));
        assert!(err("alice: a\nbob: a\n").contains("same token"));
        assert!(err("local: a\nbob: b\n").contains("kept"));
    }

    #[test]
    fn a_replaced_token_is_refused_and_every_clone_sees_the_new_one() {
        let g = Guard::named(read_tokens("alice: tok-a-123\nbob: tok-b-456\n").unwrap());
        let shared = g.clone();
        let bearer = |t: &str| headers(&[("authorization", &format!("Bearer {t}"))]);
        let names = g
            .replace(read_tokens("alice: tok-a-789\n").unwrap())
            .unwrap();
        assert_eq!(names, ["alice"]);
        assert_eq!(shared.caller(&bearer("tok-a-123")), None);
        assert_eq!(shared.caller(&bearer("tok-b-456")), None);
        assert_eq!(
            shared.caller(&bearer("tok-a-789")).as_deref(),
            Some("alice")
        );
        let e = g.replace(Vec::new()).unwrap_err();
        assert!(e.contains("no token is left"), "{e}");
        assert!(!shared.admits(&headers(&[])), "the token is still asked");
        assert!(shared.admits(&bearer("tok-a-789")));
    }

    #[test]
    fn a_base64_token_is_read_from_the_cookie_the_page_writes_and_the_scheme_in_any_case() {
        let g = Guard::new(Some("q7Zx+/abc9==".into()));
        for admitted in [
            ("authorization", "Bearer q7Zx+/abc9=="),
            ("authorization", "bearer q7Zx+/abc9=="),
            ("authorization", "BEARER  q7Zx+/abc9=="),
            // `encodeURIComponent`'s form, and the raw one.
            ("cookie", "colony_token=q7Zx%2B%2Fabc9%3D%3D"),
            ("cookie", "colony_token=q7Zx+/abc9=="),
        ] {
            assert!(g.admits(&headers(&[admitted])), "{admitted:?}");
        }
        for refused in [
            ("authorization", "Basic q7Zx+/abc9=="),
            ("cookie", "colony_token=q7Zx%2B%2Fabc9%3D"),
        ] {
            assert!(!g.admits(&headers(&[refused])), "{refused:?}");
        }
    }

    #[test]
    fn a_token_file_of_one_line_may_hold_a_colon_and_holds_nothing_else() {
        assert_eq!(
            read_tokens("prod:Zx81kq\n").unwrap(),
            vec![("token".to_string(), "prod:Zx81kq".to_string())]
        );
        assert_eq!(
            read_tokens("prod: Zx81kq\n").unwrap(),
            vec![("prod".to_string(), "Zx81kq".to_string())]
        );
        let e = read_tokens("Zx81kq\nmade on Monday\n").unwrap_err();
        assert!(
            e.starts_with("line 2: a file of one token holds it alone"),
            "{e}"
        );
    }

    #[test]
    fn only_loopback_names_are_loopback_hosts() {
        for host in [
            "localhost",
            "localhost:7878",
            "LOCALHOST.:7878",
            "colony.localhost:7878",
            "127.0.0.1:7878",
            "127.1.2.3",
            "[::1]:7878",
            "[::1]",
        ] {
            assert!(loopback_host(host), "{host}");
        }
        for host in [
            "attacker.example:7878",
            "localhost.attacker.example",
            "10.0.0.1:7878",
            "[::2]:7878",
            "0.0.0.0:7878",
        ] {
            assert!(!loopback_host(host), "{host}");
        }
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
