//! Reading safetensors checkpoints: one `model.safetensors` or shards listed by
//! `model.safetensors.index.json`, each memory-mapped. Header parsing and offset validation are
//! the `safetensors` crate's; this module adds the dtype policy (F32, BF16, F16 read, everything
//! else refused by name) and the shard bookkeeping.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use safetensors::SafeTensors;
use safetensors::tensor::{Dtype, Metadata};
use serde::Deserialize;

use crate::checkpoint::{Tensor, TensorData};
use crate::error::{IngestError, Result, io_error};
use crate::mapped::map_file;

/// The dtypes read from safetensors.
pub const ACCEPTED_DTYPES: &str = "F32, BF16, F16";

/// One safetensors tensor as the header describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SafetensorsEntry {
    /// Name in the file.
    pub name: String,
    /// Stored dtype, as the format spells it (`F32`, `BF16`, ...).
    pub dtype: String,
    /// Dimensions, outermost first.
    pub dims: Vec<usize>,
    /// Byte length of the data.
    pub byte_len: usize,
}

#[derive(Debug)]
struct MappedFile {
    path: PathBuf,
    mmap: Vec<u8>,
    header_len: usize,
    metadata: Metadata,
}

/// A memory-mapped single-file or sharded safetensors checkpoint.
#[derive(Debug)]
pub struct SafetensorsStore {
    files: Vec<MappedFile>,
    by_name: BTreeMap<String, usize>,
}

#[derive(Deserialize)]
struct ShardIndex {
    weight_map: BTreeMap<String, String>,
}

/// The file name of a sharded checkpoint's index.
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// The file name of a single-file checkpoint.
pub const SINGLE_FILE: &str = "model.safetensors";

impl SafetensorsStore {
    /// Opens `dir/model.safetensors`, or the shards named by `dir/model.safetensors.index.json`.
    /// Returns the store and the file names it read, in a stable order.
    pub fn open_dir(dir: &Path) -> Result<(Self, Vec<String>)> {
        let index_path = dir.join(INDEX_FILE);
        let single_path = dir.join(SINGLE_FILE);
        let (file_names, index) = if index_path.is_file() {
            let text = std::fs::read_to_string(&index_path).map_err(io_error(&index_path))?;
            let index: ShardIndex = serde_json::from_str(&text).map_err(|e| IngestError::Json {
                path: index_path.clone(),
                reason: e.to_string(),
            })?;
            let mut shards: Vec<String> = index.weight_map.values().cloned().collect();
            shards.sort();
            shards.dedup();
            for shard in &shards {
                if shard.contains(['/', '\\']) || shard == ".." || shard.is_empty() {
                    return Err(IngestError::NotACheckpoint {
                        path: index_path.clone(),
                        reason: format!(
                            "shard name {shard:?} is not a plain file name beside the index"
                        ),
                    });
                }
            }
            (shards, Some(index))
        } else if single_path.is_file() {
            (vec![SINGLE_FILE.to_string()], None)
        } else {
            return Err(IngestError::NotACheckpoint {
                path: dir.to_path_buf(),
                reason: format!("neither {SINGLE_FILE} nor {INDEX_FILE} is in this directory"),
            });
        };
        let mut files = Vec::with_capacity(file_names.len());
        for name in &file_names {
            files.push(MappedFile::open(&dir.join(name))?);
        }
        let mut by_name = BTreeMap::new();
        for (i, file) in files.iter().enumerate() {
            for name in file.metadata.tensors().keys() {
                if let Some(previous) = by_name.insert(name.clone(), i) {
                    return Err(IngestError::Safetensors {
                        path: file.path.clone(),
                        reason: format!(
                            "tensor `{name}` is also in {}",
                            files[previous].path.display()
                        ),
                    });
                }
            }
        }
        if let Some(index) = index {
            for (tensor, shard) in &index.weight_map {
                let found = by_name.get(tensor).map(|&i| &file_names[i]);
                if found != Some(shard) {
                    return Err(IngestError::Safetensors {
                        path: index_path.clone(),
                        reason: format!(
                            "the index places `{tensor}` in {shard} but it is {}",
                            found.map_or("in no shard".to_string(), |f| format!("in {f}"))
                        ),
                    });
                }
            }
            if by_name.len() != index.weight_map.len() {
                let extra: Vec<&String> = by_name
                    .keys()
                    .filter(|n| !index.weight_map.contains_key(*n))
                    .collect();
                return Err(IngestError::Safetensors {
                    path: index_path,
                    reason: format!("shards hold tensors the index does not list: {extra:?}"),
                });
            }
        }
        Ok((Self { files, by_name }, file_names))
    }

    /// Every tensor, sorted by name.
    pub fn entries(&self) -> Vec<SafetensorsEntry> {
        self.by_name
            .iter()
            .filter_map(|(name, &i)| {
                self.files[i]
                    .metadata
                    .info(name)
                    .map(|info| entry(name, info))
            })
            .collect()
    }

    /// Reads one tensor by its name in the file.
    pub fn read(&self, name: &str) -> Result<Tensor> {
        let &i = self
            .by_name
            .get(name)
            .ok_or_else(|| IngestError::MissingTensors {
                names: vec![name.to_string()],
                more: 0,
            })?;
        let file = &self.files[i];
        let info = file
            .metadata
            .info(name)
            .ok_or_else(|| IngestError::MissingTensors {
                names: vec![name.to_string()],
                more: 0,
            })?;
        // Offsets were validated against the buffer length by `read_metadata`.
        let data = &file.mmap[8 + file.header_len..];
        let (start, end) = info.data_offsets;
        let bytes = data
            .get(start..end)
            .ok_or_else(|| IngestError::Safetensors {
                path: file.path.clone(),
                reason: format!("tensor `{name}` lies past the end of the file"),
            })?;
        decode(name, info.dtype, &info.shape, bytes)
    }
}

fn entry(name: &str, info: &safetensors::tensor::TensorInfo) -> SafetensorsEntry {
    SafetensorsEntry {
        name: name.to_string(),
        dtype: format!("{:?}", info.dtype),
        dims: info.shape.clone(),
        byte_len: info.data_offsets.1 - info.data_offsets.0,
    }
}

impl MappedFile {
    fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(io_error(path))?;
        let mmap = map_file(&file).map_err(io_error(path))?;
        let (header_len, metadata) =
            parse_header(&mmap).map_err(|reason| IngestError::Safetensors {
                path: path.to_path_buf(),
                reason,
            })?;
        Ok(Self {
            path: path.to_path_buf(),
            mmap,
            header_len,
            metadata,
        })
    }
}

/// Parses and validates a safetensors header (length prefix, JSON, offsets, sizes) against the
/// whole file's bytes. Returns the JSON length and the metadata.
pub fn parse_header(bytes: &[u8]) -> std::result::Result<(usize, Metadata), String> {
    SafeTensors::read_metadata(bytes).map_err(|e| format!("{e:?}"))
}

/// Decodes every tensor of an in-memory safetensors file, sorted by name. This is the whole read
/// path of a file without the filesystem, so that it can be exercised on arbitrary bytes.
pub fn decode_all(bytes: &[u8]) -> Result<Vec<(String, Tensor)>> {
    let (header_len, metadata) =
        parse_header(bytes).map_err(|reason| IngestError::Safetensors {
            path: PathBuf::from("<memory>"),
            reason,
        })?;
    let data = &bytes[8 + header_len..];
    let mut names: Vec<String> = metadata.tensors().keys().cloned().collect();
    names.sort();
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let Some(info) = metadata.info(&name) else {
            continue;
        };
        let (start, end) = info.data_offsets;
        let slice = data
            .get(start..end)
            .ok_or_else(|| IngestError::Safetensors {
                path: PathBuf::from("<memory>"),
                reason: format!("tensor `{name}` lies past the end of the buffer"),
            })?;
        let tensor = decode(&name, info.dtype, &info.shape, slice)?;
        out.push((name, tensor));
    }
    Ok(out)
}

fn decode(name: &str, dtype: Dtype, shape: &[usize], bytes: &[u8]) -> Result<Tensor> {
    let data = match dtype {
        Dtype::F32 => TensorData::F32(
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ),
        Dtype::BF16 => TensorData::BF16(
            bytes
                .chunks_exact(2)
                .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])))
                .collect(),
        ),
        Dtype::F16 => TensorData::F16(
            bytes
                .chunks_exact(2)
                .map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]])))
                .collect(),
        ),
        other => {
            return Err(IngestError::UnsupportedDtype {
                tensor: name.to_string(),
                dtype: format!("{other:?}"),
                accepted: ACCEPTED_DTYPES,
            });
        }
    };
    Tensor::new(name, shape.to_vec(), data)
}
