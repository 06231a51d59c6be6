//! Fake chat-app servers for tests, speaking each app's real wire format: request paths, JSON
//! shapes and error answers (Telegram's `{"ok":false,"error_code":429,...,"parameters":
//! {"retry_after":N}}`). They record what they were sent and fail on request.

pub mod telegram;
