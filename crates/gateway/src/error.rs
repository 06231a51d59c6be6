//! What stops the gateway, and what a client request can fail with.

/// What stops the gateway.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// The bus could not be set up.
    #[error("bus setup failed")]
    Bus(#[from] agentloop_bus::BusError),
    /// The HTTP address could not be bound.
    #[error("failed to bind {addr}")]
    Bind {
        /// The address configured.
        addr: String,
        /// The bind error.
        #[source]
        source: std::io::Error,
    },
    /// The `ask` subject could not be subscribed.
    #[error("failed to subscribe to {subject}")]
    Subscribe {
        /// The subject.
        subject: String,
        /// The client's error.
        #[source]
        source: async_nats::SubscribeError,
    },
    /// `[memory] url` is not a valid URI, or its TLS settings cannot be used.
    #[error(transparent)]
    MemoryUrl(#[from] agentloop_lifecycle::MemoryEndpointError),
    /// A token is the development token outside dev mode (`CHANGE_ME` the loader refuses).
    #[error(
        "gateway.tokens holds the placeholder token {token:?}: set a real secret, or \
         gateway.dev_mode = true (AGENTLOOP_GATEWAY__DEV_MODE=true) for development only"
    )]
    PlaceholderToken {
        /// The placeholder found.
        token: String,
    },
    /// A `[gateway.tokens]` entry cannot be served.
    #[error("invalid gateway.tokens entry {principal}: {reason}")]
    InvalidToken {
        /// The entry's principal, or its position.
        principal: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A `[channels]` setting cannot be served.
    #[error("invalid channels setting: {0}")]
    InvalidChannels(String),
    /// A `[gateway]` setting cannot be read.
    #[error("invalid gateway.{key} entry {value:?}: {reason}")]
    InvalidSetting {
        /// The key.
        key: &'static str,
        /// The entry.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

/// The reason given when a request carries no token where one is required.
pub(crate) const NO_TOKEN: &str = "a token is required";

/// Why one client request failed; each maps to a stable error code on the wire.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// A method other than `connect` before `connect`.
    #[error("call connect first")]
    NotConnected,
    /// No token, or a wrong one.
    #[error("{0}")]
    Unauthorized(String),
    /// The frame is not a request, or its params are wrong.
    #[error("{0}")]
    InvalidRequest(String),
    /// The method does not exist.
    #[error("unknown method: {0}")]
    UnknownMethod(String),
    /// `connect` asked for protocol versions this gateway does not speak.
    #[error("protocol mismatch: the client speaks {min}..={max}, this gateway {oldest}..={newest}")]
    ProtocolMismatch {
        /// The client's `minProtocol`.
        min: u32,
        /// The client's `maxProtocol`.
        max: u32,
        /// The oldest version the gateway speaks.
        oldest: u32,
        /// The newest version the gateway speaks.
        newest: u32,
    },
    /// `connect` carried a device identity that does not prove itself.
    #[error("{0}")]
    Device(#[from] crate::device::DeviceError),
    /// The connection sends faster than its rate limit.
    #[error("rate limit exceeded: at most {per_sec} requests per second")]
    RateLimited {
        /// The configured rate.
        per_sec: u32,
    },
    /// The client has as many requests open as it may (long ones: subscriptions, waits, runs).
    #[error(
        "too many requests in flight: at most {max} at once (subscriptions count until closed)"
    )]
    TooManyInFlight {
        /// The configured cap.
        max: usize,
    },
    /// The client address failed authentication too often; it may try again later.
    #[error("too many failed authentications from this address; retry in {retry_after_ms} ms")]
    AuthThrottled {
        /// How long until the next attempt is looked at.
        retry_after_ms: u64,
    },
    /// The frame is larger than allowed.
    #[error("frame of {size} bytes exceeds the limit of {limit} bytes")]
    FrameTooLarge {
        /// The frame's size.
        size: usize,
        /// The configured limit.
        limit: usize,
    },
    /// What was asked for does not exist, or belongs to another principal.
    #[error("{0}")]
    NotFound(String),
    /// The token lacks the scope the method needs.
    #[error("{0}")]
    Forbidden(String),
    /// A dependency (bus, memory) cannot be reached; retrying later may work.
    #[error("{0}")]
    Unavailable(String),
}

impl RequestError {
    /// Returns the error code clients match on.
    pub fn code(&self) -> &'static str {
        match self {
            Self::NotConnected => "NOT_CONNECTED",
            Self::Unauthorized(_) => "UNAUTHORIZED",
            Self::InvalidRequest(_) | Self::ProtocolMismatch { .. } | Self::Device(_) => {
                "INVALID_REQUEST"
            }
            Self::UnknownMethod(_) => "UNKNOWN_METHOD",
            Self::RateLimited { .. }
            | Self::TooManyInFlight { .. }
            | Self::AuthThrottled { .. } => "RATE_LIMITED",
            Self::FrameTooLarge { .. } => "FRAME_TOO_LARGE",
            Self::NotFound(_) => "NOT_FOUND",
            Self::Forbidden(_) => "FORBIDDEN",
            Self::Unavailable(_) => "UNAVAILABLE",
        }
    }

    /// Returns the `details` OpenClaw clients read to decide whether to retry (`None`: no
    /// details).
    pub fn details(&self) -> Option<serde_json::Value> {
        let code = match self {
            Self::Unauthorized(reason) if reason == NO_TOKEN => "AUTH_TOKEN_MISSING",
            Self::Unauthorized(_) => "AUTH_TOKEN_MISMATCH",
            Self::Device(error) => error.detail_code(),
            Self::ProtocolMismatch {
                min,
                max,
                oldest,
                newest,
            } => {
                return Some(serde_json::json!({
                    "code": "PROTOCOL_MISMATCH",
                    "clientMinProtocol": min,
                    "clientMaxProtocol": max,
                    "expectedProtocol": newest,
                    "minimumProtocol": oldest,
                }));
            }
            _ => return None,
        };
        Some(serde_json::json!({ "code": code }))
    }

    /// Returns whether the same request may succeed later.
    pub fn retryable(&self) -> bool {
        matches!(
            self,
            Self::RateLimited { .. }
                | Self::TooManyInFlight { .. }
                | Self::AuthThrottled { .. }
                | Self::Unavailable(_)
        )
    }
}

impl From<tonic::Status> for RequestError {
    fn from(status: tonic::Status) -> Self {
        match status.code() {
            tonic::Code::InvalidArgument => Self::InvalidRequest(status.message().to_owned()),
            tonic::Code::NotFound => Self::NotFound(status.message().to_owned()),
            _ => Self::Unavailable(format!("memory: {}", status.message())),
        }
    }
}
