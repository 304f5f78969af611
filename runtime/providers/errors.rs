//! Errors of a model call, classified once, at the provider.
//!
//! Everything above the wire sees only these variants: retry middleware asks [`ProviderError::is_transient`]
//! and [`ProviderError::retry_after`], Lua sees [`ProviderError::kind`] and the message. A message
//! never carries a key: [`crate::secrets::redact`] runs over every body before it lands here.

use std::time::Duration;

use reqwest::header::HeaderMap;
use serde_json::Value;

use crate::secrets;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProviderError {
    /// Bad settings: an unknown provider, a missing key, a bad base URL found before any
    /// request; a base URL that redirects to another host, an answer past `max_response_bytes`
    /// found by one. Trying again meets the same.
    #[error("{0}")]
    Config(String),
    /// 401 / 403: the key is missing, wrong or lacks permission.
    #[error("authentication failed ({status}): {message}")]
    Auth { status: u16, message: String },
    /// Any other refusal of the request itself (4xx): not worth retrying unchanged.
    #[error("API error {status}: {message}")]
    Api {
        status: u16,
        message: String,
        body: String,
    },
    /// The request never got an answer: connect, timeout, reset.
    #[error("request failed: {0}")]
    Fetch(String),
    /// The answer could not be understood.
    #[error("could not parse the response: {0}")]
    Parse(String),
    /// The provider failed to serve (rate limit, overload, 5xx, mid-stream error).
    #[error("provider error{}: {message}", status.map(|s| format!(" {s}")).unwrap_or_default())]
    Provider {
        status: Option<u16>,
        message: String,
        transient: bool,
        retry_after: Option<Duration>,
    },
    /// A replay cassette has no recorded exchange for this request.
    #[error("{0}")]
    CassetteMiss(String),
    /// Not asked: whoever pays for the call (a resident whose source or tool makes it) is over
    /// its budget until its window resets.
    #[error("{0}")]
    Budget(String),
}

impl ProviderError {
    /// The neutral name Lua and logs see (`auth_error`, `api_error`, ...).
    pub fn kind(&self) -> &'static str {
        match self {
            ProviderError::Config(_) => "config_error",
            ProviderError::Auth { .. } => "auth_error",
            ProviderError::Api { .. } => "api_error",
            ProviderError::Fetch(_) => "fetch_error",
            ProviderError::Parse(_) => "parse_error",
            ProviderError::Provider { .. } => "provider_error",
            ProviderError::CassetteMiss(_) => "cassette_miss",
            ProviderError::Budget(_) => "budget",
        }
    }

    /// Worth trying again unchanged after a pause.
    pub fn is_transient(&self) -> bool {
        match self {
            ProviderError::Fetch(_) => true,
            ProviderError::Provider { transient, .. } => *transient,
            _ => false,
        }
    }

    /// Waiting will not help: the request or the settings behind it must change first (a key
    /// refused, a request refused as it stands, a model or provider that is not there, a
    /// cassette without this request, a whole 2xx answer that is not the API's: a base URL
    /// that points at a web page or at another provider's API). A resident with such an error
    /// is blocked, not in an outage. An answer cut off is a [`ProviderError::Fetch`], and
    /// transient. Neither this nor [`ProviderError::is_transient`]: a quota that clears only
    /// later; it is waited out like an outage.
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            ProviderError::Config(_)
                | ProviderError::Auth { .. }
                | ProviderError::Api { .. }
                | ProviderError::CassetteMiss(_)
                | ProviderError::Parse(_)
        )
    }

    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            ProviderError::Provider { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    pub fn status(&self) -> Option<u16> {
        match self {
            ProviderError::Auth { status, .. } | ProviderError::Api { status, .. } => Some(*status),
            ProviderError::Provider { status, .. } => *status,
            _ => None,
        }
    }

    /// The error with every key and credential taken out of its texts. A provider's answer can
    /// quote the key anywhere (a login page answered with 200, an error event mid-stream, a
    /// chunk that is not JSON): the call's result passes through this once, whatever made it.
    pub fn redacted(self) -> ProviderError {
        let r = |s: String| secrets::redact(&s);
        match self {
            ProviderError::Config(m) => ProviderError::Config(r(m)),
            ProviderError::Auth { status, message } => ProviderError::Auth {
                status,
                message: r(message),
            },
            ProviderError::Api {
                status,
                message,
                body,
            } => ProviderError::Api {
                status,
                message: r(message),
                body: r(body),
            },
            ProviderError::Fetch(m) => ProviderError::Fetch(r(m)),
            ProviderError::Parse(m) => ProviderError::Parse(r(m)),
            ProviderError::Provider {
                status,
                message,
                transient,
                retry_after,
            } => ProviderError::Provider {
                status,
                message: r(message),
                transient,
                retry_after,
            },
            ProviderError::CassetteMiss(m) => ProviderError::CassetteMiss(r(m)),
            ProviderError::Budget(m) => ProviderError::Budget(m),
        }
    }

    /// An answer that says the model failed (Gemini's `MALFORMED_FUNCTION_CALL`, `OTHER`: a
    /// [`crate::vocab::Stop::Error`] without calls), as the transient error it is to a caller:
    /// taken as the reply, the botched call's text reached `ai.ask`, a chat and a resident's
    /// `deliver_to` as if the model had said it, with no error beside `stop = "error"`.
    pub fn failed_answer(inferred: &crate::vocab::Inferred) -> Option<ProviderError> {
        let failed = inferred.stop == crate::vocab::Stop::Error
            && inferred.message.tool_calls().next().is_none();
        failed.then(|| {
            // Gemini appends the reason as a part of its own after what the model said: read
            // together they ran into one word ("hello from fakeOTHER").
            let texts: Vec<&str> = inferred
                .message
                .parts
                .iter()
                .filter_map(|p| match p {
                    crate::vocab::Part::Text { text, .. } if !text.trim().is_empty() => {
                        Some(text.as_str())
                    }
                    _ => None,
                })
                .collect();
            let message = match texts.as_slice() {
                [] => "the model's answer failed".to_string(),
                [only] => format!("the model's answer failed: {only}"),
                [said @ .., why] => {
                    format!("the model's answer failed ({why}): {}", said.join(" "))
                }
            };
            ProviderError::Provider {
                status: None,
                message,
                transient: true,
                retry_after: None,
            }
        })
    }

    pub fn fetch(err: &reqwest::Error) -> ProviderError {
        let msg = unsent(err);
        // A redirect refused (to another host, or past ten) is the base URL's to mend: trying
        // again meets the same redirect (a resident sat in an outage for good).
        if err.is_redirect() {
            return ProviderError::Config(msg);
        }
        ProviderError::Fetch(msg)
    }
}

/// Why a request got no answer, with every cause ("error sending request for url (...): client
/// error (Connect): tcp connect error: Connection refused"), secrets redacted: reqwest's Display
/// includes the URL, which may carry a key in a query string (Gemini).
pub fn unsent(err: &reqwest::Error) -> String {
    let mut msg = secrets::redact(&err.to_string());
    let mut source = std::error::Error::source(err);
    while let Some(s) = source {
        msg.push_str(": ");
        msg.push_str(&secrets::redact(&s.to_string()));
        source = s.source();
    }
    msg
}

/// What a style module found in an error body: the human message, the provider's error type or
/// code (`overloaded_error`, `insufficient_quota`, `RESOURCE_EXHAUSTED`), and a wait named in the
/// body (Gemini's `RetryInfo.retryDelay`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ErrorBody {
    pub message: String,
    pub code: String,
    pub retry_after: Option<Duration>,
    /// The body says the limit will not clear soon (a daily quota, a spend limit).
    pub exhausted: bool,
}

/// Reads the three styles' error bodies (they differ enough to tell apart by shape):
/// Anthropic `{"type":"error","error":{"type","message"}}`, OpenAI `{"error":{"message","type","code"}}`,
/// Gemini `{"error":{"code","message","status","details"}}` (or a one-element array of that).
pub fn read_error_body(body: &str) -> ErrorBody {
    let parsed: Option<Value> = serde_json::from_str(body).ok();
    let root = match &parsed {
        Some(Value::Array(items)) => items.first(),
        other => other.as_ref(),
    };
    let Some(err) = root.and_then(|v| v.get("error")) else {
        let trimmed = body.trim();
        return ErrorBody {
            message: if trimmed.is_empty() {
                "(empty body)".into()
            } else {
                summarise_body(trimmed).unwrap_or_else(|| truncate(trimmed, 500))
            },
            ..Default::default()
        };
    };
    if let Some(s) = err.as_str() {
        return ErrorBody {
            message: s.to_string(),
            ..Default::default()
        };
    }
    let message = err
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    // OpenAI puts the telling word in `code` (insufficient_quota) and a family in `type`;
    // Anthropic in `type`; Gemini in `status`.
    let code = ["code", "type", "status"]
        .iter()
        .filter_map(|k| err.get(*k).and_then(Value::as_str))
        .find(|s| !s.is_empty())
        .unwrap_or("")
        .to_string();
    let mut retry_after = None;
    let mut exhausted = false;
    if let Some(details) = err.get("details").and_then(Value::as_array) {
        for d in details {
            if let Some(delay) = d.get("retryDelay").and_then(Value::as_str) {
                retry_after = parse_duration(delay);
            }
            for v in d
                .get("violations")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let id = v.get("quotaId").and_then(Value::as_str).unwrap_or("");
                if id.contains("PerDay") {
                    exhausted = true;
                }
            }
        }
    }
    let lower = format!("{code} {message}").to_lowercase();
    if lower.contains("insufficient_quota")
        || lower.contains("spend limit")
        // Anthropic's: "You have reached your specified API usage limits. You will regain
        // access on ..." (a 429 without retry-after, retried as if it would pass).
        || lower.contains("usage limits")
        || lower.contains("credit balance")
        || lower.contains("billing")
    {
        exhausted = true;
    }
    if retry_after.is_none() {
        retry_after = wait_in_message(&message);
    }
    ErrorBody {
        message,
        code,
        retry_after,
        exhausted,
    }
}

/// Turns an HTTP error answer into a [`ProviderError`].
pub fn classify(status: u16, headers: &HeaderMap, body: &str) -> ProviderError {
    let body = secrets::redact(body);
    let read = read_error_body(&body);
    let message = if read.code.is_empty() {
        read.message.clone()
    } else {
        format!("{} ({})", read.message, read.code)
    };
    let retry_after = retry_after_header(headers).or(read.retry_after);
    match status {
        401 | 403 => ProviderError::Auth { status, message },
        // Gemini answers a wrong key 400 INVALID_ARGUMENT, its reason API_KEY_INVALID: a key
        // refused, as 401 is elsewhere.
        400 if body.contains("API_KEY_INVALID") => ProviderError::Auth { status, message },
        // However long the server asks to wait, the failure is still one that passes: the wait
        // is the caller's to cap (`with_retries`' `cap_ms`, a resident's outage backoff).
        408 | 409 | 429 | 500..=599 => ProviderError::Provider {
            status: Some(status),
            message,
            transient: !read.exhausted,
            retry_after,
        },
        _ if read.code.contains("overloaded") => ProviderError::Provider {
            status: Some(status),
            message,
            transient: true,
            retry_after,
        },
        _ => ProviderError::Api {
            status,
            message,
            body: truncate(&body, 2000),
        },
    }
}

/// An error delivered inside a 200 stream (Anthropic `event: error`, an OpenAI chunk with an
/// `error` key). Overload and rate limits stay transient; anything else is an API error.
pub fn classify_stream_error(payload: &Value) -> ProviderError {
    let read = read_error_body(&payload.to_string());
    let lower = format!("{} {}", read.code, read.message).to_lowercase();
    let transient_words = [
        "overloaded",
        "rate_limit",
        "rate limit",
        "server_error",
        "api_error",
        "unavailable",
        "internal",
        "resource_exhausted",
    ];
    let message = if read.code.is_empty() {
        read.message
    } else {
        format!("{} ({})", read.message, read.code)
    };
    if !read.exhausted && transient_words.iter().any(|w| lower.contains(w)) {
        ProviderError::Provider {
            status: None,
            message: format!("mid-stream: {message}"),
            transient: true,
            retry_after: read.retry_after,
        }
    } else {
        ProviderError::Api {
            status: 200,
            message: format!("mid-stream: {message}"),
            body: truncate(&payload.to_string(), 2000),
        }
    }
}

/// `retry-after-ms` (milliseconds), then `retry-after`: seconds, or an HTTP date (RFC 9110
/// §10.2.3), read as the time left until then. A value that is no duration (negative, NaN,
/// unreadable) is ignored; one past the longest duration is that longest ([`crate::duration::MAX`]),
/// which the retry's cap then bounds: ignored, a server asking for a very long pause was retried
/// at once.
pub fn retry_after_header(headers: &HeaderMap) -> Option<Duration> {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let at_most_max = |d: Result<Duration, crate::duration::DurationError>| match d {
        Err(crate::duration::DurationError::TooLong(_)) => Some(crate::duration::MAX),
        d => d.ok(),
    };
    if let Some(ms) = get("retry-after-ms").and_then(|v| v.trim().parse::<f64>().ok()) {
        return at_most_max(crate::duration::millis(ms));
    }
    let value = get("retry-after")?.trim();
    if let Ok(secs) = value.parse::<f64>() {
        return at_most_max(crate::duration::seconds(secs));
    }
    // The HTTP-date form: the wait is until then (a date already past means "now"), at most
    // the longest duration as the seconds' form is (a date in 2099 made a `retry_after` that
    // `ai.sleep` refused).
    let when = httpdate::parse_http_date(value).ok()?;
    Some(
        when.duration_since(std::time::SystemTime::now())
            .unwrap_or(Duration::ZERO)
            .min(crate::duration::MAX),
    )
}

/// Durations as providers write them: `47s`, `0.5s`, `84ms`, `6m0s`, `1h2m3s` (read by
/// [`crate::duration::with_units`]; a bare number is not one).
pub fn parse_duration(text: &str) -> Option<Duration> {
    crate::duration::with_units(text).ok()
}

/// OpenAI's "Please try again in 84ms" / "in 1.5s".
fn wait_in_message(message: &str) -> Option<Duration> {
    let at = message.find("try again in ")? + "try again in ".len();
    let rest = &message[at..];
    let end = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '.'))
        .unwrap_or(rest.len());
    parse_duration(rest[..end].trim_end_matches('.'))
}

/// How much of a page a summary keeps.
const SUMMARY_CHARS: usize = 200;

/// A body that is not a provider's JSON error (a proxy's HTML page, a server's text), shortened
/// for a message: an HTML page's `<title>` (else its first line of text), any other body's
/// first non-empty line, at most [`SUMMARY_CHARS`] characters. `None` for a body of one short
/// line, which is shown as it is.
pub fn summarise_body(body: &str) -> Option<String> {
    let body = body.trim();
    let html = {
        let head = body
            .get(..body.len().min(512))
            .unwrap_or(body)
            .to_lowercase();
        head.starts_with('<')
            && ["<html", "<!doctype", "<head", "<body", "<title"]
                .iter()
                .any(|t| head.contains(t))
    };
    if !html && !body.contains('\n') && body.chars().count() <= SUMMARY_CHARS {
        return None;
    }
    let text = if html {
        html_title(body).unwrap_or_else(|| first_line(&strip_tags(body)))
    } else {
        first_line(body)
    };
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    Some(if text.chars().count() > SUMMARY_CHARS {
        format!(
            "{}...",
            text.chars().take(SUMMARY_CHARS).collect::<String>()
        )
    } else if text.is_empty() {
        "(a page without text)".to_string()
    } else {
        text
    })
}

fn html_title(page: &str) -> Option<String> {
    let lower = page.to_lowercase();
    let open = lower.find("<title")?;
    let start = open + lower[open..].find('>')? + 1;
    let end = start + lower[start..].find("</title")?;
    let title = page.get(start..end)?.trim();
    (!title.is_empty()).then(|| title.to_string())
}

fn strip_tags(page: &str) -> String {
    let mut out = String::with_capacity(page.len());
    let mut in_tag = false;
    for c in page.chars() {
        match c {
            '<' => in_tag = true,
            '>' if in_tag => {
                in_tag = false;
                out.push('\n');
            }
            c if !in_tag => out.push(c),
            _ => {}
        }
    }
    out
}

fn first_line(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("")
        .to_string()
}

impl ProviderError {
    /// An authentication failure says whose key was refused, and where: with use-types on
    /// several providers, "invalid x-api-key" did not say which key to mend.
    pub fn naming_the_key(self, provider: &str, url: &str) -> ProviderError {
        let mut e = self;
        if let ProviderError::Auth { message, .. } = &mut e {
            let host = reqwest::Url::parse(url)
                .ok()
                .and_then(|u| {
                    let host = u.host_str()?.to_string();
                    Some(match u.port() {
                        Some(port) => format!("{host}:{port}"),
                        None => host,
                    })
                })
                .unwrap_or_default();
            message.push_str(&format!(" (the key sent to {provider} at {host})"));
        }
        e
    }

    /// Says where a refused request went when the answer was not the provider's own JSON error
    /// (an HTML page, a proxy's text) or was a 404: the URL's path, and a hint where the mistake
    /// is a known one. A key never appears: only the path is shown, never the query.
    pub fn located(self, url: &str, body: &str) -> ProviderError {
        let path = reqwest::Url::parse(url)
            .map(|u| u.path().to_string())
            .unwrap_or_default();
        let status = self.status();
        let providers_own = serde_json::from_str::<Value>(body).is_ok_and(|v| {
            let root = match &v {
                Value::Array(items) => items.first(),
                other => Some(other),
            };
            root.and_then(|r| r.get("error")).is_some()
        });
        if path.is_empty() || (providers_own && status != Some(404)) {
            return self;
        }
        let hint = match status {
            Some(404) if path.ends_with("/models") => {
                Some("this server lists no models; set `model` yourself")
            }
            Some(404) if path.ends_with("/chat/completions") && !path.contains("/v1") => {
                Some("OpenAI-compatible base URLs usually end in /v1")
            }
            // Anthropic's SDK reads `ANTHROPIC_BASE_URL` without the version; colony's base URL
            // holds it, as it does for every provider.
            Some(404) if path.ends_with("/messages") && !path.contains("/v1") => {
                Some("Anthropic base URLs end in /v1")
            }
            Some(404)
                if path.contains(":generateContent") || path.contains(":streamGenerateContent") =>
            {
                (!path.contains("/v1")).then_some("Gemini base URLs end in /v1beta")
            }
            _ => None,
        };
        let place = match hint {
            Some(h) => format!(" (at {path}; {h})"),
            None => format!(" (at {path})"),
        };
        let mut e = self;
        match &mut e {
            ProviderError::Auth { message, .. }
            | ProviderError::Api { message, .. }
            | ProviderError::Provider { message, .. } => message.push_str(&place),
            _ => {}
        }
        e
    }
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_in_provider_notation() {
        assert_eq!(parse_duration("47s"), Some(Duration::from_secs(47)));
        assert_eq!(parse_duration("84ms"), Some(Duration::from_millis(84)));
        assert_eq!(parse_duration("6m0s"), Some(Duration::from_secs(360)));
        assert_eq!(parse_duration("0.5s"), Some(Duration::from_millis(500)));
        assert_eq!(parse_duration("soon"), None);
        assert_eq!(parse_duration("12"), None);
    }

    #[test]
    fn waiting_helps_or_the_settings_must_change() {
        let h = HeaderMap::new();
        for status in [401, 403, 400, 404] {
            assert!(classify(status, &h, "{}").is_permanent(), "{status}");
        }
        for status in [429, 500, 503, 529] {
            let e = classify(status, &h, "{}");
            assert!(e.is_transient() && !e.is_permanent(), "{status}");
        }
        let overloaded =
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
        assert!(!classify(400, &h, overloaded).is_permanent());
        assert!(!ProviderError::Fetch("connection refused".into()).is_permanent());
        assert!(ProviderError::CassetteMiss("no exchange".into()).is_permanent());
        assert!(ProviderError::Config("no provider".into()).is_permanent());
        let page = ProviderError::Parse("chat completion is not JSON".into());
        assert!(page.is_permanent() && !page.is_transient());
    }

    #[test]
    fn openai_quota_is_not_transient() {
        let body = r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#;
        let e = classify(429, &HeaderMap::new(), body);
        assert_eq!(e.kind(), "provider_error");
        assert!(!e.is_transient());
    }

    #[test]
    fn openai_rate_limit_waits_from_message() {
        let body = r#"{"error":{"message":"Rate limit reached. Please try again in 84ms.","type":"requests","code":"rate_limit_exceeded"}}"#;
        let e = classify(429, &HeaderMap::new(), body);
        assert!(e.is_transient());
        assert_eq!(e.retry_after(), Some(Duration::from_millis(84)));
    }

    #[test]
    fn a_wait_past_a_year_is_a_year_not_none() {
        // Ignored, it let the retries go at once; the retry's cap bounds the wait it asks for.
        let wait = |name: &str, value: &str| {
            let mut h = HeaderMap::new();
            h.insert(
                reqwest::header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
            retry_after_header(&h)
        };
        let year = Some(crate::duration::MAX);
        assert_eq!(wait("retry-after", "1000000000"), year);
        assert_eq!(wait("retry-after-ms", "999999999999999"), year);
        assert_eq!(wait("retry-after", "-5"), None);
        assert_eq!(wait("retry-after", "soon"), None);
        assert_eq!(wait("retry-after", "2"), Some(Duration::from_secs(2)));
        // The date form too: one in 2099 was its whole distance, past what ai.sleep takes.
        assert_eq!(wait("retry-after", "Wed, 21 Oct 2099 07:28:00 GMT"), year);
    }

    /// Anthropic's spend limit (a 429 without retry-after) does not pass with a retry, and
    /// Gemini's wrong key (400, reason API_KEY_INVALID) is a key refused.
    #[test]
    fn a_spend_limit_is_not_transient_and_a_gemini_bad_key_is_auth() {
        let spend = r#"{"type":"error","error":{"type":"rate_limit_error","message":"You have reached your specified API usage limits. You will regain access on 2027-01-01 at 00:00 UTC."}}"#;
        let e = classify(429, &HeaderMap::new(), spend);
        assert!(!e.is_transient(), "{e:?}");
        let bad_key = r#"{"error":{"code":400,"message":"API key not valid. Please pass a valid API key.","status":"INVALID_ARGUMENT","details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"API_KEY_INVALID","domain":"googleapis.com"}]}}"#;
        let e = classify(400, &HeaderMap::new(), bad_key);
        assert_eq!(e.kind(), "auth_error", "{e:?}");
        assert!(e.to_string().contains("API key not valid"), "{e}");
    }

    #[test]
    fn header_wins_over_body() {
        let mut h = HeaderMap::new();
        h.insert("retry-after-ms", "250".parse().unwrap());
        h.insert("retry-after", "3".parse().unwrap());
        assert_eq!(retry_after_header(&h), Some(Duration::from_millis(250)));
    }

    #[test]
    fn an_html_page_is_summarised_with_its_title_path_and_hint() {
        let page = "<!DOCTYPE html>\n<html><head><title>404 Not Found</title></head>\n\
                    <body><h1>Not Found</h1><p>The requested URL was not found.</p></body></html>";
        let e = classify(404, &HeaderMap::new(), page)
            .located("http://127.0.0.1:8080/chat/completions", page);
        assert_eq!(
            e.to_string(),
            "API error 404: 404 Not Found (at /chat/completions; OpenAI-compatible base URLs \
             usually end in /v1)"
        );
        let e = classify(404, &HeaderMap::new(), page).located("http://h/v1/models", page);
        assert_eq!(
            e.to_string(),
            "API error 404: 404 Not Found (at /v1/models; this server lists no models; set \
             `model` yourself)"
        );
        // The same missing version for Anthropic and Gemini was a bare 404.
        let e = classify(404, &HeaderMap::new(), "").located("http://h/messages", "");
        assert!(
            e.to_string()
                .ends_with("(at /messages; Anthropic base URLs end in /v1)"),
            "{e}"
        );
        let e = classify(404, &HeaderMap::new(), "")
            .located("http://h/models/gemini-2.5-flash:generateContent", "");
        assert!(
            e.to_string().ends_with("Gemini base URLs end in /v1beta)"),
            "{e}"
        );
        let e = classify(404, &HeaderMap::new(), "")
            .located("http://h/v1beta/models/m:generateContent", "");
        assert!(!e.to_string().contains("Gemini base URLs"), "{e}");
        // A page without a title: its first line of text.
        let page = "<html><body>\n<h1>Bad gateway</h1>\n<p>upstream down</p></body></html>";
        let e = classify(502, &HeaderMap::new(), page).located("http://h/v1/messages", page);
        assert_eq!(
            e.to_string(),
            "provider error 502: Bad gateway (at /v1/messages)"
        );
        // Text of several lines: the first, at most 200 characters.
        let text = format!("{}\nsecond line", "x".repeat(300));
        let e = classify(400, &HeaderMap::new(), &text).located("http://h/v1/messages", &text);
        assert_eq!(
            e.to_string(),
            format!("API error 400: {}... (at /v1/messages)", "x".repeat(200))
        );
        // The provider's own JSON error is left as it is.
        let body = r#"{"error":{"message":"bad","type":"invalid_request_error"}}"#;
        let e = classify(400, &HeaderMap::new(), body).located("http://h/v1/x", body);
        assert_eq!(e.to_string(), "API error 400: bad (invalid_request_error)");
    }

    #[test]
    fn auth_and_plain_api_errors() {
        let body = r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#;
        assert_eq!(classify(401, &HeaderMap::new(), body).kind(), "auth_error");
        let body = r#"{"type":"error","error":{"type":"invalid_request_error","message":"bad"}}"#;
        let e = classify(400, &HeaderMap::new(), body);
        assert_eq!(e.kind(), "api_error");
        assert!(e.to_string().contains("bad (invalid_request_error)"));
    }
}
