//! The openai wire style. (Being written.)

use serde_json::Value;

use super::{Assembler, Codec, Endpoint, ProviderError, WireRequest};
use crate::vocab::{InferRequest, Inferred};

pub struct OpenAi;

impl Codec for OpenAi {
    fn request(&self, _req: &InferRequest, _ep: &Endpoint, _stream: bool) -> WireRequest {
        todo!()
    }
    fn parse(&self, _body: &[u8]) -> Result<Inferred, ProviderError> {
        todo!()
    }
    fn assembler(&self) -> Box<dyn Assembler> {
        todo!()
    }
    fn models_request(&self, _ep: &Endpoint) -> WireRequest {
        todo!()
    }
    fn parse_models(&self, _body: &Value) -> Vec<String> {
        todo!()
    }
}
