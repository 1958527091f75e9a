//! Writing an artifact directory. The exporter produces graphs and bytes; this module alone
//! decides where they go and how they are named, so the layout has one owner. Output is
//! deterministic: content-addressed bodies, index-prefixed weight files, pretty JSON with a
//! trailing newline. [`ArtifactWriter::finish`] writes the manifest last and then opens the
//! result with the loader, so an artifact the loader would refuse is never reported as written.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::dtype::Dtype;
use crate::error::ArtifactError;
use crate::loader::Artifact;
use crate::manifest::{MANIFEST_FILE, Manifest, TokenizerFile, WeightEntry};
use crate::paths;
use crate::program::ProgramSignature;
use crate::quant::BlockFormat;
use crate::tensor_parallel::{self, WeightShard, WeightSplit};

/// Whether [`ArtifactWriter::create_with`] may replace an existing artifact.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExistingDir {
    /// Refuse a directory that is not empty.
    Refuse,
    /// Remove and rewrite a directory that holds an artifact manifest; any other non-empty
    /// directory is still refused.
    ReplaceArtifact,
}

#[derive(Debug)]
pub struct ArtifactWriter {
    root: PathBuf,
    bodies: BTreeSet<String>,
    programs: BTreeMap<String, ProgramSignature>,
    weight_slots: BTreeSet<String>,
    tokenizer_files: BTreeSet<String>,
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> ArtifactError + '_ {
    move |source| ArtifactError::Io {
        path: path.to_owned(),
        source,
    }
}

fn check_name(what: &'static str, name: &str) -> Result<(), ArtifactError> {
    paths::check_name(name).map_err(|reason| ArtifactError::InvalidName {
        what,
        name: name.to_owned(),
        reason,
    })
}

impl ArtifactWriter {
    /// Starts an artifact in `dir`, which must be missing or empty.
    pub fn create(dir: impl AsRef<Path>) -> Result<ArtifactWriter, ArtifactError> {
        Self::create_with(dir, ExistingDir::Refuse)
    }

    pub fn create_with(
        dir: impl AsRef<Path>,
        existing: ExistingDir,
    ) -> Result<ArtifactWriter, ArtifactError> {
        let dir = dir.as_ref();
        if dir.exists() {
            let non_empty = std::fs::read_dir(dir)
                .map_err(io_error(dir))?
                .next()
                .is_some();
            if non_empty {
                match existing {
                    ExistingDir::Refuse => {
                        return Err(ArtifactError::DirectoryNotEmpty {
                            path: dir.to_owned(),
                        });
                    }
                    ExistingDir::ReplaceArtifact => {
                        if !dir.join(MANIFEST_FILE).is_file() {
                            return Err(ArtifactError::NotAnArtifact {
                                path: dir.to_owned(),
                            });
                        }
                        std::fs::remove_dir_all(dir).map_err(io_error(dir))?;
                    }
                }
            }
        }
        for sub in [
            "",
            paths::BODIES_DIR,
            paths::PROGRAMS_DIR,
            paths::WEIGHTS_DIR,
            paths::TOKENIZER_DIR,
        ] {
            let path = dir.join(sub);
            std::fs::create_dir_all(&path).map_err(io_error(&path))?;
        }
        Ok(ArtifactWriter {
            root: dir.to_owned(),
            bodies: BTreeSet::new(),
            programs: BTreeMap::new(),
            weight_slots: BTreeSet::new(),
            tokenizer_files: BTreeSet::new(),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn write_file(&self, relative: &str, bytes: &[u8]) -> Result<(), ArtifactError> {
        let path = self.root.join(relative);
        std::fs::write(&path, bytes).map_err(io_error(&path))
    }

    /// Writes StableHLO text under its sha256 and returns the manifest path
    /// (`bodies/<sha256>.mlir`). The same text written twice is stored once.
    pub fn write_body(&mut self, text: &str) -> Result<String, ArtifactError> {
        let relative = paths::body_path(&paths::sha256_hex(text.as_bytes()));
        if !self.bodies.contains(&relative) {
            self.write_file(&relative, text.as_bytes())?;
            self.bodies.insert(relative.clone());
        }
        Ok(relative)
    }

    /// Writes one weight operand as `weights/NNNN_<slot>.bin` and returns its manifest row.
    /// `bytes` must be the dense little-endian tensor of `dtype` and `dims`.
    pub fn write_weight(
        &mut self,
        index: usize,
        slot: &str,
        dtype: Dtype,
        dims: &[usize],
        bytes: &[u8],
    ) -> Result<WeightEntry, ArtifactError> {
        self.write_weight_as(index, slot, dtype, dims, None, bytes)
    }

    /// Writes one block-quantized weight of logical dims `dims` (`[out, in]`) as its raw
    /// blocks (`format`'s layout, see [`crate::quant`]) and returns its manifest row.
    pub fn write_block_weight(
        &mut self,
        index: usize,
        slot: &str,
        format: BlockFormat,
        dims: &[usize],
        bytes: &[u8],
    ) -> Result<WeightEntry, ArtifactError> {
        self.write_weight_as(
            index,
            slot,
            BlockFormat::OPERAND_DTYPE,
            dims,
            Some(format),
            bytes,
        )
    }

    /// Writes one weight of a tensor-parallel artifact split over `degree` devices along
    /// `axis` of its (logical) `dims`: `bytes` is the whole operand (dense `dtype`, or raw
    /// blocks of `block_format`), cut into `degree` shards as [`crate::tensor_parallel`] says,
    /// each written as `weights/NNNN_<slot>.shard<k>.bin`. Returns the manifest row.
    #[allow(clippy::too_many_arguments)]
    pub fn write_split_weight(
        &mut self,
        index: usize,
        slot: &str,
        dtype: Dtype,
        dims: &[usize],
        block_format: Option<BlockFormat>,
        (axis, degree): (usize, usize),
        bytes: &[u8],
    ) -> Result<WeightEntry, ArtifactError> {
        let dtype = if block_format.is_some() {
            BlockFormat::OPERAND_DTYPE
        } else {
            dtype
        };
        let mut row = self.check_weight(slot, dtype, dims, block_format, bytes)?;
        let refused = |reason: String| ArtifactError::InvalidManifest {
            field: format!("weight {slot} split"),
            reason,
        };
        tensor_parallel::shard_dims(dims, block_format, axis, degree).map_err(refused)?;
        let (elem, operand_dims) =
            tensor_parallel::operand_layout(dtype, dims, block_format).map_err(refused)?;
        let mut shards = Vec::with_capacity(degree);
        for (k, shard) in tensor_parallel::split_operand(bytes, &operand_dims, elem, axis, degree)
            .into_iter()
            .enumerate()
        {
            let file = paths::weight_shard_path(index, slot, k);
            self.write_file(&file, &shard)?;
            shards.push(WeightShard {
                file,
                byte_length: shard.len() as u64,
                sha256: paths::sha256_hex(&shard),
            });
        }
        row.split = Some(WeightSplit { axis, shards });
        Ok(row)
    }

    /// The manifest row of a weight whose bytes fit its dims, with no file named yet; refuses a
    /// bad name, a length that disagrees, and a slot written before.
    fn check_weight(
        &mut self,
        slot: &str,
        dtype: Dtype,
        dims: &[usize],
        block_format: Option<BlockFormat>,
        bytes: &[u8],
    ) -> Result<WeightEntry, ArtifactError> {
        check_name("weight slot", slot)?;
        let expected = match block_format {
            None => dtype.byte_length(dims),
            Some(format) => format.byte_length(dims),
        };
        if expected != Some(bytes.len() as u64) {
            return Err(ArtifactError::WeightSizeMismatch {
                slot: slot.to_owned(),
                dtype,
                dims: dims.to_vec(),
                expected: expected.map_or("more than 2^64".to_owned(), |l| l.to_string()),
                found: bytes.len(),
            });
        }
        if !self.weight_slots.insert(slot.to_owned()) {
            return Err(ArtifactError::Duplicate {
                what: "weight slot",
                name: slot.to_owned(),
            });
        }
        Ok(WeightEntry {
            slot: slot.to_owned(),
            file: String::new(),
            dtype,
            dims: dims.to_vec(),
            byte_length: bytes.len() as u64,
            sha256: String::new(),
            block_format,
            split: None,
        })
    }

    fn write_weight_as(
        &mut self,
        index: usize,
        slot: &str,
        dtype: Dtype,
        dims: &[usize],
        block_format: Option<BlockFormat>,
        bytes: &[u8],
    ) -> Result<WeightEntry, ArtifactError> {
        let mut row = self.check_weight(slot, dtype, dims, block_format, bytes)?;
        let file = paths::weight_path(index, slot);
        self.write_file(&file, bytes)?;
        row.file = file;
        row.sha256 = paths::sha256_hex(bytes);
        Ok(row)
    }

    /// Writes `programs/<entry>.json` and returns its manifest path.
    pub fn write_program(&mut self, signature: &ProgramSignature) -> Result<String, ArtifactError> {
        check_name("entry", &signature.entry)?;
        if self.programs.contains_key(&signature.entry) {
            return Err(ArtifactError::Duplicate {
                what: "program of entry",
                name: signature.entry.clone(),
            });
        }
        let relative = paths::program_path(&signature.entry);
        let bytes = signature
            .to_json_bytes()
            .map_err(|source| ArtifactError::Json {
                path: relative.clone(),
                source,
            })?;
        self.write_file(&relative, &bytes)?;
        self.programs
            .insert(signature.entry.clone(), signature.clone());
        Ok(relative)
    }

    /// Writes `tokenizer/<name>` and returns its manifest row.
    pub fn write_tokenizer_file(
        &mut self,
        name: &str,
        bytes: &[u8],
    ) -> Result<TokenizerFile, ArtifactError> {
        check_name("tokenizer file", name)?;
        if !self.tokenizer_files.insert(name.to_owned()) {
            return Err(ArtifactError::Duplicate {
                what: "tokenizer file",
                name: name.to_owned(),
            });
        }
        let path = paths::tokenizer_path(name);
        self.write_file(&path, bytes)?;
        Ok(TokenizerFile {
            name: name.to_owned(),
            path,
            sha256: paths::sha256_hex(bytes),
        })
    }

    /// Validates `manifest` and the programs written against the contract, writes
    /// `tlaloc-serving.json`, and opens the result with the loader.
    pub fn finish(self, manifest: &Manifest) -> Result<Artifact, ArtifactError> {
        manifest.validate()?;
        for entry in &manifest.entries {
            let expected = ProgramSignature::expected_for(manifest, entry);
            let written =
                self.programs
                    .get(&entry.name)
                    .ok_or_else(|| ArtifactError::MissingFile {
                        path: entry.program.clone(),
                        field: format!("entry {} program (never written)", entry.name),
                    })?;
            written.check_against(&expected).map_err(|mismatch| {
                ArtifactError::ProgramSignatureMismatch {
                    entry: entry.name.clone(),
                    file: entry.program.clone(),
                    mismatch,
                }
            })?;
        }
        let bytes = manifest
            .to_json_bytes()
            .map_err(|source| ArtifactError::Json {
                path: MANIFEST_FILE.to_owned(),
                source,
            })?;
        self.write_file(MANIFEST_FILE, &bytes)?;
        Artifact::open(&self.root)
    }
}
