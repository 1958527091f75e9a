//! Signed artifacts: an ed25519 signature (`ed25519-dalek`) over the exact bytes of
//! `tlaloc-serving.json`, kept beside it in `tlaloc-serving.json.sig`.
//!
//! The manifest names the sha256 of every body, weight, tokenizer file and executable, so a
//! good signature plus a hash check of every file ([`crate::Artifact::verify`]) covers the
//! whole artifact. Keys are never written into an artifact; the signature file names the key
//! that made it by its id (the first 16 hex digits of the public key's sha256), so a refusal
//! can say "signed by another key" rather than only "bad signature".
//!
//! The three files are short text, one value a line, so they can be read, diffed and mailed:
//!
//! ```text
//! tlaloc ed25519 secret key        tlaloc ed25519 public key        tlaloc ed25519 signature
//! <32-byte seed, hex>              <32-byte key, hex>               key <key id>
//!                                                                   <64-byte signature, hex>
//! ```
//!
//! Only the line format is written here by hand; every signing and checking step is the
//! library's (`verify_strict`, which also refuses weak keys and malleable signatures).

use std::path::{Path, PathBuf};

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use sha2::{Digest, Sha256};

use crate::manifest::MANIFEST_FILE;

/// File name of the detached signature inside an artifact directory.
pub const SIGNATURE_FILE: &str = "tlaloc-serving.json.sig";

const SECRET_HEADER: &str = "tlaloc ed25519 secret key";
const PUBLIC_HEADER: &str = "tlaloc ed25519 public key";
const SIGNATURE_HEADER: &str = "tlaloc ed25519 signature";

/// A refused key, signature or artifact; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum SignatureError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: not a {what} file: {reason}", path.display())]
    Malformed {
        path: PathBuf,
        what: &'static str,
        reason: String,
    },
    #[error(
        "artifact {} is not signed: it has no {SIGNATURE_FILE}; sign it with `tlaloc sign` or serve it without --require-signature",
        artifact.display()
    )]
    Unsigned { artifact: PathBuf },
    #[error(
        "{}: signed by key {signed_by}, not by the expected key {expected}",
        path.display()
    )]
    WrongKey {
        path: PathBuf,
        signed_by: String,
        expected: String,
    },
    #[error(
        "{}: the signature does not match {MANIFEST_FILE} under key {key}: the manifest or the signature was altered after signing",
        path.display()
    )]
    BadSignature { path: PathBuf, key: String },
    #[error("the system random source failed: {0}")]
    Random(String),
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> SignatureError + '_ {
    move |source| SignatureError::Io {
        path: path.to_owned(),
        source,
    }
}

/// A signing key (the secret half).
#[derive(Debug)]
pub struct SecretKey(SigningKey);

/// A checking key (the public half).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicKey(VerifyingKey);

/// The lines of a key or signature file after its header, or why it is refused.
fn body_lines<'a>(
    text: &'a str,
    header: &str,
    count: usize,
    path: &Path,
    what: &'static str,
) -> Result<Vec<&'a str>, SignatureError> {
    let malformed = |reason: String| SignatureError::Malformed {
        path: path.to_owned(),
        what,
        reason,
    };
    let mut lines = text.lines();
    if lines.next() != Some(header) {
        return Err(malformed(format!("the first line is not {header:?}")));
    }
    let rest: Vec<&str> = lines.filter(|l| !l.is_empty()).collect();
    if rest.len() != count {
        return Err(malformed(format!(
            "{} lines after the header, expected {count}",
            rest.len()
        )));
    }
    Ok(rest)
}

fn hex_array<const N: usize>(
    hex_text: &str,
    path: &Path,
    what: &'static str,
) -> Result<[u8; N], SignatureError> {
    let mut out = [0u8; N];
    hex::decode_to_slice(hex_text, &mut out).map_err(|e| SignatureError::Malformed {
        path: path.to_owned(),
        what,
        reason: format!("expected {} hex digits: {e}", 2 * N),
    })?;
    Ok(out)
}

fn read_text(path: &Path) -> Result<String, SignatureError> {
    std::fs::read_to_string(path).map_err(io_error(path))
}

impl SecretKey {
    /// A fresh key from the operating system's random source.
    pub fn generate() -> Result<SecretKey, SignatureError> {
        let mut seed = [0u8; 32];
        getrandom::fill(&mut seed).map_err(|e| SignatureError::Random(e.to_string()))?;
        Ok(SecretKey(SigningKey::from_bytes(&seed)))
    }

    /// Its public half.
    pub fn public_key(&self) -> PublicKey {
        PublicKey(self.0.verifying_key())
    }

    /// The text of a secret key file.
    pub fn to_file_text(&self) -> String {
        format!("{SECRET_HEADER}\n{}\n", hex::encode(self.0.to_bytes()))
    }

    /// Reads a secret key file.
    pub fn read(path: &Path) -> Result<SecretKey, SignatureError> {
        let text = read_text(path)?;
        let lines = body_lines(&text, SECRET_HEADER, 1, path, "secret key")?;
        let seed = hex_array::<32>(lines[0], path, "secret key")?;
        Ok(SecretKey(SigningKey::from_bytes(&seed)))
    }
}

impl PublicKey {
    /// The key's id: the first 16 hex digits of the sha256 of its 32 bytes.
    pub fn id(&self) -> String {
        hex::encode(Sha256::digest(self.0.as_bytes()))[..16].to_owned()
    }

    /// The text of a public key file.
    pub fn to_file_text(&self) -> String {
        format!("{PUBLIC_HEADER}\n{}\n", hex::encode(self.0.as_bytes()))
    }

    /// Reads a public key file.
    pub fn read(path: &Path) -> Result<PublicKey, SignatureError> {
        let text = read_text(path)?;
        let lines = body_lines(&text, PUBLIC_HEADER, 1, path, "public key")?;
        let bytes = hex_array::<32>(lines[0], path, "public key")?;
        VerifyingKey::from_bytes(&bytes)
            .map(PublicKey)
            .map_err(|e| SignatureError::Malformed {
                path: path.to_owned(),
                what: "public key",
                reason: format!("not an ed25519 point: {e}"),
            })
    }
}

/// Signs the manifest of the artifact in `dir` and writes `tlaloc-serving.json.sig` beside it;
/// returns the signature file's path.
pub fn sign_artifact(dir: &Path, key: &SecretKey) -> Result<PathBuf, SignatureError> {
    let manifest_path = dir.join(MANIFEST_FILE);
    let manifest = std::fs::read(&manifest_path).map_err(io_error(&manifest_path))?;
    let signature = key.0.sign(&manifest);
    let text = format!(
        "{SIGNATURE_HEADER}\nkey {}\n{}\n",
        key.public_key().id(),
        hex::encode(signature.to_bytes())
    );
    let path = dir.join(SIGNATURE_FILE);
    std::fs::write(&path, text).map_err(io_error(&path))?;
    Ok(path)
}

/// Checks `tlaloc-serving.json.sig` of the artifact in `dir` against its manifest bytes under
/// `key`. Refuses a missing signature, a signature by another key, and one that does not match
/// the manifest.
pub fn verify_artifact_signature(dir: &Path, key: &PublicKey) -> Result<(), SignatureError> {
    let path = dir.join(SIGNATURE_FILE);
    if !path.is_file() {
        return Err(SignatureError::Unsigned {
            artifact: dir.to_owned(),
        });
    }
    let text = read_text(&path)?;
    let lines = body_lines(&text, SIGNATURE_HEADER, 2, &path, "signature")?;
    let signed_by = lines[0]
        .strip_prefix("key ")
        .ok_or_else(|| SignatureError::Malformed {
            path: path.clone(),
            what: "signature",
            reason: "the second line is not `key <key id>`".into(),
        })?;
    if signed_by != key.id() {
        return Err(SignatureError::WrongKey {
            path,
            signed_by: signed_by.to_owned(),
            expected: key.id(),
        });
    }
    let signature = Signature::from_bytes(&hex_array::<64>(lines[1], &path, "signature")?);
    let manifest_path = dir.join(MANIFEST_FILE);
    let manifest = std::fs::read(&manifest_path).map_err(io_error(&manifest_path))?;
    key.0
        .verify_strict(&manifest, &signature)
        .map_err(|_| SignatureError::BadSignature {
            path,
            key: key.id(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signed_dir() -> (tempfile::TempDir, SecretKey) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(MANIFEST_FILE), b"{\"formatVersion\": 2}\n").unwrap();
        let key = SecretKey::generate().unwrap();
        sign_artifact(dir.path(), &key).unwrap();
        (dir, key)
    }

    #[test]
    fn a_signature_checks_under_its_key_only() {
        let (dir, key) = signed_dir();
        verify_artifact_signature(dir.path(), &key.public_key()).unwrap();
        let other = SecretKey::generate().unwrap().public_key();
        let e = verify_artifact_signature(dir.path(), &other).unwrap_err();
        assert!(matches!(e, SignatureError::WrongKey { .. }), "{e}");
    }

    #[test]
    fn key_files_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let key = SecretKey::generate().unwrap();
        let (secret, public) = (dir.path().join("k.secret"), dir.path().join("k.pub"));
        std::fs::write(&secret, key.to_file_text()).unwrap();
        std::fs::write(&public, key.public_key().to_file_text()).unwrap();
        assert_eq!(
            SecretKey::read(&secret).unwrap().public_key(),
            key.public_key()
        );
        assert_eq!(PublicKey::read(&public).unwrap(), key.public_key());
        // A secret key file is not a public key file.
        assert!(matches!(
            PublicKey::read(&secret),
            Err(SignatureError::Malformed { .. })
        ));
    }

    #[test]
    fn every_flipped_byte_of_the_manifest_or_signature_is_refused() {
        let (dir, key) = signed_dir();
        let public = key.public_key();
        for file in [MANIFEST_FILE, SIGNATURE_FILE] {
            let path = dir.path().join(file);
            let original = std::fs::read(&path).unwrap();
            for i in 0..original.len() {
                let mut flipped = original.clone();
                flipped[i] ^= 0x01;
                std::fs::write(&path, &flipped).unwrap();
                let result = verify_artifact_signature(dir.path(), &public);
                // A flip inside a newline can leave the lines intact only by making them
                // something else, so every flip is refused one way or another.
                assert!(result.is_err(), "{file}: flip at byte {i} was accepted");
            }
            std::fs::write(&path, &original).unwrap();
            verify_artifact_signature(dir.path(), &public).unwrap();
        }
        std::fs::remove_file(dir.path().join(SIGNATURE_FILE)).unwrap();
        assert!(matches!(
            verify_artifact_signature(dir.path(), &public),
            Err(SignatureError::Unsigned { .. })
        ));
    }
}
