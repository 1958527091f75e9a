//! The artifact's directory layout: where each kind of file lives, which names are allowed, and
//! the check that a path named by the manifest stays inside the artifact directory (also through
//! symlinks, by canonicalizing and comparing prefixes).

use std::path::{Component, Path, PathBuf};

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::error::ArtifactError;

pub const BODIES_DIR: &str = "bodies";
pub const PROGRAMS_DIR: &str = "programs";
pub const WEIGHTS_DIR: &str = "weights";
pub const TOKENIZER_DIR: &str = "tokenizer";
pub const EXECUTABLES_DIR: &str = "executables";

/// `programs/<entry>.json`
pub fn program_path(entry: &str) -> String {
    format!("{PROGRAMS_DIR}/{entry}.json")
}

/// `bodies/<sha256>.mlir`
pub fn body_path(sha256: &str) -> String {
    format!("{BODIES_DIR}/{sha256}.mlir")
}

/// `weights/NNNN_<slot>.bin`
pub fn weight_path(index: usize, slot: &str) -> String {
    format!("{WEIGHTS_DIR}/{index:04}_{slot}.bin")
}

/// `weights/NNNN_<slot>.shard<k>.bin`: shard `k` of a weight split over the devices of a
/// tensor-parallel artifact (see [`crate::tensor_parallel`]).
pub fn weight_shard_path(index: usize, slot: &str, shard: usize) -> String {
    format!("{WEIGHTS_DIR}/{index:04}_{slot}.shard{shard}.bin")
}

/// `tokenizer/<name>`
pub fn tokenizer_path(name: &str) -> String {
    format!("{TOKENIZER_DIR}/{name}")
}

/// `executables/<sha256>.bin`
pub fn executable_path(sha256: &str) -> String {
    format!("{EXECUTABLES_DIR}/{sha256}.bin")
}

/// The hash an executable path is named by, if the path has the form
/// `executables/<64 hex>.bin`.
pub fn executable_hash(path: &str) -> Result<&str, String> {
    let hash = path
        .strip_prefix(EXECUTABLES_DIR)
        .and_then(|p| p.strip_prefix('/'))
        .and_then(|p| p.strip_suffix(".bin"))
        .ok_or_else(|| format!("{path:?} is not of the form executables/<sha256>.bin"))?;
    check_sha256(hash).map_err(|reason| format!("{path:?}: {reason}"))?;
    Ok(hash)
}

/// Lowercase hex sha256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The hash a body path is named by, if the path has the form `bodies/<64 hex>.mlir`.
pub fn body_hash(path: &str) -> Result<&str, String> {
    let hash = path
        .strip_prefix(BODIES_DIR)
        .and_then(|p| p.strip_prefix('/'))
        .and_then(|p| p.strip_suffix(".mlir"))
        .ok_or_else(|| format!("{path:?} is not of the form bodies/<sha256>.mlir"))?;
    check_sha256(hash).map_err(|reason| format!("{path:?}: {reason}"))?;
    Ok(hash)
}

pub fn check_sha256(hash: &str) -> Result<(), String> {
    if hash.len() == 64
        && hash
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        Ok(())
    } else {
        Err(format!("{hash:?} is not 64 lowercase hex digits"))
    }
}

/// Entry names, weight slots and tokenizer file names become file names: ASCII letters,
/// digits, `.`, `_` and `-`, not starting with `.`, at most 200 bytes.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok_chars = name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if name.is_empty() || name.len() > 200 || name.starts_with('.') || !ok_chars {
        return Err(format!(
            "{name:?} is not a valid name; use 1 to 200 of A-Z a-z 0-9 . _ -, not starting with ."
        ));
    }
    Ok(())
}

/// Refuses, by the manifest field that named it, a path that is absolute or has any component
/// but a plain name (`..`, `.`, a root or a drive prefix).
pub fn check_relative(path: &str, field: &str) -> Result<(), ArtifactError> {
    let escapes = |reason: &str| ArtifactError::PathEscapes {
        path: path.to_owned(),
        field: field.to_owned(),
        reason: reason.to_owned(),
    };
    let p = Path::new(path);
    if path.is_empty() {
        return Err(escapes("the path is empty"));
    }
    if p.is_absolute() || path.starts_with('/') || path.starts_with('\\') {
        return Err(escapes(
            "the path is absolute; only paths relative to the artifact are accepted",
        ));
    }
    if path.contains('\\') {
        return Err(escapes("the path contains a backslash; use '/'"));
    }
    if !p.components().all(|c| matches!(c, Component::Normal(_))) {
        return Err(escapes(
            "the path has a '..', '.' or root component; only plain names are accepted",
        ));
    }
    Ok(())
}

/// Resolves a manifest path against the canonical artifact root and refuses it if it is
/// missing, not a file, or (through a symlink) outside the root.
pub fn resolve(root: &Path, path: &str, field: &str) -> Result<PathBuf, ArtifactError> {
    check_relative(path, field)?;
    let joined = root.join(path);
    let canonical = match joined.canonicalize() {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(ArtifactError::MissingFile {
                path: path.to_owned(),
                field: field.to_owned(),
            });
        }
        Err(source) => {
            return Err(ArtifactError::Io {
                path: joined,
                source,
            });
        }
    };
    if !canonical.starts_with(root) {
        return Err(ArtifactError::PathEscapes {
            path: path.to_owned(),
            field: field.to_owned(),
            reason: format!(
                "it resolves to {} outside the artifact directory",
                canonical.display()
            ),
        });
    }
    if !canonical.is_file() {
        return Err(ArtifactError::MissingFile {
            path: path.to_owned(),
            field: field.to_owned(),
        });
    }
    Ok(canonical)
}

/// Pretty JSON (two-space indent) with a trailing newline: the one formatting of every JSON
/// file in an artifact.
pub fn pretty_json<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, serde_json::Error> {
    let mut bytes = serde_json::to_vec_pretty(value)?;
    bytes.push(b'\n');
    Ok(bytes)
}
