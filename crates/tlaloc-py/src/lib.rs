//! The Python extension `vllm_tlaloc._tlaloc`: the runtime's [`StepExecutor`] over a loaded
//! [`Model`], for schedulers written in Python (vLLM's), plus an artifact's shape read from its
//! manifest alone.
//!
//! The surface is thin on purpose: [`open_artifact`] reads a manifest (no device, so a
//! scheduler process can size itself without a PJRT client); [`load`] creates the client and
//! loads the model — only when called, never at import, because vLLM forks its engine process
//! after importing plugins; [`Executor::execute`] runs one step with the GIL released. Logits
//! come back as little-endian `f32` bytes, one `bytes` per row that asked, which Python wraps
//! without a copy per element. Every Rust error becomes a Python exception whose message is
//! the error's own: a refused row or config is a `ValueError`, a failed load or device step a
//! [`TlalocError`].

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::sync::Mutex;

use pyo3::create_exception;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use tlaloc_artifact::Artifact;
use tlaloc_artifact::hf_config::{HF_CONFIG_FILE, check_hf_config};
use tlaloc_pjrt::discovery::PluginRequest;
use tlaloc_runtime::{CompileMode, LoadOptions, Model, StepError, StepExecutor, StepRow};

create_exception!(
    _tlaloc,
    TlalocError,
    PyRuntimeError,
    "A load or a device step failed; the message is the runtime's."
);

/// An artifact's shape as its manifest states it: what a scheduler must match.
#[pyclass(frozen, get_all, module = "vllm_tlaloc._tlaloc")]
#[derive(Debug, Clone)]
pub struct ArtifactInfo {
    /// The artifact directory.
    pub path: String,
    /// The checkpoint's architecture class, e.g. `LlamaForCausalLM`.
    pub architecture: String,
    /// Weights and activations (`f32`, `bf16`).
    pub dtype: String,
    /// The K/V pools' element type.
    pub kv_cache_dtype: String,
    pub vocab_size: usize,
    pub num_layers: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    /// Tokens per K/V block.
    pub block_size: usize,
    /// Blocks in each pool, the scratch block 0 included.
    pub num_blocks: usize,
    /// The most rows one decode entry runs.
    pub max_batch: usize,
    /// The longest context (prompt and output) any entry holds.
    pub max_context: usize,
    /// The longest prefill chunk; longer prompt rows run in several chunks.
    pub max_prefill_chunk: usize,
    pub eos_token_ids: Vec<u32>,
    pub bos_token_id: Option<u32>,
    /// The Hugging Face model directory inside the artifact (its `config.json` and tokenizer).
    pub hf_dir: String,
}

#[pymethods]
impl ArtifactInfo {
    /// Refuses the artifact's `config.json` unless it agrees with the manifest, naming the
    /// first field that does not (`ValueError`).
    fn check_hf_config(&self) -> PyResult<()> {
        let artifact =
            Artifact::open(&self.path).map_err(|e| PyValueError::new_err(e.to_string()))?;
        let path = PathBuf::from(&self.hf_dir).join(HF_CONFIG_FILE);
        let bytes = std::fs::read(&path).map_err(|e| {
            PyValueError::new_err(format!(
                "{}: {e}; export the artifact with this version of tlaloc, which writes it",
                path.display()
            ))
        })?;
        check_hf_config(artifact.manifest(), &bytes)
            .map_err(|e| PyValueError::new_err(format!("{}: {e}", path.display())))
    }

    fn __repr__(&self) -> String {
        format!(
            "ArtifactInfo(path={:?}, architecture={:?}, dtype={:?}, block_size={}, num_blocks={}, max_batch={}, max_context={})",
            self.path,
            self.architecture,
            self.dtype,
            self.block_size,
            self.num_blocks,
            self.max_batch,
            self.max_context
        )
    }
}

impl ArtifactInfo {
    fn of(artifact: &Artifact) -> ArtifactInfo {
        let m = artifact.manifest();
        ArtifactInfo {
            path: artifact.root().display().to_string(),
            architecture: m.model.architecture.clone(),
            dtype: m.dtype.name().to_owned(),
            kv_cache_dtype: m.kv_cache.dtype.name().to_owned(),
            vocab_size: m.model.vocab_size,
            num_layers: m.model.num_layers,
            num_kv_heads: m.kv_cache.num_kv_heads,
            head_dim: m.kv_cache.head_dim,
            block_size: m.kv_cache.block_size,
            num_blocks: m.kv_cache.num_blocks,
            max_batch: m.ladder.max_decode_batch(),
            max_context: m.ladder.max_context(),
            max_prefill_chunk: m.ladder.max_prefill_chunk(),
            eos_token_ids: m.model.eos_token_ids.clone(),
            bos_token_id: m.model.bos_token_id,
            hf_dir: artifact
                .root()
                .join(tlaloc_artifact::paths::TOKENIZER_DIR)
                .display()
                .to_string(),
        }
    }
}

/// Reads the artifact's manifest (checked, not re-hashed); creates no device client.
#[pyfunction]
fn open_artifact(path: PathBuf) -> PyResult<ArtifactInfo> {
    let artifact = Artifact::open(&path).map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(ArtifactInfo::of(&artifact))
}

/// A loaded model's step executor. `execute` may be called from any Python thread; steps run
/// one at a time.
#[pyclass(frozen, module = "vllm_tlaloc._tlaloc")]
#[derive(Debug)]
pub struct Executor {
    inner: Mutex<StepExecutor<Model>>,
    info: ArtifactInfo,
}

/// One row as Python passes it: token ids, start position, block ids, whether logits are wanted.
type PyRow = (Vec<u32>, usize, Vec<u32>, bool);

#[pymethods]
impl Executor {
    /// The artifact's shape.
    #[getter]
    fn info(&self) -> ArtifactInfo {
        self.info.clone()
    }

    /// The plugin file the model runs on.
    #[getter]
    fn plugin_path(&self) -> String {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner
            .executor()
            .platform()
            .plugin_path
            .display()
            .to_string()
    }

    /// Runs one step: `rows` is a list of `(token_ids, start, block_ids, want_logits)`; returns
    /// one `(next_token, logits)` per row, `logits` the row's last position's `f32` logits as
    /// little-endian bytes when asked for, else `None`. A row the pool or the ladder cannot
    /// hold is refused (`ValueError`) before anything runs.
    fn execute<'py>(
        &self,
        py: Python<'py>,
        rows: Vec<PyRow>,
    ) -> PyResult<Vec<(u32, Option<Bound<'py, PyBytes>>)>> {
        let rows: Vec<StepRow> = rows
            .into_iter()
            .map(|(token_ids, start, block_ids, want_logits)| StepRow {
                token_ids,
                start,
                block_ids,
                want_logits,
            })
            .collect();
        let outputs = py
            .detach(|| {
                let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
                inner.execute(&rows)
            })
            .map_err(step_error)?;
        Ok(outputs
            .into_iter()
            .map(|out| {
                let logits = out.logits.map(|l| {
                    let bytes: Vec<u8> = l.iter().flat_map(|v| v.to_le_bytes()).collect();
                    PyBytes::new(py, &bytes)
                });
                (out.next_token, logits)
            })
            .collect())
    }
}

fn step_error(e: StepError) -> PyErr {
    match e {
        StepError::Executor(e) => TlalocError::new_err(e.to_string()),
        refused => PyValueError::new_err(refused.to_string()),
    }
}

/// Loads the artifact at `path` onto a PJRT device: `plugin` is `auto`, `cpu`, `cuda`, `rocm`,
/// `tpu` or a plugin file; `compile_cache` a directory for compiled executables (`None`: the
/// runtime's default, `$TLALOC_HOME/compile-cache`); `lazy` compiles each entry on first use.
/// Creates the device client; the GIL is released while it loads.
#[pyfunction]
#[pyo3(signature = (path, plugin = "auto", compile_cache = None, lazy = false, verify = false))]
fn load(
    py: Python<'_>,
    path: PathBuf,
    plugin: &str,
    compile_cache: Option<PathBuf>,
    lazy: bool,
    verify: bool,
) -> PyResult<Executor> {
    let mut options = LoadOptions {
        plugin: PluginRequest::parse(plugin),
        verify,
        compile: if lazy {
            CompileMode::Lazy
        } else {
            CompileMode::Eager
        },
        ..LoadOptions::default()
    };
    if compile_cache.is_some() {
        options.compile_cache = compile_cache;
    }
    let model = py
        .detach(|| Model::load(&path, &options))
        .map_err(|e| TlalocError::new_err(format!("loading {}: {e}", path.display())))?;
    let info = ArtifactInfo::of(model.artifact());
    Ok(Executor {
        inner: Mutex::new(StepExecutor::new(model)),
        info,
    })
}

/// The module `vllm_tlaloc._tlaloc`.
#[pymodule]
fn _tlaloc(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("TlalocError", m.py().get_type::<TlalocError>())?;
    m.add_class::<ArtifactInfo>()?;
    m.add_class::<Executor>()?;
    m.add_function(wrap_pyfunction!(open_artifact, m)?)?;
    m.add_function(wrap_pyfunction!(load, m)?)?;
    Ok(())
}
