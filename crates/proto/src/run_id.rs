//! The id of the run that processes an input, derived from the input alone.

use md5::{Digest as _, Md5};

/// The id of the run of the input `idempotency_key` in session `session_id` (a UUID in its
/// lowercase hyphenated form): the MD5 of `"<session_id>/<idempotency_key>"` read as a UUID, as
/// memory's `agentloop_run_id` computes it. A run repeated after a crash keeps its id, and a
/// client that sent an input knows which run answers it without asking.
pub fn run_id(session_id: &str, idempotency_key: &str) -> String {
    let mut hasher = Md5::new();
    hasher.update(session_id.as_bytes());
    hasher.update(b"/");
    hasher.update(idempotency_key.as_bytes());
    let digest = hasher.finalize();
    let mut id = String::with_capacity(36);
    for (i, byte) in digest.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            id.push('-');
        }
        id.push(char::from(HEX[usize::from(byte >> 4)]));
        id.push(char::from(HEX[usize::from(byte & 0x0f)]));
    }
    id
}

const HEX: &[u8; 16] = b"0123456789abcdef";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_run_id_is_the_md5_of_session_and_key_as_a_uuid() {
        // md5("00000000-0000-0000-0000-000000000001/k1"), from `md5sum`.
        assert_eq!(
            run_id("00000000-0000-0000-0000-000000000001", "k1"),
            "e137f941-c15b-a8ab-4124-58fa35a5a352"
        );
    }
}
