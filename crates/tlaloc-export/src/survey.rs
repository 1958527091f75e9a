//! What `tlaloc inspect` says about a checkpoint before any export work: the architecture it
//! declares, how many tensors it stores in each element type, and whether export accepts it. The
//! verdict is [`Checkpoint::open`] itself (config, tensor roles and shapes, element types), the
//! same call export starts with, so the two cannot disagree; the architecture and type counts are
//! read separately, from the headers alone, so that they are reported for a refused checkpoint
//! too.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::path::Path;

use crate::checkpoint::Checkpoint;
use crate::error::IngestError;
use crate::gguf::{self, MetaValue};
use crate::safetensors::SafetensorsStore;

/// How many tensors a checkpoint stores in one element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TypeCount {
    /// Number of tensors.
    pub tensors: usize,
    /// Whether the reader of this format reads the type.
    pub supported: bool,
}

type Facts = (Option<String>, Option<String>, BTreeMap<String, TypeCount>);

fn count(types: &mut BTreeMap<String, TypeCount>, name: &str, supported: bool) {
    types
        .entry(name.to_string())
        .or_insert(TypeCount {
            tensors: 0,
            supported,
        })
        .tensors += 1;
}

/// A checkpoint's description and export verdict.
#[derive(Debug)]
pub struct Survey {
    /// The container as found (`GGUF v3`, `safetensors (1 file)`, ...), if it could be read.
    pub format: Option<String>,
    /// The architecture the checkpoint declares (GGUF `general.architecture`; config.json
    /// `architectures` or `model_type`), if it declares one.
    pub architecture: Option<String>,
    /// Stored element type (`Q4_K`, `BF16`, ...) to the tensors stored in it.
    pub tensor_types: BTreeMap<String, TypeCount>,
    /// The opened checkpoint when export accepts it, else export's refusal.
    pub verdict: Result<Checkpoint, IngestError>,
}

impl Survey {
    /// Surveys the Hugging Face directory or `.gguf` file at `path`.
    pub fn of(path: impl AsRef<Path>) -> Self {
        let path = path.as_ref();
        let (format, architecture, tensor_types) = if path.is_dir() {
            hf_dir_facts(path)
        } else {
            gguf_facts(path)
        };
        Self {
            format,
            architecture,
            tensor_types,
            verdict: Checkpoint::open(path),
        }
    }

    /// Whether export accepts the checkpoint.
    pub fn accepted(&self) -> bool {
        self.verdict.is_ok()
    }
}

impl fmt::Display for Survey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let unknown = "not found";
        writeln!(f, "format: {}", self.format.as_deref().unwrap_or(unknown))?;
        writeln!(
            f,
            "architecture: {}",
            self.architecture.as_deref().unwrap_or(unknown)
        )?;
        let total: usize = self.tensor_types.values().map(|c| c.tensors).sum();
        let mut types = String::new();
        for (i, (name, c)) in self.tensor_types.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            let _ = write!(types, "{sep}{name} {}", c.tensors);
            if !c.supported {
                types.push_str(" (not supported)");
            }
        }
        if self.tensor_types.is_empty() {
            types.push_str(unknown);
        }
        writeln!(f, "tensors by type ({total}): {types}")?;
        match &self.verdict {
            Ok(_) => write!(f, "export: accepted"),
            Err(e) => write!(f, "export: refused: {e}"),
        }
    }
}

fn gguf_facts(path: &Path) -> Facts {
    let Ok(file) = std::fs::File::open(path) else {
        return (None, None, BTreeMap::new());
    };
    let Ok(bytes) = crate::mapped::map_file(&file) else {
        return (None, None, BTreeMap::new());
    };
    let Ok(header) = gguf::parse_header(path, &bytes) else {
        return (None, None, BTreeMap::new());
    };
    let architecture = header
        .get("general.architecture")
        .and_then(MetaValue::as_str)
        .map(str::to_string);
    let mut types = BTreeMap::new();
    for t in &header.tensors {
        count(&mut types, t.ggml_type.name(), t.ggml_type.is_supported());
    }
    (
        Some(format!("GGUF v{}", header.version)),
        architecture,
        types,
    )
}

fn hf_dir_facts(dir: &Path) -> Facts {
    let architecture = std::fs::read(dir.join("config.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|config| {
            let names: Vec<&str> = config["architectures"]
                .as_array()
                .map(|a| a.iter().filter_map(|v| v.as_str()).collect())
                .unwrap_or_default();
            let model_type = config["model_type"].as_str();
            match (names.is_empty(), model_type) {
                (false, Some(t)) => Some(format!("{} (model_type {t})", names.join(", "))),
                (false, None) => Some(names.join(", ")),
                (true, Some(t)) => Some(format!("model_type {t}")),
                (true, None) => None,
            }
        });
    let Ok((store, files)) = SafetensorsStore::open_dir(dir) else {
        return (None, architecture, BTreeMap::new());
    };
    let mut types = BTreeMap::new();
    for e in store.entries() {
        let supported = crate::safetensors::ACCEPTED_DTYPES
            .split(", ")
            .any(|d| d == e.dtype);
        count(&mut types, &e.dtype, supported);
    }
    let format = format!(
        "safetensors ({} file{})",
        files.len(),
        if files.len() == 1 { "" } else { "s" }
    );
    (Some(format), architecture, types)
}
