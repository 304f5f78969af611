//! Server-sent events in, one [`Inferred`] out. The SSE grammar itself (LF or CRLF, comments,
//! multi-line data, `event:` names) is `eventsource-stream`'s job; this module only feeds a style's
//! [`Assembler`] and turns transport failures into [`ProviderError`]s.

use eventsource_stream::Eventsource;
use futures::{Stream, StreamExt};

use super::{Assembler, Endpoint, ProviderError, body};
use crate::vocab::Inferred;

/// Reads a streamed HTTP response to its end, or to `ep`'s `max_response_bytes`. A failure to
/// read reads as it would for a whole body ([`super::body_failure`]): the same fault is the same
/// error, streamed or not.
pub async fn assemble(
    response: reqwest::Response,
    assembler: Box<dyn Assembler>,
    on_text: &mut (dyn FnMut(&str) + Send),
    ep: &Endpoint,
) -> Result<Inferred, ProviderError> {
    let bytes = body::stream(response, ep.max_response_bytes)
        .map(|chunk| chunk.map_err(|e| super::body_failure(e, ep)));
    assemble_stream(bytes, assembler, on_text).await
}

/// The same over any byte stream (a transport failure already a [`ProviderError`]): used by the
/// fixture tests and the benchmarks on recorded bytes.
pub async fn assemble_stream<S, B>(
    bytes: S,
    mut assembler: Box<dyn Assembler>,
    on_text: &mut (dyn FnMut(&str) + Send),
) -> Result<Inferred, ProviderError>
where
    S: Stream<Item = Result<B, ProviderError>> + Unpin,
    B: AsRef<[u8]>,
{
    let mut events = bytes.eventsource();
    while let Some(event) = events.next().await {
        match event {
            Ok(event) => {
                if event.data.is_empty() {
                    continue;
                }
                assembler.event(&event.event, &event.data, &mut |t| on_text(t))?;
            }
            Err(eventsource_stream::EventStreamError::Transport(e)) => return Err(e),
            Err(e) => return Err(ProviderError::Parse(format!("bad SSE: {e}"))),
        }
    }
    assembler.finish()
}

/// Assembles recorded SSE bytes synchronously, returning the result and the text deltas seen.
pub fn assemble_bytes(
    bytes: &[u8],
    assembler: Box<dyn Assembler>,
) -> (Result<Inferred, ProviderError>, Vec<String>) {
    let mut deltas = Vec::new();
    let chunks = futures::stream::iter([Ok::<_, ProviderError>(bytes.to_vec())]);
    let result = futures::executor::block_on(assemble_stream(chunks, assembler, &mut |t: &str| {
        deltas.push(t.to_string())
    }));
    (result, deltas)
}
