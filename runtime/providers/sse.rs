//! Server-sent events in, one [`Inferred`] out. The SSE grammar itself (LF or CRLF, comments,
//! multi-line data, `event:` names) is `eventsource-stream`'s job; this module only feeds a style's
//! [`Assembler`] and turns transport failures into [`ProviderError`]s.

use eventsource_stream::Eventsource;
use futures::{Stream, StreamExt};

use super::{Assembler, ProviderError};
use crate::vocab::Inferred;

/// Reads a streamed HTTP response to its end.
pub async fn assemble(
    response: reqwest::Response,
    assembler: Box<dyn Assembler>,
    on_text: &mut (dyn FnMut(&str) + Send),
) -> Result<Inferred, ProviderError> {
    let bytes = response.bytes_stream();
    assemble_stream(bytes, assembler, on_text).await
}

/// The same over any byte stream: used by the fixture tests and the benchmarks on recorded bytes.
pub async fn assemble_stream<S, B, E>(
    bytes: S,
    mut assembler: Box<dyn Assembler>,
    on_text: &mut (dyn FnMut(&str) + Send),
) -> Result<Inferred, ProviderError>
where
    S: Stream<Item = Result<B, E>> + Unpin,
    B: AsRef<[u8]>,
    E: std::fmt::Display,
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
            Err(eventsource_stream::EventStreamError::Transport(e)) => {
                return Err(ProviderError::Fetch(format!(
                    "the stream broke off: {}",
                    crate::secrets::redact(&e.to_string())
                )));
            }
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
    let chunks = futures::stream::iter([Ok::<_, std::convert::Infallible>(bytes.to_vec())]);
    let result = futures::executor::block_on(assemble_stream(chunks, assembler, &mut |t: &str| {
        deltas.push(t.to_string())
    }));
    (result, deltas)
}
