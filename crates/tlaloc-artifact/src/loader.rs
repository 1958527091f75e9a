//! Opening an artifact: read the manifest, refuse an unknown format version, validate it,
//! resolve every path it names inside the directory, check each program signature against the
//! contract and each weight file's length. Hashes are checked lazily per body
//! ([`Artifact::body_text`]) and in full by [`Artifact::verify`].

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::{ArtifactError, IntegrityProblem};
use crate::executables::ExecutableEntry;
use crate::manifest::{Entry, FORMAT_VERSION, MANIFEST_FILE, Manifest, WeightEntry};
use crate::paths;
use crate::program::ProgramSignature;

/// An opened, validated artifact directory.
#[derive(Debug, Clone)]
pub struct Artifact {
    root: PathBuf,
    manifest: Manifest,
    /// Index-aligned with `manifest.entries`.
    programs: Vec<ProgramSignature>,
}

/// What [`Artifact::verify`] hashed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VerifyReport {
    pub files: usize,
    pub bytes: u64,
}

fn io_error(path: &Path) -> impl FnOnce(io::Error) -> ArtifactError + '_ {
    move |source| ArtifactError::Io {
        path: path.to_owned(),
        source,
    }
}

impl Artifact {
    pub fn open(dir: impl AsRef<Path>) -> Result<Artifact, ArtifactError> {
        let dir = dir.as_ref();
        let root = dir.canonicalize().map_err(io_error(dir))?;
        let manifest_path = root.join(MANIFEST_FILE);
        let bytes = match std::fs::read(&manifest_path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(ArtifactError::MissingFile {
                    path: MANIFEST_FILE.to_owned(),
                    field: "(the manifest itself)".to_owned(),
                });
            }
            Err(source) => {
                return Err(ArtifactError::Io {
                    path: manifest_path,
                    source,
                });
            }
        };
        let manifest = parse_manifest(&bytes)?;
        manifest.validate()?;

        for (i, entry) in manifest.entries.iter().enumerate() {
            paths::resolve(&root, &entry.body, &format!("entries[{i}].body"))?;
            for (v, variant) in entry.variants.iter().enumerate() {
                paths::resolve(
                    &root,
                    &variant.body,
                    &format!("entries[{i}].variants[{v}].body"),
                )?;
            }
        }
        for (i, w) in manifest.weights.iter().enumerate() {
            for (k, stored) in w.stored_files().into_iter().enumerate() {
                let field = match w.split {
                    None => format!("weights[{i}].file"),
                    Some(_) => format!("weights[{i}].split.shards[{k}].file"),
                };
                let path = paths::resolve(&root, &stored.file, &field)?;
                let found = path.metadata().map_err(io_error(&path))?.len();
                if found != stored.byte_length {
                    return Err(ArtifactError::WeightLengthMismatch {
                        file: stored.file,
                        slot: w.slot.clone(),
                        expected: stored.byte_length,
                        found,
                    });
                }
            }
        }
        for (i, f) in manifest.tokenizer.files.iter().enumerate() {
            paths::resolve(&root, &f.path, &format!("tokenizer.files[{i}].path"))?;
        }
        for (s, set) in manifest.executables.iter().enumerate() {
            for (i, e) in set.entries.iter().enumerate() {
                let field = format!("executables[{s}].entries[{i}].file");
                let path = paths::resolve(&root, &e.file, &field)?;
                let found = path.metadata().map_err(io_error(&path))?.len();
                if found != e.byte_length {
                    return Err(ArtifactError::ExecutableLengthMismatch {
                        file: e.file.clone(),
                        entry: e.entry.clone(),
                        expected: e.byte_length,
                        found,
                    });
                }
            }
        }

        let mut programs = Vec::with_capacity(manifest.entries.len());
        for (i, entry) in manifest.entries.iter().enumerate() {
            let path = paths::resolve(&root, &entry.program, &format!("entries[{i}].program"))?;
            let bytes = std::fs::read(&path).map_err(io_error(&path))?;
            let found: ProgramSignature =
                serde_json::from_slice(&bytes).map_err(|source| ArtifactError::Json {
                    path: entry.program.clone(),
                    source,
                })?;
            let expected = ProgramSignature::expected_for(&manifest, entry);
            found.check_against(&expected).map_err(|mismatch| {
                ArtifactError::ProgramSignatureMismatch {
                    entry: entry.name.clone(),
                    file: entry.program.clone(),
                    mismatch,
                }
            })?;
            programs.push(found);
        }

        let artifact = Artifact {
            root,
            manifest,
            programs,
        };
        // Every body is hashed now, not when its entry is first compiled: a compile cache keyed
        // by the body's name would otherwise run the cached code of a body that was edited.
        let mut checked = std::collections::BTreeSet::new();
        for entry in &artifact.manifest.entries {
            for body in entry.bodies() {
                if checked.insert(body) {
                    artifact.body_text(&entry.with_body(body))?;
                }
            }
        }
        Ok(artifact)
    }

    /// The canonical artifact directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    pub fn entry(&self, name: &str) -> Result<&Entry, ArtifactError> {
        self.manifest
            .entry(name)
            .ok_or_else(|| ArtifactError::UnknownEntry {
                name: name.to_owned(),
            })
    }

    /// The (checked) signature of an entry's program.
    pub fn program(&self, entry: &str) -> Result<&ProgramSignature, ArtifactError> {
        let index = self
            .manifest
            .entries
            .iter()
            .position(|e| e.name == entry)
            .ok_or_else(|| ArtifactError::UnknownEntry {
                name: entry.to_owned(),
            })?;
        Ok(&self.programs[index])
    }

    /// The StableHLO text of an entry's `body` (the portable one, or a variant's through
    /// [`Entry::with_body`]), refused if its sha256 is not the one in its file name.
    pub fn body_text(&self, entry: &Entry) -> Result<String, ArtifactError> {
        let expected =
            paths::body_hash(&entry.body).map_err(|reason| ArtifactError::InvalidManifest {
                field: format!("entry {} body", entry.name),
                reason,
            })?;
        let path = paths::resolve(
            &self.root,
            &entry.body,
            &format!("entry {} body", entry.name),
        )?;
        let bytes = std::fs::read(&path).map_err(io_error(&path))?;
        let found = paths::sha256_hex(&bytes);
        if found != expected {
            return Err(ArtifactError::BodyHashMismatch {
                file: entry.body.clone(),
                found,
            });
        }
        String::from_utf8(bytes).map_err(|_| ArtifactError::BodyNotUtf8 {
            file: entry.body.clone(),
        })
    }

    /// The bytes of one shipped executable, refused unless they hash to the sha256 in the
    /// file's name (so altered bytes are never handed to a plugin).
    pub fn executable_bytes(&self, executable: &ExecutableEntry) -> Result<Vec<u8>, ArtifactError> {
        let field = format!("executable of entry {}", executable.entry);
        let expected = paths::executable_hash(&executable.file).map_err(|reason| {
            ArtifactError::InvalidManifest {
                field: field.clone(),
                reason,
            }
        })?;
        let path = paths::resolve(&self.root, &executable.file, &field)?;
        let bytes = std::fs::read(&path).map_err(io_error(&path))?;
        let found = paths::sha256_hex(&bytes);
        if found != expected {
            return Err(ArtifactError::ExecutableHashMismatch {
                file: executable.file.clone(),
                entry: executable.entry.clone(),
                found,
            });
        }
        Ok(bytes)
    }

    /// The bytes of one weight file (the operand itself), length-checked. A split weight has
    /// no one file: it is refused ([`ArtifactError::WeightIsSplit`]); see
    /// [`Self::weight_shard_bytes`].
    pub fn weight_bytes(&self, slot: &str) -> Result<Vec<u8>, ArtifactError> {
        let mut bytes = vec![0u8; self.weight_entry(slot)?.byte_length as usize];
        self.read_weight_into(slot, &mut bytes)?;
        Ok(bytes)
    }

    /// The bytes device `shard` of a tensor-parallel artifact uploads for weight `slot`: its
    /// shard file for a split weight, the whole file for a replicated one. Length-checked.
    pub fn weight_shard_bytes(&self, slot: &str, shard: usize) -> Result<Vec<u8>, ArtifactError> {
        use std::io::Read as _;
        let weight = self.weight_entry(slot)?;
        let degree = self.manifest.tensor_parallel_degree();
        if shard >= degree {
            return Err(ArtifactError::UnknownShard {
                slot: slot.to_owned(),
                shard,
                degree,
            });
        }
        let stored = match &weight.split {
            None => weight.stored_files().remove(0),
            Some(split) => split.shards[shard].clone(),
        };
        let path = paths::resolve(
            &self.root,
            &stored.file,
            &format!("weight {slot} shard {shard} file"),
        )?;
        let mut file = std::fs::File::open(&path).map_err(io_error(&path))?;
        let found = file.metadata().map_err(io_error(&path))?.len();
        if found != stored.byte_length {
            return Err(ArtifactError::WeightLengthMismatch {
                file: stored.file,
                slot: slot.to_owned(),
                expected: stored.byte_length,
                found,
            });
        }
        let mut bytes = vec![0u8; stored.byte_length as usize];
        file.read_exact(&mut bytes).map_err(io_error(&path))?;
        Ok(bytes)
    }

    fn weight_entry(&self, slot: &str) -> Result<&WeightEntry, ArtifactError> {
        self.manifest
            .weight(slot)
            .ok_or_else(|| ArtifactError::UnknownWeightSlot {
                slot: slot.to_owned(),
            })
    }

    /// Reads the weight `slot`'s file into `into`, which must be exactly its byte length (for
    /// a loader that reuses one staging buffer across weights), length-checked.
    pub fn read_weight_into(&self, slot: &str, into: &mut [u8]) -> Result<(), ArtifactError> {
        use std::io::Read as _;
        let weight = self.weight_entry(slot)?;
        if weight.split.is_some() {
            return Err(ArtifactError::WeightIsSplit {
                slot: slot.to_owned(),
                degree: self.manifest.tensor_parallel_degree(),
            });
        }
        let path = self.resolve_weight(weight)?;
        let mismatch = |found: u64| ArtifactError::WeightLengthMismatch {
            file: weight.file.clone(),
            slot: weight.slot.clone(),
            expected: weight.byte_length,
            found,
        };
        assert_eq!(
            into.len() as u64,
            weight.byte_length,
            "read_weight_into: the buffer for {slot} must be its byte length"
        );
        let mut file = std::fs::File::open(&path).map_err(io_error(&path))?;
        let found = file.metadata().map_err(io_error(&path))?.len();
        if found != weight.byte_length {
            return Err(mismatch(found));
        }
        file.read_exact(into).map_err(io_error(&path))?;
        Ok(())
    }

    fn resolve_weight(&self, weight: &WeightEntry) -> Result<PathBuf, ArtifactError> {
        paths::resolve(
            &self.root,
            &weight.file,
            &format!("weight {} file", weight.slot),
        )
    }

    /// Re-hashes every body, weight, tokenizer and executable file. All mismatches are reported together in
    /// [`ArtifactError::IntegrityFailed`], each naming its file.
    pub fn verify(&self) -> Result<VerifyReport, ArtifactError> {
        let mut checks: Vec<(String, String)> = Vec::new();
        for body in self.manifest.entries.iter().flat_map(Entry::bodies) {
            if let Ok(hash) = paths::body_hash(body)
                && !checks.iter().any(|(file, _)| file == body)
            {
                checks.push((body.to_owned(), hash.to_owned()));
            }
        }
        checks.extend(
            self.manifest
                .weights
                .iter()
                .flat_map(WeightEntry::stored_files)
                .map(|f| (f.file, f.sha256)),
        );
        checks.extend(
            self.manifest
                .tokenizer
                .files
                .iter()
                .map(|f| (f.path.clone(), f.sha256.clone())),
        );
        for set in &self.manifest.executables {
            for e in &set.entries {
                if let Ok(hash) = paths::executable_hash(&e.file)
                    && !checks.iter().any(|(file, _)| *file == e.file)
                {
                    checks.push((e.file.clone(), hash.to_owned()));
                }
            }
        }

        let mut problems = Vec::new();
        let mut report = VerifyReport { files: 0, bytes: 0 };
        for (file, expected) in checks {
            match hash_file(&self.root, &file) {
                Ok((found, len)) => {
                    report.files += 1;
                    report.bytes += len;
                    if found != expected {
                        problems.push(IntegrityProblem::HashMismatch {
                            file,
                            expected,
                            found,
                        });
                    }
                }
                Err(reason) => problems.push(IntegrityProblem::Unreadable { file, reason }),
            }
        }
        if problems.is_empty() {
            Ok(report)
        } else {
            Err(ArtifactError::IntegrityFailed { problems })
        }
    }
}

fn hash_file(root: &Path, file: &str) -> Result<(String, u64), String> {
    let path = paths::resolve(root, file, "verify").map_err(|e| e.to_string())?;
    let mut hasher = Sha256::new();
    let mut reader = File::open(&path).map_err(|e| e.to_string())?;
    let len = io::copy(&mut reader, &mut hasher).map_err(|e| e.to_string())?;
    Ok((hex::encode(hasher.finalize()), len))
}

/// Parses manifest bytes as [`Artifact::open`] does (before its checks against the files):
/// `formatVersion` is read before the schema, so an artifact of another version is refused as
/// such rather than as a schema error. Public for the fuzz harness; [`Manifest::validate`] is
/// the next step.
pub fn parse_manifest(bytes: &[u8]) -> Result<Manifest, ArtifactError> {
    let json_error = |source| ArtifactError::Json {
        path: MANIFEST_FILE.to_owned(),
        source,
    };
    let value: serde_json::Value = serde_json::from_slice(bytes).map_err(json_error)?;
    match value.get("formatVersion") {
        Some(v) => match v.as_u64() {
            Some(found) if found == u64::from(FORMAT_VERSION) => {}
            Some(found) => {
                return Err(ArtifactError::UnsupportedFormatVersion {
                    found,
                    supported: FORMAT_VERSION,
                });
            }
            None => {
                return Err(ArtifactError::InvalidManifest {
                    field: "formatVersion".into(),
                    reason: format!("{v} is not a non-negative integer; expected {FORMAT_VERSION}"),
                });
            }
        },
        None => {
            return Err(ArtifactError::InvalidManifest {
                field: "formatVersion".into(),
                reason: format!("missing; expected {FORMAT_VERSION}"),
            });
        }
    }
    serde_json::from_value(value).map_err(json_error)
}
