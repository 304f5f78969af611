//! Opaque data: what Gemini wants back exactly as it sent it beside a part (`thoughtSignature`,
//! the `thought` flag), kept on the neutral part as [`Opaque`] data of the Gemini style, and
//! colony's own note in it (`syntheticId`, never sent).

use serde_json::{Map, Value};

use crate::vocab::{Opaque, Style, ToolCall};

/// The part field Gemini wants back unchanged.
pub(super) const SIGNATURE: &str = "thoughtSignature";
/// Colony's own note in a tool call's opaque data: the id was made up here, not sent by the model.
pub(super) const SYNTHETIC_ID: &str = "syntheticId";
/// Google's documented placeholder for a function call that has no real signature.
pub(super) const SKIP_SIGNATURE: &str = "skip_thought_signature_validator";

// Out: the fields that go back beside a part.

/// The wire fields kept beside a part, if the opaque data is Gemini's own.
pub(super) fn gemini_fields(opaque: Option<&Opaque>) -> Option<Map<String, Value>> {
    let opaque = opaque.filter(|o| o.style == Style::Gemini)?;
    let mut fields = opaque.data.as_object()?.clone();
    fields.remove(SYNTHETIC_ID);
    Some(fields)
}

/// `part` with `fields` beside its content.
pub(super) fn beside(mut part: Value, fields: Option<Map<String, Value>>) -> Value {
    if let (Value::Object(target), Some(fields)) = (&mut part, fields) {
        target.extend(fields);
    }
    part
}

/// The model gave this call its id (rather than colony making one up, or another style).
pub(super) fn id_from_model(call: &ToolCall) -> bool {
    call.opaque.as_ref().is_some_and(|o| {
        o.style == Style::Gemini && o.data.get(SYNTHETIC_ID) != Some(&Value::Bool(true))
    }) && !call.id.is_empty()
}

// In: the fields read beside a part.

/// A part's fields other than its content: what has to go back beside it unchanged.
pub(super) fn fields_beside(part: &Map<String, Value>, content_key: &str) -> Map<String, Value> {
    part.iter()
        .filter(|(k, _)| *k != content_key)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Fields read beside a part, as the neutral part's opaque data.
pub(super) fn gemini_opaque(data: Map<String, Value>) -> Opaque {
    Opaque {
        style: Style::Gemini,
        data: Value::Object(data),
    }
}

/// Whether the opaque data carries a thought signature.
pub(super) fn signed(opaque: Option<&Opaque>) -> bool {
    opaque.is_some_and(|o| o.data.get(SIGNATURE).is_some())
}
