//! What is read of an HTTP answer: at most a limit.
//!
//! A server that answers an endless or huge body (a misbehaving proxy, a hostile endpoint) would
//! otherwise be read whole into memory. Model answers stop at the use-type's
//! `max_response_bytes` ([`DEFAULT_MAX_RESPONSE_BYTES`]), Lua's `http` at its `max_bytes`; past
//! the limit the read ends with [`BodyError::TooLarge`] and the caller reports a `fetch_error`
//! naming the limit. Streams are counted as they arrive, so an endless SSE stream ends too.

use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt};

/// The most of a model's answer read by default: 64 MiB, far above any real answer (a long
/// answer with reasoning is a few MiB of JSON).
pub const DEFAULT_MAX_RESPONSE_BYTES: u64 = 64 << 20;

/// Why a body could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// More than `limit` bytes came (or the server announced more).
    #[error("the answer is larger than the limit of {}", describe_limit(*.0))]
    TooLarge(u64),
    #[error(transparent)]
    Transport(#[from] reqwest::Error),
}

/// `67108864 bytes (64 MiB)`: the exact number a setting takes, and its size in words.
pub fn describe_limit(limit: u64) -> String {
    const MIB: u64 = 1 << 20;
    const KIB: u64 = 1 << 10;
    if limit >= MIB && limit.is_multiple_of(MIB) {
        format!("{limit} bytes ({} MiB)", limit / MIB)
    } else if limit >= KIB && limit.is_multiple_of(KIB) {
        format!("{limit} bytes ({} KiB)", limit / KIB)
    } else {
        format!("{limit} bytes")
    }
}

/// The whole body, if it is at most `limit` bytes. A `Content-Length` above the limit fails
/// before anything is read.
pub async fn read(response: reqwest::Response, limit: u64) -> Result<Bytes, BodyError> {
    if response.content_length().is_some_and(|n| n > limit) {
        return Err(BodyError::TooLarge(limit));
    }
    // Sized once when the length is announced: grown by doubling, a body near the limit held
    // up to twice its size while it was copied.
    let announced = response.content_length().unwrap_or(0).min(limit);
    let mut chunks = stream(response, limit);
    let mut out = BytesMut::with_capacity(usize::try_from(announced).unwrap_or(0));
    while let Some(chunk) = chunks.next().await {
        out.extend_from_slice(&chunk?);
    }
    Ok(out.freeze())
}

/// The body as a stream of chunks that fails with [`BodyError::TooLarge`] once more than
/// `limit` bytes have come through, and ends there.
pub fn stream(
    response: reqwest::Response,
    limit: u64,
) -> impl Stream<Item = Result<Bytes, BodyError>> + Unpin + Send {
    // The state: bytes seen so far, or `None` once the limit was passed (the stream then ends).
    let counted = response
        .bytes_stream()
        .scan(Some(0u64), move |seen, chunk| {
            let item = match (seen.as_mut(), chunk) {
                (None, _) => None,
                (Some(_), Err(e)) => Some(Err(BodyError::Transport(e))),
                (Some(n), Ok(bytes)) => {
                    *n = n.saturating_add(bytes.len() as u64);
                    if *n > limit {
                        *seen = None;
                        Some(Err(BodyError::TooLarge(limit)))
                    } else {
                        Some(Ok(bytes))
                    }
                }
            };
            std::future::ready(item)
        });
    Box::pin(counted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_named_exactly_and_in_words() {
        assert_eq!(
            describe_limit(DEFAULT_MAX_RESPONSE_BYTES),
            "67108864 bytes (64 MiB)"
        );
        assert_eq!(describe_limit(2048), "2048 bytes (2 KiB)");
        assert_eq!(describe_limit(1000), "1000 bytes");
    }
}
