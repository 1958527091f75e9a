//! The PJRT-backed executor: an artifact loaded onto one device.
//!
//! Loading opens the artifact (optionally re-hashing it), finds and loads the plugin, creates
//! the client (GPU plugins always get allocator options), compiles the entries (all at start,
//! or each on first use) through the persistent compile cache, uploads every weight once and
//! allocates the K/V pools once, as zeros. A step uploads the five small step inputs, passes
//! the weights by reference and the pools *donated*, and takes the pools back from the outputs:
//! they stay on the device for the life of the model. Only `nextTokens` is read back, plus the
//! logits when some row samples or asks for log-probabilities.
//!
//! Arguments are laid out from each program's signature by role, not by position, so the
//! order the exporter chose is the only order used.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use thiserror::Error;
use tlaloc_artifact::{Artifact, ArtifactError, Dtype, Entry, Role};
use tlaloc_pjrt::discovery::{self, PluginRequest};
use tlaloc_pjrt::{
    Buffer, Client, ClientOptions, CompileOptions, Device, ElementType, ExecuteArg, GpuOptions,
    LoadedExecutable, Plugin,
};

use crate::compile_cache::{CacheIdentity, CompileCache};
use crate::executor::{
    EntryKey, EntryKind, ExecutorError, LoadTimings, ModelExecutor, ModelShape, StepInputs,
    StepOutput, StepTimings,
};

/// When entries are compiled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CompileMode {
    /// All at load time (a slow start, no stall on first use).
    #[default]
    Eager,
    /// Each on the first step that needs it.
    Lazy,
}

/// How to load a model.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadOptions {
    /// Which plugin.
    pub plugin: PluginRequest,
    /// Re-hash every body, weight and tokenizer file before loading.
    pub verify: bool,
    /// Eager or lazy compilation.
    pub compile: CompileMode,
    /// Where serialized executables are kept between runs; `None` disables the cache.
    pub compile_cache: Option<PathBuf>,
    /// For GPU plugins: the fraction of device memory the allocator may use (plugin default
    /// when `None`); memory is never preallocated.
    pub gpu_memory_fraction: Option<f32>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            plugin: PluginRequest::Auto,
            verify: false,
            compile: CompileMode::Eager,
            compile_cache: Some(CompileCache::default_dir()),
            gpu_memory_fraction: None,
        }
    }
}

/// Loading failed; each case names what was refused.
#[derive(Debug, Error)]
pub enum LoadError {
    /// The artifact was refused.
    #[error(transparent)]
    Artifact(#[from] ArtifactError),
    /// No plugin matched.
    #[error(transparent)]
    PluginNotFound(#[from] discovery::NotFound),
    /// The plugin failed.
    #[error("{what}: {source}")]
    Pjrt {
        what: String,
        #[source]
        source: tlaloc_pjrt::Error,
    },
    /// Something in the artifact this runtime cannot run.
    #[error("{0}")]
    Unsupported(String),
}

fn pjrt(what: impl Into<String>) -> impl FnOnce(tlaloc_pjrt::Error) -> LoadError {
    let what = what.into();
    move |source| LoadError::Pjrt { what, source }
}

/// Where one operand of a program comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Step(usize),
    Weight(usize),
    Pool(usize),
}

/// How to call one entry: inputs by source, and where its outputs go.
#[derive(Debug, Clone)]
struct ArgPlan {
    inputs: Vec<Source>,
    logits: usize,
    next_tokens: usize,
    /// Output index of each pool (pool `i` = layer `i / 2`, K then V).
    pool_outputs: Vec<usize>,
}

#[derive(Debug)]
struct EntryState {
    entry: Entry,
    plan: ArgPlan,
    executable: Option<LoadedExecutable>,
}

/// The platform a model runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Platform {
    /// The plugin file.
    pub plugin_path: PathBuf,
    /// Plugin ABI and device identity (also the compile-cache identity).
    pub identity: CacheIdentity,
}

/// An artifact loaded onto a PJRT device.
#[derive(Debug)]
pub struct Model {
    artifact: Artifact,
    client: Client,
    device: Device,
    entries: HashMap<EntryKey, EntryState>,
    weights: Vec<Buffer>,
    pools: Vec<Option<Buffer>>,
    pool_type: ElementType,
    pool_dims: Vec<i64>,
    shape: ModelShape,
    load_timings: LoadTimings,
    cache: Option<CompileCache>,
    platform: Platform,
    compile_options: CompileOptions,
}

fn element_type(dtype: Dtype) -> ElementType {
    match dtype {
        Dtype::F32 => ElementType::F32,
        Dtype::Bf16 => ElementType::BF16,
        Dtype::F16 => ElementType::F16,
        Dtype::I32 => ElementType::S32,
        Dtype::I8 => ElementType::S8,
        Dtype::U8 => ElementType::U8,
    }
}

fn entry_key(entry: &Entry) -> EntryKey {
    EntryKey {
        kind: match entry.kind {
            tlaloc_artifact::EntryKind::Decode => EntryKind::Decode,
            tlaloc_artifact::EntryKind::Prefill => EntryKind::Prefill,
        },
        batch: entry.batch,
        tokens: entry.tokens,
        context: entry.context,
    }
}

fn dims_i64(dims: &[usize]) -> Vec<i64> {
    dims.iter().map(|&d| d as i64).collect()
}

impl Model {
    /// Loads the artifact in `dir` with `options`.
    pub fn load(dir: impl AsRef<Path>, options: &LoadOptions) -> Result<Model, LoadError> {
        let started = Instant::now();
        let mut timings = LoadTimings::default();

        let artifact = Artifact::open(dir.as_ref())?;
        if options.verify {
            artifact.verify()?;
        }
        timings.open = started.elapsed();

        let phase = Instant::now();
        let found = discovery::find(&options.plugin)?;
        let plugin = Plugin::load(&found.path)
            .map_err(pjrt(format!("loading plugin {}", found.path.display())))?;
        let client_options = if found.kind.is_gpu() {
            ClientOptions::gpu(GpuOptions {
                preallocate: false,
                memory_fraction: options.gpu_memory_fraction,
                allocator: None,
            })
        } else {
            ClientOptions::for_platform_hint(&found.path.to_string_lossy())
        };
        let client = Client::new(&plugin, client_options).map_err(pjrt(format!(
            "creating a client of {}",
            found.path.display()
        )))?;
        let device = client.first_device().map_err(pjrt("finding a device"))?;
        let identity = CacheIdentity {
            api_version: plugin.api_version(),
            platform_name: client.platform_name().map_err(pjrt("platform name"))?,
            platform_version: client
                .platform_version()
                .map_err(pjrt("platform version"))?,
            device_kind: device.kind().to_owned(),
        };
        timings.client = phase.elapsed();

        let manifest = artifact.manifest();
        let weight_index: HashMap<&str, usize> = manifest
            .weights
            .iter()
            .enumerate()
            .map(|(i, w)| (w.slot.as_str(), i))
            .collect();
        let mut entries = HashMap::new();
        for entry in &manifest.entries {
            let signature = artifact.program(&entry.name)?;
            let plan = arg_plan(
                entry,
                signature,
                &weight_index,
                manifest.kv_cache.num_layers,
            )?;
            entries.insert(
                entry_key(entry),
                EntryState {
                    entry: entry.clone(),
                    plan,
                    executable: None,
                },
            );
        }

        let kv = &manifest.kv_cache;
        let shape = ModelShape {
            vocab_size: manifest.model.vocab_size,
            block_size: kv.block_size,
            num_blocks: kv.num_blocks,
            entries: manifest.entries.iter().map(entry_key).collect(),
            eos_token_ids: manifest.model.eos_token_ids.clone(),
            weight_bytes: manifest.weights.iter().map(|w| w.byte_length).sum(),
            kv_bytes_per_token: (2
                * kv.num_layers
                * kv.num_kv_heads
                * kv.head_dim
                * kv.dtype.byte_size()) as u64,
        };

        let mut model = Model {
            pool_type: element_type(kv.dtype),
            pool_dims: dims_i64(&kv.pool_dims()),
            pools: (0..2 * kv.num_layers).map(|_| None).collect(),
            weights: Vec::new(),
            cache: options.compile_cache.as_ref().map(CompileCache::new),
            platform: Platform {
                plugin_path: found.path.clone(),
                identity,
            },
            compile_options: CompileOptions::default(),
            artifact,
            client,
            device,
            entries,
            shape,
            load_timings: LoadTimings::default(),
        };

        let phase = Instant::now();
        let keys: Vec<EntryKey> = model.entries.keys().copied().collect();
        match options.compile {
            CompileMode::Eager => {
                let mut by_body: HashMap<String, LoadedExecutable> = HashMap::new();
                for key in keys {
                    let body = model.entries[&key].entry.body.clone();
                    let executable = match by_body.get(&body) {
                        Some(e) => e.clone(),
                        None => {
                            let (e, hit) = model.compile_entry(&key)?;
                            if hit {
                                timings.cache_hits += 1;
                            } else {
                                timings.compiled += 1;
                            }
                            by_body.insert(body, e.clone());
                            e
                        }
                    };
                    model
                        .entries
                        .get_mut(&key)
                        .expect("key from the map")
                        .executable = Some(executable);
                }
            }
            CompileMode::Lazy => timings.deferred = keys.len(),
        }
        timings.compile = phase.elapsed();

        let phase = Instant::now();
        model.upload_weights()?;
        timings.upload_weights = phase.elapsed();

        let phase = Instant::now();
        model
            .allocate_pools()
            .map_err(pjrt("allocating the K/V pools"))?;
        timings.allocate_pools = phase.elapsed();

        timings.total = started.elapsed();
        tracing::info!(
            plugin = %model.platform.plugin_path.display(),
            device = %model.platform.identity.device_kind,
            entries = model.entries.len(),
            compiled = timings.compiled,
            cache_hits = timings.cache_hits,
            total_ms = timings.total.as_millis() as u64,
            "model loaded"
        );
        model.load_timings = timings;
        Ok(model)
    }

    /// The artifact this model runs.
    pub fn artifact(&self) -> &Artifact {
        &self.artifact
    }

    /// The plugin and device.
    pub fn platform(&self) -> &Platform {
        &self.platform
    }

    /// Compiles (or loads from the cache) one entry; returns whether the cache served it.
    fn compile_entry(&self, key: &EntryKey) -> Result<(LoadedExecutable, bool), LoadError> {
        let entry = &self.entries[key].entry;
        let options_bytes = self.compile_options.to_proto_bytes();
        let cache_key = tlaloc_artifact::paths::body_hash(&entry.body)
            .ok()
            .map(|hash| CompileCache::key(&self.platform.identity, hash, &options_bytes));
        if let (Some(cache), Some(k)) = (&self.cache, &cache_key)
            && let Some(bytes) = cache.get(k)
        {
            match self
                .client
                .deserialize_executable(&bytes, &self.compile_options)
            {
                Ok(executable) => return Ok((executable, true)),
                Err(e) => {
                    tracing::warn!(entry = %entry.name, error = %e, "compile cache entry unusable; recompiling");
                }
            }
        }
        let text = self.artifact.body_text(entry)?;
        let started = Instant::now();
        let executable = self
            .client
            .compile(&text, &self.compile_options)
            .map_err(pjrt(format!("compiling entry {}", entry.name)))?;
        tracing::debug!(entry = %entry.name, ms = started.elapsed().as_millis() as u64, "compiled");
        if let (Some(cache), Some(k)) = (&self.cache, &cache_key) {
            match executable.serialize() {
                Ok(bytes) => cache.put(k, &bytes),
                Err(e) => {
                    tracing::warn!(entry = %entry.name, error = %e, "cannot serialize executable")
                }
            }
        }
        Ok((executable, false))
    }

    fn upload_weights(&mut self) -> Result<(), LoadError> {
        let manifest = self.artifact.manifest();
        let mut weights = Vec::with_capacity(manifest.weights.len());
        for w in &manifest.weights {
            let bytes = self.artifact.weight_bytes(&w.slot)?;
            let buffer = self
                .client
                .buffer_from_host_bytes(
                    &bytes,
                    element_type(w.dtype),
                    &dims_i64(&w.dims),
                    &self.device,
                )
                .map_err(pjrt(format!("uploading weight {}", w.slot)))?;
            weights.push(buffer);
        }
        self.weights = weights;
        Ok(())
    }

    fn allocate_pools(&mut self) -> Result<(), tlaloc_pjrt::Error> {
        let bytes: usize =
            self.pool_dims.iter().product::<i64>() as usize * self.pool_type.byte_size();
        let zeros = vec![0u8; bytes];
        for pool in self.pools.iter_mut() {
            if pool.is_none() {
                *pool = Some(self.client.buffer_from_host_bytes(
                    &zeros,
                    self.pool_type,
                    &self.pool_dims,
                    &self.device,
                )?);
            }
        }
        Ok(())
    }

    /// Reads one pool back to the host (pool `2 * layer` is K, `2 * layer + 1` is V); for tests
    /// of the pool invariants, never used when serving.
    pub fn read_pool(&self, index: usize) -> Option<Vec<u8>> {
        let pool = self.pools.get(index)?.as_ref()?;
        let mut out =
            vec![0u8; self.pool_dims.iter().product::<i64>() as usize * self.pool_type.byte_size()];
        pool.copy_to_host_bytes(&mut out).ok()?;
        Some(out)
    }

    fn device_error(entry: &EntryKey, what: &str, e: tlaloc_pjrt::Error) -> ExecutorError {
        ExecutorError::Device {
            entry: *entry,
            message: format!("{what}: {e}"),
        }
    }
}

fn arg_plan(
    entry: &Entry,
    signature: &tlaloc_artifact::ProgramSignature,
    weight_index: &HashMap<&str, usize>,
    num_layers: usize,
) -> Result<ArgPlan, LoadError> {
    let unsupported =
        |what: String| LoadError::Unsupported(format!("entry {}: {what}", entry.name));
    let mut inputs = Vec::with_capacity(signature.inputs.len());
    for spec in &signature.inputs {
        inputs.push(match &spec.role {
            Role::TokenIds => Source::Step(0),
            Role::Positions => Source::Step(1),
            Role::BlockTables => Source::Step(2),
            Role::SeqLens => Source::Step(3),
            Role::SlotMapping => Source::Step(4),
            Role::Weight { slot } => {
                Source::Weight(*weight_index.get(slot.as_str()).ok_or_else(|| {
                    unsupported(format!("weight slot {slot} is not in the manifest"))
                })?)
            }
            Role::KPool { layer } if *layer < num_layers => Source::Pool(2 * layer),
            Role::VPool { layer } if *layer < num_layers => Source::Pool(2 * layer + 1),
            other => {
                return Err(unsupported(format!(
                    "input {} has role {other:?}",
                    spec.name
                )));
            }
        });
    }
    let mut logits = None;
    let mut next_tokens = None;
    let mut pool_outputs = vec![usize::MAX; 2 * num_layers];
    for (i, spec) in signature.outputs.iter().enumerate() {
        match &spec.role {
            Role::Logits => logits = Some(i),
            Role::NextTokens => next_tokens = Some(i),
            Role::KPool { layer } if *layer < num_layers => pool_outputs[2 * layer] = i,
            Role::VPool { layer } if *layer < num_layers => pool_outputs[2 * layer + 1] = i,
            other => {
                return Err(unsupported(format!(
                    "output {} has role {other:?}",
                    spec.name
                )));
            }
        }
    }
    if pool_outputs.contains(&usize::MAX) {
        return Err(unsupported("a K/V pool is not returned".into()));
    }
    // A pool must be donated to the output that replaces it, or it would be copied every step.
    for (pool, &output) in pool_outputs.iter().enumerate() {
        let input = inputs
            .iter()
            .position(|s| *s == Source::Pool(pool))
            .ok_or_else(|| unsupported(format!("K/V pool {pool} is not an input")))?;
        if !signature
            .donations
            .iter()
            .any(|d| d.input == input && d.output == output)
        {
            return Err(unsupported(format!(
                "K/V pool input {input} is not donated to output {output}"
            )));
        }
    }
    Ok(ArgPlan {
        inputs,
        logits: logits.ok_or_else(|| unsupported("no logits output".into()))?,
        next_tokens: next_tokens.ok_or_else(|| unsupported("no nextTokens output".into()))?,
        pool_outputs,
    })
}

impl ModelExecutor for Model {
    fn shape(&self) -> &ModelShape {
        &self.shape
    }

    fn load_timings(&self) -> Option<LoadTimings> {
        Some(self.load_timings.clone())
    }

    fn platform(&self) -> Option<Platform> {
        Some(self.platform.clone())
    }

    fn step(&mut self, key: &EntryKey, inputs: &StepInputs) -> Result<StepOutput, ExecutorError> {
        if !self.entries.contains_key(key) {
            return Err(ExecutorError::UnknownEntry(*key));
        }
        if self.entries[key].executable.is_none() {
            let started = Instant::now();
            let (executable, _) = self.compile_entry(key).map_err(|e| ExecutorError::Device {
                entry: *key,
                message: e.to_string(),
            })?;
            tracing::info!(entry = %key, ms = started.elapsed().as_millis() as u64, "compiled on first use");
            self.entries.get_mut(key).expect("checked").executable = Some(executable);
        }
        let (b, t) = (key.batch, key.tokens);
        let cols = key.context / self.shape.block_size;
        let shapes: [(&[i32], Vec<i64>); 5] = [
            (&inputs.token_ids, vec![b as i64, t as i64]),
            (&inputs.positions, vec![b as i64, t as i64]),
            (&inputs.block_tables, vec![b as i64, cols as i64]),
            (&inputs.seq_lens, vec![b as i64]),
            (&inputs.slot_mapping, vec![(b * t) as i64]),
        ];
        let mut timings = StepTimings::default();
        let started = Instant::now();
        if self.pools.iter().any(Option::is_none) {
            // A failed step consumed the donated pools; start over from zeros.
            self.allocate_pools()
                .map_err(|e| Self::device_error(key, "reallocating the K/V pools", e))?;
        }
        let mut step_buffers = Vec::with_capacity(5);
        for (data, dims) in &shapes {
            let expected: i64 = dims.iter().product();
            if data.len() as i64 != expected {
                return Err(ExecutorError::BadInputs {
                    entry: *key,
                    what: format!("an input of {} values for dims {dims:?}", data.len()),
                });
            }
            step_buffers.push(
                self.client
                    .buffer_from_host(data, dims, &self.device)
                    .map_err(|e| Self::device_error(key, "uploading step inputs", e))?,
            );
        }
        timings.upload = started.elapsed();

        let state = &self.entries[key];
        let plan = &state.plan;
        let executable = state.executable.as_ref().expect("compiled above");
        let mut donated: Vec<Option<Buffer>> = self.pools.iter_mut().map(Option::take).collect();
        let args: Vec<ExecuteArg<'_>> = plan
            .inputs
            .iter()
            .map(|source| match *source {
                Source::Step(i) => ExecuteArg::Borrowed(&step_buffers[i]),
                Source::Weight(i) => ExecuteArg::Borrowed(&self.weights[i]),
                Source::Pool(i) => {
                    ExecuteArg::Donated(donated[i].take().expect("every pool present"))
                }
            })
            .collect();
        let started = Instant::now();
        let outputs = executable
            .execute(args)
            .map_err(|e| Self::device_error(key, "execute", e))?;
        timings.execute = started.elapsed();
        let mut outputs: Vec<Option<Buffer>> = outputs.into_iter().map(Some).collect();
        for (pool, &output) in plan.pool_outputs.iter().enumerate() {
            self.pools[pool] = outputs.get_mut(output).and_then(Option::take);
        }

        let started = Instant::now();
        let read = |index: usize| {
            outputs
                .get(index)
                .and_then(Option::as_ref)
                .ok_or_else(|| ExecutorError::Device {
                    entry: *key,
                    message: format!("the program returned no output {index}"),
                })
        };
        let next_tokens = read(plan.next_tokens)?
            .to_host_vec::<i32>()
            .map_err(|e| Self::device_error(key, "reading nextTokens", e))?;
        let logits = if inputs.want_logits {
            Some(
                read(plan.logits)?
                    .to_host_vec::<f32>()
                    .map_err(|e| Self::device_error(key, "reading logits", e))?,
            )
        } else {
            None
        };
        timings.readback = started.elapsed();
        drop(outputs);
        drop(step_buffers);
        Ok(StepOutput {
            next_tokens,
            logits,
            timings,
        })
    }
}
