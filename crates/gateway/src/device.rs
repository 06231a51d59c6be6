//! Device identities of OpenClaw clients: a device signs the server's `connect.challenge` nonce
//! with its Ed25519 key, so a stolen nonce or a copied `connect` frame is worthless on another
//! connection. The signed text is OpenClaw's published `v3` payload (`v2` without platform and
//! device family is accepted too); keys and signatures are base64url, the device id is the hex
//! SHA-256 of the raw public key.

use base64::Engine as _;
use base64::engine::general_purpose::{URL_SAFE, URL_SAFE_NO_PAD};
use ed25519_dalek::{Signature, VerifyingKey};
use serde::Deserialize;
use sha2::{Digest as _, Sha256};

/// How far a device's `signedAt` may be from the gateway's clock.
pub(crate) const MAX_SKEW_MS: i64 = 10 * 60 * 1000;

/// The `device` object of a `connect` request.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct DeviceProof {
    pub(crate) id: String,
    pub(crate) public_key: String,
    pub(crate) signature: String,
    pub(crate) signed_at: i64,
    pub(crate) nonce: String,
}

/// The parts of the `connect` request the device signed along with the nonce.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SignedFields<'a> {
    pub(crate) client_id: &'a str,
    pub(crate) client_mode: &'a str,
    pub(crate) role: &'a str,
    pub(crate) scopes: &'a [String],
    pub(crate) token: &'a str,
    pub(crate) platform: &'a str,
    pub(crate) device_family: &'a str,
}

/// Why a device proof is refused; each has OpenClaw's detail code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    /// The public key or signature is not base64url of the right length.
    #[error("device identity is malformed: {0}")]
    Malformed(&'static str),
    /// The id is not the SHA-256 of the public key.
    #[error("device id does not match its public key")]
    IdMismatch,
    /// The nonce is not the one this connection was challenged with.
    #[error("device nonce mismatch")]
    NonceMismatch,
    /// `signedAt` is too far from now.
    #[error("device signature expired (signedAt more than 10 minutes from the gateway's clock)")]
    Expired,
    /// The signature does not verify.
    #[error("device signature invalid")]
    SignatureInvalid,
}

impl DeviceError {
    /// The `details.code` OpenClaw clients read.
    pub fn detail_code(self) -> &'static str {
        match self {
            Self::Malformed(_) => "DEVICE_AUTH_INVALID",
            Self::IdMismatch => "DEVICE_AUTH_DEVICE_ID_MISMATCH",
            Self::NonceMismatch => "DEVICE_AUTH_NONCE_MISMATCH",
            Self::Expired => "DEVICE_AUTH_SIGNATURE_EXPIRED",
            Self::SignatureInvalid => "DEVICE_AUTH_SIGNATURE_INVALID",
        }
    }
}

/// Checks `proof` against the connection's `challenge` nonce at `now_ms`; returns the device id.
///
/// # Errors
/// The first check that fails, in the order: shape, id, nonce, time, signature.
pub(crate) fn verify(
    proof: &DeviceProof,
    fields: &SignedFields<'_>,
    challenge: &str,
    now_ms: i64,
) -> Result<String, DeviceError> {
    let key_bytes: [u8; 32] = decode(&proof.public_key)
        .and_then(|bytes| bytes.try_into().ok())
        .ok_or(DeviceError::Malformed(
            "publicKey is not a base64url Ed25519 key",
        ))?;
    let expected_id = hex::encode(Sha256::digest(key_bytes));
    if !proof.id.eq_ignore_ascii_case(&expected_id) {
        return Err(DeviceError::IdMismatch);
    }
    if proof.nonce.is_empty() || proof.nonce != challenge {
        return Err(DeviceError::NonceMismatch);
    }
    // `abs_diff`: a client picks `signed_at`, and `i64::MIN` would overflow a subtraction.
    if now_ms.abs_diff(proof.signed_at) > MAX_SKEW_MS.unsigned_abs() {
        return Err(DeviceError::Expired);
    }
    let signature: [u8; 64] = decode(&proof.signature)
        .and_then(|bytes| bytes.try_into().ok())
        .ok_or(DeviceError::Malformed(
            "signature is not a base64url Ed25519 signature",
        ))?;
    let key = VerifyingKey::from_bytes(&key_bytes)
        .map_err(|_| DeviceError::Malformed("publicKey is not a point of Ed25519"))?;
    let signature = Signature::from_bytes(&signature);
    let signed = [Version::V3, Version::V2].into_iter().any(|version| {
        let text = payload(version, &expected_id, proof, fields);
        key.verify_strict(text.as_bytes(), &signature).is_ok()
    });
    if signed {
        Ok(expected_id)
    } else {
        Err(DeviceError::SignatureInvalid)
    }
}

#[derive(Debug, Clone, Copy)]
enum Version {
    V2,
    V3,
}

/// The text a device signs: fields joined by `|`, scopes by `,` in the order sent.
fn payload(version: Version, id: &str, proof: &DeviceProof, fields: &SignedFields<'_>) -> String {
    let mut parts = vec![
        match version {
            Version::V2 => "v2".to_owned(),
            Version::V3 => "v3".to_owned(),
        },
        id.to_owned(),
        fields.client_id.to_owned(),
        fields.client_mode.to_owned(),
        fields.role.to_owned(),
        fields.scopes.join(","),
        proof.signed_at.to_string(),
        fields.token.to_owned(),
        proof.nonce.clone(),
    ];
    if matches!(version, Version::V3) {
        parts.push(fields.platform.trim().to_ascii_lowercase());
        parts.push(fields.device_family.trim().to_ascii_lowercase());
    }
    parts.join("|")
}

/// Decodes base64url with or without padding.
fn decode(text: &str) -> Option<Vec<u8>> {
    URL_SAFE_NO_PAD
        .decode(text)
        .or_else(|_| URL_SAFE.decode(text))
        .ok()
}

#[cfg(test)]
mod tests {
    use ed25519_dalek::{Signer as _, SigningKey};

    use super::*;

    const NOW: i64 = 1_796_529_924_663;

    fn scopes() -> Vec<String> {
        vec!["operator.admin".to_owned(), "operator.read".to_owned()]
    }

    fn fields(scopes: &[String]) -> SignedFields<'_> {
        SignedFields {
            client_id: "openclaw-tui",
            client_mode: "ui",
            role: "operator",
            scopes,
            token: "tok123",
            platform: "linux",
            device_family: "Linux",
        }
    }

    /// A proof signed the way an OpenClaw client signs (`version` "v3" or "v2").
    fn signed(version: &str, nonce: &str, signed_at: i64) -> DeviceProof {
        let key = SigningKey::from_bytes(&[7u8; 32]);
        let public = key.verifying_key().to_bytes();
        let id = hex::encode(Sha256::digest(public));
        let mut text = format!(
            "{version}|{id}|openclaw-tui|ui|operator|operator.admin,operator.read|{signed_at}|tok123|{nonce}"
        );
        if version == "v3" {
            text.push_str("|linux|linux");
        }
        DeviceProof {
            id,
            public_key: URL_SAFE_NO_PAD.encode(public),
            signature: URL_SAFE_NO_PAD.encode(key.sign(text.as_bytes()).to_bytes()),
            signed_at,
            nonce: nonce.to_owned(),
        }
    }

    #[test]
    fn v3_and_v2_signatures_over_the_challenge_verify() {
        let scopes = scopes();
        for version in ["v3", "v2"] {
            let proof = signed(version, "n-1", NOW);
            assert_eq!(
                verify(&proof, &fields(&scopes), "n-1", NOW + 5),
                Ok(proof.id.clone())
            );
        }
    }

    #[test]
    fn a_proof_for_another_nonce_time_key_or_text_is_refused() {
        let scopes = scopes();
        let proof = signed("v3", "n-1", NOW);
        let check = |proof: &DeviceProof, nonce: &str, now: i64| {
            verify(proof, &fields(&scopes), nonce, now)
        };
        assert_eq!(check(&proof, "n-2", NOW), Err(DeviceError::NonceMismatch));
        assert_eq!(
            check(&proof, "n-1", NOW + MAX_SKEW_MS + 1),
            Err(DeviceError::Expired)
        );
        // A time at the end of the range is refused, not an overflow.
        for at in [i64::MIN, i64::MAX] {
            let far = signed("v3", "n-1", at);
            assert_eq!(check(&far, "n-1", NOW), Err(DeviceError::Expired));
        }
        let mut other_id = proof.clone();
        other_id.id = "00".repeat(32);
        assert_eq!(check(&other_id, "n-1", NOW), Err(DeviceError::IdMismatch));
        // Signed for other scopes than the ones the request asks for.
        let fewer = vec!["operator.read".to_owned()];
        assert_eq!(
            verify(&proof, &fields(&fewer), "n-1", NOW),
            Err(DeviceError::SignatureInvalid)
        );
        let mut garbled = proof.clone();
        garbled.signature = "AAAA".into();
        assert!(matches!(
            check(&garbled, "n-1", NOW),
            Err(DeviceError::Malformed(_))
        ));
    }
}
