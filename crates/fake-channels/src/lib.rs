//! Fake chat-app servers for tests, speaking each app's real wire format: request paths, JSON
//! shapes and error answers (Telegram's `{"ok":false,"error_code":429,...,"parameters":
//! {"retry_after":N}}`, Slack's 429 with `Retry-After` and `{"ok":false,"error":...}`). They record what they were sent and fail on request.

pub mod slack;
pub mod telegram;
pub mod webhook;
