//! OpenAI Chat Completions: the request body and the stream decoding, one module each.

mod decode;
mod request;

pub(crate) use decode::{Decoder, parse_arguments};
pub(crate) use request::{ToolsJson, request_body};
