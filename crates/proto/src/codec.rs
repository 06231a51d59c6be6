//! Protobuf by default; proto3 canonical JSON when the header says so or, with no header,
//! when the first non-blank byte is `{` (so a person can publish with the NATS CLI).

use prost::Message;
use serde::{Serialize, de::DeserializeOwned};

/// Content-Type of a JSON payload.
pub const CONTENT_TYPE_JSON: &str = "application/json";
/// Content-Type of a protobuf payload.
pub const CONTENT_TYPE_PROTO: &str = "application/x-protobuf";

/// The encoding of a payload on the bus.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// Binary protobuf.
    Proto,
    /// Proto3 canonical JSON.
    Json,
}

impl Encoding {
    /// Returns the encoding a payload uses, from its Content-Type header or its first byte.
    pub fn detect(content_type: Option<&str>, payload: &[u8]) -> Self {
        match content_type.map(str::trim) {
            Some(ct) if !ct.is_empty() => {
                let ct = ct.to_ascii_lowercase();
                if ct.starts_with(CONTENT_TYPE_JSON) || ct.ends_with("+json") {
                    Encoding::Json
                } else {
                    Encoding::Proto
                }
            }
            _ => match payload.iter().find(|b| !b.is_ascii_whitespace()) {
                Some(b'{') => Encoding::Json,
                _ => Encoding::Proto,
            },
        }
    }

    /// Returns the Content-Type header value of this encoding.
    pub fn content_type(self) -> &'static str {
        match self {
            Encoding::Proto => CONTENT_TYPE_PROTO,
            Encoding::Json => CONTENT_TYPE_JSON,
        }
    }

    /// Returns the encoding named by `json` or `proto`, protobuf for anything else.
    pub fn from_name(name: &str) -> Self {
        if name.eq_ignore_ascii_case("json") {
            Encoding::Json
        } else {
            Encoding::Proto
        }
    }

    /// Returns the short name of this encoding (`json` or `proto`).
    pub fn name(self) -> &'static str {
        match self {
            Encoding::Proto => "proto",
            Encoding::Json => "json",
        }
    }
}

/// Why a payload could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// The payload is not valid protobuf for the expected message.
    #[error("payload is not a valid protobuf {message}")]
    Proto {
        /// Name of the expected message.
        message: &'static str,
        /// The decoder's complaint.
        #[source]
        source: prost::DecodeError,
    },
    /// The payload is not valid JSON for the expected message.
    #[error("payload is not valid JSON for {message}")]
    Json {
        /// Name of the expected message.
        message: &'static str,
        /// The decoder's complaint.
        #[source]
        source: serde_json::Error,
    },
}

/// Decodes a bus payload as `T`, choosing the codec by [`Encoding::detect`].
///
/// # Errors
/// A [`DecodeError`] naming the message type and the codec that failed.
pub fn decode<T>(content_type: Option<&str>, payload: &[u8]) -> Result<(T, Encoding), DecodeError>
where
    T: Message + Default + DeserializeOwned,
{
    let name = short_type_name::<T>();
    let encoding = Encoding::detect(content_type, payload);
    let value = match encoding {
        Encoding::Json => serde_json::from_slice(payload).map_err(|source| DecodeError::Json {
            message: name,
            source,
        })?,
        Encoding::Proto => T::decode(payload).map_err(|source| DecodeError::Proto {
            message: name,
            source,
        })?,
    };
    Ok((value, encoding))
}

fn short_type_name<T>() -> &'static str {
    let full = std::any::type_name::<T>();
    full.rsplit("::").next().unwrap_or(full)
}

/// Encodes `value` in the given encoding.
pub fn encode<T: Message + Serialize>(value: &T, encoding: Encoding) -> Vec<u8> {
    match encoding {
        Encoding::Proto => value.encode_to_vec(),
        // Serializing a generated message into memory cannot fail: every field is plain data.
        Encoding::Json => serde_json::to_vec(value).unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::InboundMessage;

    #[test]
    fn json_with_camel_and_snake_case_and_unknown_fields_decodes() {
        let camel = br#"{"sessionKey":"cli:alice","text":"hi","futureField":1}"#;
        let snake = br#" {"session_key":"cli:alice","text":"hi","queue_mode":"steer"}"#;
        let (a, enc): (InboundMessage, _) = decode(None, camel).unwrap();
        let (b, _): (InboundMessage, _) = decode(Some("application/json"), snake).unwrap();
        assert_eq!(enc, Encoding::Json);
        assert_eq!(a.session_key, "cli:alice");
        assert_eq!(b.session_key, "cli:alice");
        assert_eq!(b.queue_mode, "steer");
    }

    #[test]
    fn protobuf_round_trips_and_header_wins_over_sniffing() {
        let msg = InboundMessage {
            session_key: "k".into(),
            text: "t".into(),
            ..Default::default()
        };
        let bytes = encode(&msg, Encoding::Proto);
        let (back, enc): (InboundMessage, _) = decode(Some(CONTENT_TYPE_PROTO), &bytes).unwrap();
        assert_eq!(back, msg);
        assert_eq!(enc, Encoding::Proto);
        let err = decode::<InboundMessage>(Some(CONTENT_TYPE_PROTO), b"{\"text\":1}");
        assert!(err.is_err());
    }

    #[test]
    fn garbage_is_a_clear_error() {
        let err = decode::<InboundMessage>(None, &[0xff, 0xff, 0xff]).unwrap_err();
        assert!(err.to_string().contains("InboundMessage"), "{err}");
        let err = decode::<InboundMessage>(None, b"{not json").unwrap_err();
        assert!(err.to_string().contains("JSON"), "{err}");
    }
}
