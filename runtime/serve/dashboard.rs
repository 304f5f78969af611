//! The page at `/`: plain HTML, CSS and JavaScript compiled into the binary (no build step, no
//! external assets), driven by the API and `/api/events`.

use axum::http::header;
use axum::response::{IntoResponse, Response};

const PAGE: &str = include_str!("dashboard.html");

pub async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; style-src 'self' 'unsafe-inline'; script-src 'self' 'unsafe-inline'",
            ),
        ],
        PAGE,
    )
        .into_response()
}
