//! The PJRT-backed executor: an artifact loaded onto one device, or onto N devices of one
//! client for a tensor-parallel artifact of degree N (see [`crate::tensor_parallel`]: each
//! device holds its weight shards and pool slices, every step's inputs go to every device, the
//! program runs on all of them at once and the replicated tokens and logits are read from the
//! first).
//!
//! Loading opens the artifact (optionally re-hashing it), finds and loads the plugin, creates
//! the client (GPU plugins always get allocator options), compiles the entries (all at start,
//! or each on first use) through the persistent compile cache, uploads every weight once and
//! allocates the K/V pools once, as zeros. A step uploads the five small step inputs, passes
//! the weights by reference and the pools *donated*, and takes the pools back from the outputs:
//! they stay on the device for the life of the model. Only `nextTokens` is read back, plus the
//! logits when some row samples or asks for log-probabilities.
//!
//! Executables shipped in the artifact (`tlaloc compile`, [`compile_into_artifact`]) are used
//! when the set's [`CompilerIdentity`] equals this plugin's and device's; each file is hashed
//! before the plugin sees it, and a mismatch fails the load. Entries without a usable one are
//! compiled (through the compile cache), and one line says how many came from where and why.
//!
//! Which body of an entry runs (the portable one or a variant) is decided by [`crate::bodies`]
//! right after the client is created, before anything compiles; from there on the entry's
//! `body` is the chosen one, so the compile cache and shipped executables key on what runs. A
//! variant the plugin refuses to compile falls back to the portable body with a warning.
//!
//! Arguments are laid out from each program's signature by role, not by position, so the
//! order the exporter chose is the only order used.
//!
//! The three slow parts of a load run at once, each on threads of its own: entries compile (or
//! deserialize from the cache) on up to one thread per core, weights are read and uploaded on up
//! to eight, and the pools are made from one zero buffer uploaded per load and copied on the
//! device (`PJRT_Buffer_CopyToDevice`; host uploads of one shared zero buffer where a plugin
//! refuses the copy). The PJRT client and buffer creation are thread-safe. Each phase's time in
//! [`LoadTimings`] is its own wall time, so with the overlap the phases add up to more than the
//! total.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use thiserror::Error;
use tlaloc_artifact::{
    AddedExecutables, Artifact, ArtifactError, CompilerIdentity, Dtype, Entry, ExecutableEntry,
    OperandRole, PoolOperand, StepInput, StepOutput as ProgramOutput,
};
use tlaloc_pjrt::discovery::{self, PluginRequest};
use tlaloc_pjrt::{
    Buffer, Client, ClientOptions, CompileOptions, Device, ElementType, ExecuteArg, GpuOptions,
    LoadedExecutable, PinnedHostMemory, Plugin, XlaOptionValue,
};

use crate::bodies::{self, BodyChoice, KernelChoice};
use crate::compile_cache::{CacheIdentity, CompileCache};
use crate::executor::{
    ExecutorError, LadderPoint, LoadTimings, ModelExecutor, ModelShape, StepInputs, StepOutput,
    StepTimings,
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
    /// Use the executables shipped in the artifact whose identity matches this plugin and
    /// device (false compiles every entry, as for an artifact that ships none).
    pub artifact_executables: bool,
    /// For GPU plugins: the allocator's create options. The default reserves nothing up front
    /// (a process takes only what it uses) and leaves the fraction and allocator kind to the
    /// plugin; `preallocate` reserves `memory_fraction` of the device in one allocation at
    /// client creation, so the weights and pools that follow do not grow the allocator piece
    /// by piece.
    pub gpu: GpuOptions,
    /// The most decode steps the engine may chain on the device without reading tokens back
    /// in between (see [`ModelExecutor::decode_chain`]); 1 reads every step's tokens.
    pub max_decode_chain: usize,
    /// How long a decode chain may take by the measured step time (see
    /// [`ModelExecutor::decode_chain_window`]).
    pub decode_chain_window: Duration,
    /// Whether entries may run a body variant the plugin supports (see [`crate::bodies`]).
    pub kernels: KernelChoice,
    /// XLA compiler options for every entry this load compiles (`xla.DebugOptions` fields, e.g.
    /// `xla_gpu_enable_command_buffer`), given to each compile rather than to the process as
    /// `XLA_FLAGS` is. They are part of the compile options' bytes, so of the compile-cache key
    /// and of the identity shipped executables are matched by.
    pub xla_options: BTreeMap<String, XlaOptionValue>,
}

/// [`LoadOptions::max_decode_chain`] by default.
pub const DEFAULT_MAX_DECODE_CHAIN: usize = 8;

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            plugin: PluginRequest::Auto,
            verify: false,
            compile: CompileMode::Eager,
            compile_cache: Some(CompileCache::default_dir()),
            artifact_executables: true,
            gpu: GpuOptions::default(),
            max_decode_chain: DEFAULT_MAX_DECODE_CHAIN,
            decode_chain_window: crate::executor::DECODE_CHAIN_WINDOW,
            kernels: KernelChoice::Auto,
            xla_options: BTreeMap::new(),
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
    /// A file outside the artifact could not be read.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

fn pjrt(what: impl Into<String>) -> impl FnOnce(tlaloc_pjrt::Error) -> LoadError {
    let what = what.into();
    move |source| LoadError::Pjrt { what, source }
}

/// Where one operand of a program comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Step(StepInput),
    Weight(usize),
    /// The donated K/V operand at this index of [`PoolOperand::all`].
    Pool(usize),
}

/// How to call one entry: inputs by source, and where its outputs go.
#[derive(Debug, Clone)]
struct ArgPlan {
    inputs: Vec<Source>,
    /// Output index of each step output, in [`ProgramOutput::ALL`] order: the tokens and logits
    /// read back, and what a chained decode step takes from the step before it
    /// ([`StepInput::carried_by`]).
    step_outputs: [usize; ProgramOutput::ALL.len()],
    /// Output index of each pool, in [`PoolOperand::all`] order.
    pool_outputs: Vec<usize>,
    /// Whether the program donates each step input ([`StepInput::index`]) to an output
    /// ([`StepInput::donated_to`]): such an input is moved into the call.
    donated_steps: [bool; StepInput::ALL.len()],
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
    /// The devices the programs run on: one, or the tensor-parallel degree's.
    devices: Vec<Device>,
    entries: HashMap<LadderPoint, EntryState>,
    /// `[device][weight]`: each device's piece of every weight, manifest order.
    weights: Vec<Vec<Buffer>>,
    /// `[device][pool]`: each device's (slice of each) pool, [`PoolOperand::all`] order.
    pools: Vec<Vec<Option<Buffer>>>,
    /// Element type and dims of each device's pool buffer, in [`PoolOperand::all`] order.
    pool_specs: Vec<PoolSpec>,
    shape: ModelShape,
    load_timings: LoadTimings,
    cache: Option<CompileCache>,
    /// Shipped executables usable here, by entry name and body.
    shipped: HashMap<(String, String), ExecutableEntry>,
    platform: Platform,
    compile_options: CompileOptions,
    max_decode_chain: usize,
    decode_chain_window: Duration,
}

fn element_type(dtype: Dtype) -> ElementType {
    match dtype {
        Dtype::F32 => ElementType::F32,
        Dtype::Bf16 => ElementType::BF16,
        Dtype::F16 => ElementType::F16,
        Dtype::I32 => ElementType::S32,
        Dtype::I8 => ElementType::S8,
        Dtype::U8 => ElementType::U8,
        Dtype::F8E4M3FN => ElementType::F8E4M3FN,
    }
}

/// Refuses an artifact whose K/V pool dtype the opened plugin cannot run (see
/// [`crate::kv_dtype`]), naming the plugin, the dtype and what would be accepted.
fn check_kv_dtype(
    opened: &OpenedClient,
    dtype: Dtype,
    options: &CompileOptions,
) -> Result<(), LoadError> {
    crate::kv_dtype::probe(&opened.client, &opened.devices[0], dtype, options).map_err(|refusal| {
        LoadError::Unsupported(format!(
            "plugin {} ({}) cannot run {dtype} K/V pools: {}; export the artifact with \
             --kv-dtype int8, bf16 or f32, or serve it on a plugin that runs f8E4M3FN \
             (the CUDA plugin on a GPU with fp8)",
            opened.platform.plugin_path.display(),
            opened.platform.identity.device_kind,
            refusal.0
        ))
    })
}

/// The element type and dims of one pool buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PoolSpec {
    element_type: ElementType,
    dims: Vec<i64>,
}

impl PoolSpec {
    /// One device's buffer of `operand` when the pools are split over `degree` devices.
    fn of(operand: &PoolOperand, degree: usize) -> PoolSpec {
        PoolSpec {
            element_type: element_type(operand.dtype),
            dims: crate::tensor_parallel::pool_slice_dims(&dims_i64(&operand.dims), degree),
        }
    }

    fn byte_len(&self) -> usize {
        self.dims.iter().product::<i64>() as usize * self.element_type.byte_size()
    }
}

/// A client of the plugin `options` ask for, the devices programs run on (its first, or the
/// first `degree`), and what identifies them.
struct OpenedClient {
    client: Client,
    devices: Vec<Device>,
    platform: Platform,
}

/// Finds and loads the plugin and creates its client (GPU clients with `options.gpu`) with
/// `degree` devices to run on.
fn open_client(options: &LoadOptions, degree: usize) -> Result<OpenedClient, LoadError> {
    let found = discovery::find(&options.plugin)?;
    let plugin = Plugin::load(&found.path)
        .map_err(pjrt(format!("loading plugin {}", found.path.display())))?;
    let client_options = if found.kind.is_gpu() {
        ClientOptions::gpu(options.gpu)
    } else {
        ClientOptions::for_platform_hint(&found.path.to_string_lossy())
    };
    let client_options = crate::tensor_parallel::client_options(client_options, degree);
    let client = Client::new(&plugin, client_options).map_err(pjrt(format!(
        "creating a client of {}",
        found.path.display()
    )))?;
    let devices = if degree == 1 {
        vec![client.first_device().map_err(pjrt("finding a device"))?]
    } else {
        crate::tensor_parallel::devices_for(&client, degree, &found.path.to_string_lossy())?
    };
    let device = &devices[0];
    let identity = CacheIdentity {
        api_version: plugin.api_version(),
        platform_name: client.platform_name().map_err(pjrt("platform name"))?,
        platform_version: client
            .platform_version()
            .map_err(pjrt("platform version"))?,
        plugin_file: CacheIdentity::plugin_file_of(plugin.path()),
        device_kind: device.kind().to_owned(),
        compiler_flags: CacheIdentity::compiler_flags_from_env(),
    };
    Ok(OpenedClient {
        client,
        devices,
        platform: Platform {
            plugin_path: found.path.clone(),
            identity,
        },
    })
}

/// Each entry's argument plan, keyed by its ladder point (nothing compiled yet).
fn plan_entries(
    artifact: &Artifact,
    choice: &BodyChoice,
) -> Result<HashMap<LadderPoint, EntryState>, LoadError> {
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
            &PoolOperand::all(&manifest.kv_cache),
        )?;
        entries.insert(
            entry.point(),
            EntryState {
                entry: entry.with_body(&choice.bodies[&entry.name]),
                plan,
                executable: None,
            },
        );
    }
    Ok(entries)
}

/// What the scheduler and the benchmark need to know of the artifact.
fn shape_of(artifact: &Artifact) -> ModelShape {
    let manifest = artifact.manifest();
    let kv = &manifest.kv_cache;
    ModelShape {
        vocab_size: manifest.model.vocab_size,
        block_size: kv.block_size,
        num_blocks: kv.num_blocks,
        ladder: manifest.ladder.clone(),
        eos_token_ids: manifest.model.eos_token_ids.clone(),
        weight_bytes: manifest.weights.iter().map(|w| w.byte_length).sum(),
        kv_bytes_per_token: kv.bytes_per_token(),
    }
}

fn dims_i64(dims: &[usize]) -> Vec<i64> {
    dims.iter().map(|&d| d as i64).collect()
}

impl Model {
    /// Loads the artifact in `dir` with `options`, in phases: open (and verify) the artifact,
    /// open the plugin and its client, plan each entry's arguments, then compile, upload the
    /// weights and allocate the pools at the same time.
    pub fn load(dir: impl AsRef<Path>, options: &LoadOptions) -> Result<Model, LoadError> {
        let started = Instant::now();
        let mut timings = LoadTimings::default();

        let artifact = Artifact::open(dir.as_ref())?;
        if options.verify {
            artifact.verify()?;
        }
        timings.open = started.elapsed();
        let degree = artifact.manifest().tensor_parallel_degree();

        let phase = Instant::now();
        let opened = open_client(options, degree)?;
        timings.client = phase.elapsed();

        // Kernels are registered before anything compiles or deserializes. Variants are off
        // for a tensor-parallel artifact.
        let kernels = match crate::tensor_parallel::features_off_line(degree) {
            None => options.kernels,
            Some(line) => {
                tracing::info!("{line}");
                KernelChoice::Portable
            }
        };
        let choice = bodies::choose(&artifact, &opened.client, kernels);
        timings.bodies = choice.line.clone();
        let mut entries = plan_entries(&artifact, &choice)?;
        let shape = shape_of(&artifact);
        let cache = options.compile_cache.as_ref().map(CompileCache::new);
        let mut compile_options = crate::tensor_parallel::compile_options(&opened.devices)?;
        compile_options.xla_options = options.xla_options.clone();
        let kv = &artifact.manifest().kv_cache;
        let pool_specs: Vec<PoolSpec> = PoolOperand::all(kv)
            .iter()
            .map(|operand| PoolSpec::of(operand, degree))
            .collect();
        // The probe runs a one-device program on the first device.
        check_kv_dtype(&opened, kv.dtype, &CompileOptions::default())?;

        // Compilation, weight upload and pool allocation share nothing but the client, so they
        // overlap; each reports its own wall time. Choosing the shipped executables hashes the
        // plugin file, so it runs on the compile thread too.
        let compiler = Compiler {
            client: &opened.client,
            artifact: &artifact,
            cache: cache.as_ref(),
            identity: &opened.platform.identity,
            options: &compile_options,
            shipped: None,
        };
        let order: Vec<LadderPoint> = artifact
            .manifest()
            .entries
            .iter()
            .map(Entry::point)
            .collect();
        let (client, devices) = (&opened.client, &opened.devices);
        let (compiled, uploaded, allocated) = std::thread::scope(|scope| {
            let compile = scope.spawn(|| {
                timed(|| {
                    let selection = select_executables(
                        &artifact,
                        &opened.platform,
                        &compile_options,
                        cache.as_ref(),
                        options.artifact_executables,
                    );
                    let compiler = Compiler {
                        shipped: Some(&selection.usable),
                        ..compiler
                    };
                    let compiled = match options.compile {
                        CompileMode::Eager => Some(compiler.compile_all(&order, &entries)?),
                        CompileMode::Lazy => None,
                    };
                    Ok::<_, LoadError>((compiled, selection))
                })
            });
            let allocate = scope.spawn(|| {
                timed(|| {
                    devices
                        .iter()
                        .map(|device| zero_pools_of(client, device, &pool_specs))
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(pjrt("allocating the K/V pools"))
                })
            });
            let uploaded = timed(|| upload_weights(client, devices, &artifact));
            (join(compile), uploaded, join(allocate))
        });
        let (compiled, compile_time) = compiled;
        let (weights, upload_time) = uploaded;
        let (pools, pool_time) = allocated;
        // Failures are reported in the order the phases used to run one after another.
        let (compiled, selection) = compiled?;
        let (weights, upload_stats) = weights?;
        timings.upload_read = upload_stats.read;
        timings.upload_transfer = upload_stats.transfer;
        timings.upload_pinned_bytes = upload_stats.pinned_bytes;
        let pools: Vec<Vec<Option<Buffer>>> = pools?
            .into_iter()
            .map(|device_pools| device_pools.into_iter().map(Some).collect())
            .collect();
        timings.compile = compile_time;
        timings.upload_weights = upload_time;
        timings.allocate_pools = pool_time;
        match compiled {
            Some(compiled) => {
                timings.cache_hits = compiled.cache_hits;
                timings.compiled = compiled.compiled;
                timings.from_artifact = compiled.from_artifact;
                timings.executables = selection.report(&compiled);
                for (key, executable) in compiled.executables {
                    entries.get_mut(&key).expect("key from the map").executable = Some(executable);
                }
            }
            None => {
                timings.deferred = entries.len();
                timings.executables = selection.report_deferred(entries.len());
            }
        }

        let OpenedClient {
            client,
            devices,
            platform,
        } = opened;
        // Decode chains feed one device's token buffer to the next step: off at degree > 1.
        let max_decode_chain = if devices.len() > 1 {
            1
        } else {
            options.max_decode_chain.max(1)
        };
        let mut model = Model {
            pool_specs,
            pools,
            weights,
            cache,
            shipped: selection.usable,
            platform,
            compile_options,
            artifact,
            client,
            devices,
            entries,
            shape,
            load_timings: LoadTimings::default(),
            max_decode_chain,
            decode_chain_window: options.decode_chain_window,
        };

        timings.total = started.elapsed();
        tracing::info!(
            plugin = %model.platform.plugin_path.display(),
            device = %model.platform.identity.device_kind,
            devices = model.devices.len(),
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

    fn compiler(&self) -> Compiler<'_> {
        Compiler {
            client: &self.client,
            artifact: &self.artifact,
            cache: self.cache.as_ref(),
            identity: &self.platform.identity,
            options: &self.compile_options,
            shipped: Some(&self.shipped),
        }
    }

    /// Replaces every pool a failed step consumed with a zero-filled one.
    fn refill_pools(&mut self) -> Result<(), tlaloc_pjrt::Error> {
        for (device, pools) in self.devices.iter().zip(&mut self.pools) {
            let missing: Vec<PoolSpec> = pools
                .iter()
                .zip(&self.pool_specs)
                .filter(|(p, _)| p.is_none())
                .map(|(_, spec)| spec.clone())
                .collect();
            let mut fresh = zero_pools_of(&self.client, device, &missing)?.into_iter();
            for pool in pools.iter_mut().filter(|p| p.is_none()) {
                *pool = fresh.next();
            }
        }
        Ok(())
    }

    /// Reads one pool back to the host (index in [`PoolOperand::all`] order: `K0, V0, K1, ...`,
    /// each layer's scales after its pools when quantized; the first device's KV-head slice of
    /// a tensor-parallel artifact); for tests of the pool invariants, never used when serving.
    pub fn read_pool(&self, index: usize) -> Option<Vec<u8>> {
        let pool = self.pools.first()?.get(index)?.as_ref()?;
        let mut out = vec![0u8; self.pool_specs.get(index)?.byte_len()];
        pool.copy_to_host_bytes(&mut out).ok()?;
        Some(out)
    }

    /// Bytes of every pool buffer together, as allocated, over all devices.
    pub fn pool_bytes(&self) -> u64 {
        self.pool_specs
            .iter()
            .map(|s| s.byte_len() as u64)
            .sum::<u64>()
            * self.devices.len() as u64
    }

    fn device_error(entry: &LadderPoint, what: &str, e: tlaloc_pjrt::Error) -> ExecutorError {
        ExecutorError::Device {
            entry: *entry,
            message: format!("{what}: {e}"),
        }
    }
}

/// What [`compile_into_artifact`] did.
#[derive(Debug)]
pub struct CompiledArtifact {
    /// What compiled the executables (the identity they are listed under).
    pub identity: CompilerIdentity,
    /// Entries given an executable.
    pub entries: usize,
    /// Of the executables, those of a body variant (beside the entries' portable bodies).
    pub variants: usize,
    /// Distinct executable files written, and their bytes.
    pub files: usize,
    pub bytes: u64,
    /// Executables compiled now, and taken from the compile cache.
    pub compiled: usize,
    pub cache_hits: usize,
    /// Whether executables of the same identity were replaced.
    pub replaced: bool,
    /// Whether a signature of the old manifest was removed (sign the artifact again).
    pub removed_signature: bool,
    /// Wall time of compiling and serializing.
    pub compile_time: Duration,
}

/// Compiles every entry of the artifact in `dir` with the plugin `options` ask for (through the
/// compile cache when it is on), serializes the executables and adds them to the artifact under
/// the plugin's and device's [`CompilerIdentity`], replacing an earlier set of that identity.
/// Each entry gets its portable body's executable and that of the variant this plugin would
/// run under `options.kernels`. Needs no CPU: any plugin that can compile and serialize, GPU ones included.
pub fn compile_into_artifact(
    dir: impl AsRef<Path>,
    options: &LoadOptions,
) -> Result<CompiledArtifact, LoadError> {
    let artifact = Artifact::open(dir.as_ref())?;
    crate::tensor_parallel::refuse_compiling_split_artifact(artifact.manifest())?;
    if options.verify {
        artifact.verify()?;
    }
    let opened = open_client(options, 1)?;
    let cache = options.compile_cache.as_ref().map(CompileCache::new);
    let compile_options = CompileOptions {
        xla_options: options.xla_options.clone(),
        ..CompileOptions::default()
    };
    let compiler = Compiler {
        client: &opened.client,
        artifact: &artifact,
        cache: cache.as_ref(),
        identity: &opened.platform.identity,
        options: &compile_options,
        shipped: None,
    };
    // Each entry's portable body, and the variant this plugin would run: `--kernels portable`
    // at serving time still finds an executable.
    let choice = bodies::choose(&artifact, &opened.client, options.kernels);
    let started = Instant::now();
    let mut wanted: Vec<Entry> = Vec::new();
    for entry in &artifact.manifest().entries {
        wanted.push(entry.clone());
        if choice.bodies[&entry.name] != entry.body {
            wanted.push(entry.with_body(&choice.bodies[&entry.name]));
        }
    }
    let mut bodies: Vec<&Entry> = Vec::new();
    for entry in &wanted {
        if !bodies.iter().any(|b| b.body == entry.body) {
            bodies.push(entry);
        }
    }
    let built = parallel_map(&bodies, cores(), |entry| {
        let (executable, cached) = compiler.compile_through_cache(entry)?;
        let bytes = executable.serialize().map_err(pjrt(format!(
            "serializing the executable of entry {}",
            entry.name
        )))?;
        Ok::<_, LoadError>((entry.body.as_str(), bytes, cached))
    })?;
    let compile_time = started.elapsed();
    let cache_hits = built.iter().filter(|(_, _, cached)| *cached).count();
    let executables: Vec<(String, String, Vec<u8>)> = wanted
        .iter()
        .map(|entry| {
            let (_, bytes, _) = built
                .iter()
                .find(|(body, _, _)| *body == entry.body)
                .expect("every body was compiled");
            (entry.name.clone(), entry.body.clone(), bytes.clone())
        })
        .collect();
    let identity = opened
        .platform
        .identity
        .compiler_identity(
            &opened.platform.plugin_path,
            &compile_options.to_proto_bytes(),
            cache.as_ref(),
        )
        .map_err(|source| LoadError::Io {
            what: format!(
                "hashing the plugin {}",
                opened.platform.plugin_path.display()
            ),
            source,
        })?;
    let AddedExecutables {
        artifact: _,
        files,
        bytes,
        replaced,
        removed_signature,
    } = tlaloc_artifact::add_executables(&artifact, identity.clone(), &executables)?;
    Ok(CompiledArtifact {
        identity,
        entries: artifact.manifest().entries.len(),
        variants: executables.len() - artifact.manifest().entries.len(),
        files,
        bytes,
        compiled: built.len() - cache_hits,
        cache_hits,
        replaced,
        removed_signature,
        compile_time,
    })
}

/// Runs `f` and measures it.
fn timed<R>(f: impl FnOnce() -> R) -> (R, Duration) {
    let started = Instant::now();
    let result = f();
    (result, started.elapsed())
}

/// The result of a scoped thread; a panic in it goes on in the caller.
fn join<R>(handle: std::thread::ScopedJoinHandle<'_, R>) -> R {
    handle
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// Available cores, at least one.
fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Weight reads and uploads in flight at once: enough to keep a GPU's copy engines busy, few
/// enough that the files held in memory stay a small part of the weights.
const MAX_UPLOAD_THREADS: usize = 8;

/// `f` applied to every item on up to `threads` threads, results in the items' order. Workers
/// take the next item from a shared counter (weights differ in size by orders of magnitude, so
/// fixed chunks would leave threads idle), and stop taking new items after the first failure.
fn parallel_map<T: Sync, R: Send, E: Send>(
    items: &[T],
    threads: usize,
    f: impl Fn(&T) -> Result<R, E> + Sync,
) -> Result<Vec<R>, E> {
    parallel_map_with(items, threads, || (), |_, item| f(item))
}

/// [`parallel_map`] with per-thread state: each thread makes its own with `init` before its
/// first item and passes it to every `f` it runs.
fn parallel_map_with<T: Sync, S, R: Send, E: Send>(
    items: &[T],
    threads: usize,
    init: impl Fn() -> S + Sync,
    f: impl Fn(&mut S, &T) -> Result<R, E> + Sync,
) -> Result<Vec<R>, E> {
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let results: Mutex<Vec<Option<Result<R, E>>>> =
        Mutex::new(items.iter().map(|_| None).collect());
    let work = || {
        let mut state = init();
        while !failed.load(Ordering::Relaxed) {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(item) = items.get(i) else { break };
            let result = f(&mut state, item);
            if result.is_err() {
                failed.store(true, Ordering::Relaxed);
            }
            results.lock().unwrap_or_else(|p| p.into_inner())[i] = Some(result);
        }
    };
    let threads = threads.clamp(1, items.len().max(1));
    std::thread::scope(|scope| {
        for _ in 1..threads {
            scope.spawn(work);
        }
        work();
    });
    let results = results.into_inner().unwrap_or_else(|p| p.into_inner());
    // The first failure in item order wins, so that a refusal does not depend on scheduling.
    let mut out = Vec::with_capacity(items.len());
    for result in results {
        match result {
            Some(Ok(value)) => out.push(value),
            Some(Err(e)) => return Err(e),
            // Left untaken after another item failed; that failure comes later in the order.
            None => {}
        }
    }
    Ok(out)
}

/// Everything compiling an entry needs; shared by the load threads.
#[derive(Debug, Clone, Copy)]
struct Compiler<'a> {
    client: &'a Client,
    artifact: &'a Artifact,
    cache: Option<&'a CompileCache>,
    identity: &'a CacheIdentity,
    options: &'a CompileOptions,
    /// Shipped executables usable here, by entry name.
    shipped: Option<&'a HashMap<(String, String), ExecutableEntry>>,
}

/// Executables for every entry, and where they came from.
#[derive(Debug)]
struct Compiled {
    executables: Vec<(LadderPoint, LoadedExecutable)>,
    cache_hits: usize,
    compiled: usize,
    from_artifact: usize,
    /// Why the plugin refused a shipped executable whose identity matched (the first refusal).
    refused: Option<String>,
}

/// Where an entry's executable came from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Origin {
    /// Deserialized from the artifact's executables.
    Artifact,
    /// Deserialized from the compile cache.
    Cache,
    /// Compiled from the body text.
    Compiled,
    /// Compiled because the plugin refused the shipped executable (why).
    CompiledAfterRefusal(String),
}

/// The shipped executables this plugin and device may use, and why the others may not.
#[derive(Debug, Default)]
struct Selection {
    /// By entry name and body.
    usable: HashMap<(String, String), ExecutableEntry>,
    /// Why no set is usable, when the artifact ships some and none is.
    unusable: Option<String>,
    /// Whether the artifact ships any.
    shipped_any: bool,
}

/// Picks the set of shipped executables whose identity equals this plugin's and device's.
fn select_executables(
    artifact: &Artifact,
    platform: &Platform,
    options: &CompileOptions,
    cache: Option<&CompileCache>,
    enabled: bool,
) -> Selection {
    let sets = &artifact.manifest().executables;
    let mut selection = Selection {
        shipped_any: !sets.is_empty(),
        ..Selection::default()
    };
    if sets.is_empty() {
        return selection;
    }
    if !enabled {
        selection.unusable = Some("the artifact's executables were not asked for".into());
        return selection;
    }
    let started = Instant::now();
    let mine = platform.identity.compiler_identity(
        &platform.plugin_path,
        &options.to_proto_bytes(),
        cache,
    );
    tracing::debug!(
        ms = started.elapsed().as_millis() as u64,
        "identity of this plugin and device (plugin file hashed)"
    );
    let mine = match mine {
        Ok(mine) => mine,
        Err(e) => {
            selection.unusable = Some(format!(
                "cannot hash the plugin file {}: {e}",
                platform.plugin_path.display()
            ));
            return selection;
        }
    };
    match sets.iter().find(|set| set.identity == mine) {
        Some(set) => {
            selection.usable = set
                .entries
                .iter()
                .map(|e| ((e.entry.clone(), e.body.clone()), e.clone()))
                .collect();
        }
        None => {
            let theirs: Vec<String> = sets
                .iter()
                .map(|set| {
                    format!(
                        "{} (differs in {})",
                        set.identity.describe(),
                        set.identity.differences(&mine).join(", ")
                    )
                })
                .collect();
            selection.unusable = Some(format!(
                "the artifact's executables were built by {}; this is {}",
                theirs.join(" and by "),
                mine.describe()
            ));
        }
    }
    selection
}

impl Selection {
    /// The load log's line about shipped executables when every entry waits for first use.
    fn report_deferred(&self, entries: usize) -> Option<String> {
        if !self.shipped_any {
            return None;
        }
        let line = match &self.unusable {
            None => format!(
                "executables: {} of {entries} entries will load from the artifact on first use (identity matches)",
                self.usable.len()
            ),
            Some(why) => {
                format!("executables: all {entries} entries will compile on first use: {why}")
            }
        };
        if self.unusable.is_none() {
            tracing::info!("{line}");
        } else {
            tracing::warn!("{line}");
        }
        Some(line)
    }

    /// The one line of the load log about shipped executables (`None` when there are none),
    /// logged as it is returned: info when every entry came from the artifact, warn otherwise.
    fn report(&self, compiled: &Compiled) -> Option<String> {
        if !self.shipped_any {
            return None;
        }
        let counts = format!(
            "executables: {} loaded from the artifact, {} compiled, {} from the compile cache",
            compiled.from_artifact, compiled.compiled, compiled.cache_hits
        );
        let why = if let Some(why) = &self.unusable {
            Some(why.clone())
        } else if let Some(why) = &compiled.refused {
            Some(format!(
                "the identity matches but the plugin refused a shipped executable: {why}"
            ))
        } else if compiled.compiled + compiled.cache_hits > 0 {
            Some("the artifact ships no executable for the others".into())
        } else {
            None
        };
        match why {
            None => {
                let line = format!("{counts} (identity matches)");
                tracing::info!("{line}");
                Some(line)
            }
            Some(why) => {
                let line = format!("{counts}: {why}");
                tracing::warn!("{line}");
                Some(line)
            }
        }
    }
}

impl Compiler<'_> {
    /// Loads one entry's executable from the artifact when it ships a usable one (hash checked
    /// first: altered bytes fail the load), else compiles it through the cache; says where
    /// the executable came from.
    fn compile(&self, entry: &Entry) -> Result<(LoadedExecutable, Origin), LoadError> {
        let mut refused = None;
        if let Some(shipped) = self
            .shipped
            .and_then(|s| s.get(&(entry.name.clone(), entry.body.clone())))
        {
            let bytes = self.artifact.executable_bytes(shipped)?;
            match self.client.deserialize_executable(&bytes, self.options) {
                Ok(executable) => return Ok((executable, Origin::Artifact)),
                Err(e) => {
                    tracing::warn!(entry = %entry.name, file = %shipped.file, error = %e, "the plugin refused the shipped executable; compiling");
                    refused = Some(format!("{}: {e}", shipped.file));
                }
            }
        }
        let (executable, cached) = match self.compile_through_cache(entry) {
            Ok(built) => built,
            Err(e) => {
                // A variant the plugin cannot compile after all: its portable body runs.
                let portable = self.artifact.entry(&entry.name)?;
                if portable.body == entry.body {
                    return Err(e);
                }
                tracing::warn!(entry = %entry.name, body = %entry.body, error = %e, "the plugin refused a body variant; compiling the portable body");
                self.compile_through_cache(portable)?
            }
        };
        let origin = match (refused, cached) {
            (Some(why), _) => Origin::CompiledAfterRefusal(why),
            (None, true) => Origin::Cache,
            (None, false) => Origin::Compiled,
        };
        Ok((executable, origin))
    }

    /// Compiles (or loads from the cache) one entry; returns whether the cache served it.
    fn compile_through_cache(&self, entry: &Entry) -> Result<(LoadedExecutable, bool), LoadError> {
        let options_bytes = self.options.to_proto_bytes();
        let cache_key = tlaloc_artifact::paths::body_hash(&entry.body)
            .ok()
            .map(|hash| CompileCache::key(self.identity, hash, &options_bytes));
        if let (Some(cache), Some(k)) = (self.cache, &cache_key)
            && let Some(bytes) = cache.get(k)
        {
            match self.client.deserialize_executable(&bytes, self.options) {
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
            .compile(&text, self.options)
            .map_err(pjrt(format!("compiling entry {}", entry.name)))?;
        tracing::debug!(entry = %entry.name, ms = started.elapsed().as_millis() as u64, "compiled");
        if let (Some(cache), Some(k)) = (self.cache, &cache_key) {
            match executable.serialize() {
                Ok(bytes) => cache.put(k, &bytes),
                Err(e) => {
                    tracing::warn!(entry = %entry.name, error = %e, "cannot serialize executable")
                }
            }
        }
        Ok((executable, false))
    }

    /// Compiles each distinct body once, on up to one thread per core (compiling is CPU-bound),
    /// and gives every entry (in `order`) the executable of its body.
    fn compile_all(
        &self,
        order: &[LadderPoint],
        entries: &HashMap<LadderPoint, EntryState>,
    ) -> Result<Compiled, LoadError> {
        let mut bodies: Vec<&Entry> = Vec::new();
        for key in order {
            let entry = &entries[key].entry;
            if !bodies.iter().any(|b| b.body == entry.body) {
                bodies.push(entry);
            }
        }
        let built = parallel_map(&bodies, cores(), |entry| self.compile(entry))?;
        let count = |origin: &Origin| built.iter().filter(|(_, o)| o == origin).count();
        let cache_hits = count(&Origin::Cache);
        let from_artifact = count(&Origin::Artifact);
        let compiled = built.len() - cache_hits - from_artifact;
        let refused = built.iter().find_map(|(_, o)| match o {
            Origin::CompiledAfterRefusal(why) => Some(why.clone()),
            _ => None,
        });
        let by_body: HashMap<&str, &LoadedExecutable> = bodies
            .iter()
            .zip(&built)
            .map(|(entry, (executable, _))| (entry.body.as_str(), executable))
            .collect();
        let executables = order
            .iter()
            .map(|key| (*key, by_body[entries[key].entry.body.as_str()].clone()))
            .collect();
        Ok(Compiled {
            executables,
            cache_hits,
            compiled,
            from_artifact,
            refused,
        })
    }
}

/// What the weight upload measured, summed over its threads.
#[derive(Debug, Default)]
struct UploadStats {
    /// Reading weight files into host memory.
    read: Duration,
    /// Handing the bytes to the plugin until it no longer reads them.
    transfer: Duration,
    /// Bytes handed over from host memory the plugin mapped for DMA (0 where it maps none).
    pinned_bytes: u64,
}

/// The largest staging buffer an upload thread keeps; a weight larger than this is read into
/// memory of its own.
const MAX_UPLOAD_STAGING: u64 = 2 << 30;

/// `len` bytes of host memory mapped for DMA with `client`; `None` where the plugin maps none
/// (the CPU plugins) or mapping failed, which is logged: the caller then uses ordinary memory.
fn mapped_or_none(client: &Client, len: usize, what: &str) -> Option<PinnedHostMemory> {
    client.pinned_host_memory(len).unwrap_or_else(|e| {
        tracing::warn!(error = %e, "mapping {what} for DMA failed; using pageable memory");
        None
    })
}

/// One upload thread's staging buffer, made on the thread's first weight.
enum Staging {
    /// Host memory the plugin mapped for DMA: the copy engine reads it directly, at the link's
    /// pinned rate (54.7 GB/s against 7.6 GB/s pageable on the H100 host, 2026-12-07).
    Pinned(PinnedHostMemory),
    /// Ordinary memory, where the plugin maps none (the CPU plugins) or mapping failed.
    Pageable(Vec<u8>),
}

impl Staging {
    /// The staging bytes in `slot` for a weight of `len` bytes, or `None` when it is larger
    /// than `max_len` (it is then read into memory of its own). Pinned memory where the plugin
    /// maps host memory, grown to the largest weight this thread has met (an 8B model's threads
    /// mostly hold one 235 MB per-layer weight; only the ones that meet the 1 GB embedding or
    /// LM head pin that much); else one ordinary buffer of `max_len`, made at once, since
    /// growing it would fault in fresh pages again. The flag says pinned.
    fn for_weight<'a>(
        slot: &'a mut Option<Staging>,
        client: &Client,
        len: usize,
        max_len: usize,
    ) -> Option<(&'a mut [u8], bool)> {
        if len > max_len {
            return None;
        }
        let fits = match slot {
            None => false,
            Some(Staging::Pinned(pinned)) => pinned.len() >= len,
            Some(Staging::Pageable(_)) => true,
        };
        if !fits {
            // The old region is unmapped before the larger one is mapped.
            *slot = None;
        }
        let staging = slot.get_or_insert_with(|| {
            match mapped_or_none(client, len.max(1), "an upload staging buffer") {
                Some(pinned) => Staging::Pinned(pinned),
                None => Staging::Pageable(vec![0u8; max_len]),
            }
        });
        match staging {
            Staging::Pinned(pinned) => Some((&mut pinned[..len], true)),
            Staging::Pageable(pageable) => Some((&mut pageable[..len], false)),
        }
    }
}

/// Reads and uploads every weight of the manifest, in manifest order, on several threads.
///
/// Each thread reads its weights into one staging buffer it reuses: reading into fresh memory
/// per weight cost more than the upload itself (the kernel faults in and zeroes every new page;
/// on the H200 host an 8B model's 16 GB read at 0.8 GB/s per thread into fresh memory and at
/// 4.2 GB/s into reused memory). Where the plugin maps host memory for DMA the staging buffer
/// is mapped once, so the weight crosses the link without the plugin's own second copy.
fn upload_weights(
    client: &Client,
    devices: &[Device],
    artifact: &Artifact,
) -> Result<(Vec<Vec<Buffer>>, UploadStats), LoadError> {
    let weights = &artifact.manifest().weights;
    let degree = devices.len();
    let staging_len = weights
        .iter()
        .filter(|w| w.split.is_none())
        .map(|w| w.byte_length)
        .filter(|&len| len <= MAX_UPLOAD_STAGING)
        .max()
        .unwrap_or(0) as usize;
    let stats = Mutex::new(UploadStats::default());
    // `[weight][device]`: a replicated weight is read once and uploaded to every device, a
    // split one's shard k is read and uploaded to device k.
    let buffers = parallel_map_with(
        weights,
        cores().min(MAX_UPLOAD_THREADS),
        // Made on first use, so a thread that gets no weight costs nothing; zeroed pages are
        // mapped lazily, on the first read into them (or at once, where pinned).
        || None,
        |staging, w| {
            let mut read = Duration::ZERO;
            let mut transfer = Duration::ZERO;
            let mut pinned_bytes = 0;
            let mut on_devices = Vec::with_capacity(degree);
            let bad_dims = || {
                LoadError::Unsupported(format!(
                    "weight {}: {:?} cannot hold dims {:?}",
                    w.slot, w.block_format, w.dims
                ))
            };
            // A block-quantized weight is uploaded as the raw bytes its operand is.
            let (dtype, dims) = w.operand().ok_or_else(bad_dims)?;
            match &w.split {
                None => {
                    let started = Instant::now();
                    let len = w.byte_length as usize;
                    let owned;
                    let (bytes, pinned): (&[u8], bool) =
                        match Staging::for_weight(staging, client, len, staging_len) {
                            Some((buffer, pinned)) => {
                                artifact.read_weight_into(&w.slot, buffer)?;
                                (buffer, pinned)
                            }
                            None => {
                                owned = artifact.weight_bytes(&w.slot)?;
                                (&owned, false)
                            }
                        };
                    read += started.elapsed();
                    for device in devices {
                        let started = Instant::now();
                        on_devices.push(
                            client
                                .buffer_from_host_bytes(
                                    bytes,
                                    element_type(dtype),
                                    &dims_i64(&dims),
                                    device,
                                )
                                .map_err(pjrt(format!("uploading weight {}", w.slot)))?,
                        );
                        transfer += started.elapsed();
                        if pinned {
                            pinned_bytes += len as u64;
                        }
                    }
                }
                Some(split) => {
                    let logical = tlaloc_artifact::tensor_parallel::shard_dims(
                        &w.dims,
                        w.block_format,
                        split.axis,
                        degree,
                    )
                    .map_err(|why| {
                        LoadError::Unsupported(format!(
                            "weight {} does not split over {degree} devices: {why}",
                            w.slot
                        ))
                    })?;
                    let shard_dims = match w.block_format {
                        None => logical,
                        Some(format) => format.operand_dims(&logical).map_err(|_| bad_dims())?,
                    };
                    for (k, device) in devices.iter().enumerate() {
                        let started = Instant::now();
                        let bytes = artifact.weight_shard_bytes(&w.slot, k)?;
                        read += started.elapsed();
                        let started = Instant::now();
                        on_devices.push(
                            client
                                .buffer_from_host_bytes(
                                    &bytes,
                                    element_type(dtype),
                                    &dims_i64(&shard_dims),
                                    device,
                                )
                                .map_err(pjrt(format!("uploading weight {} shard {k}", w.slot)))?,
                        );
                        transfer += started.elapsed();
                    }
                }
            }
            let mut stats = stats.lock().unwrap_or_else(|p| p.into_inner());
            stats.read += read;
            stats.transfer += transfer;
            stats.pinned_bytes += pinned_bytes;
            Ok::<_, LoadError>(on_devices)
        },
    )?;
    let mut by_device: Vec<Vec<Buffer>> = (0..degree)
        .map(|_| Vec::with_capacity(buffers.len()))
        .collect();
    for on_devices in buffers {
        for (k, buffer) in on_devices.into_iter().enumerate() {
            by_device[k].push(buffer);
        }
    }
    Ok((
        by_device,
        stats.into_inner().unwrap_or_else(|p| p.into_inner()),
    ))
}

/// Zero-filled pools of `specs`, in order: one [`zero_pools`] call per distinct spec.
fn zero_pools_of(
    client: &Client,
    device: &Device,
    specs: &[PoolSpec],
) -> Result<Vec<Buffer>, tlaloc_pjrt::Error> {
    let mut out: Vec<Option<Buffer>> = specs.iter().map(|_| None).collect();
    let mut done = vec![false; specs.len()];
    for i in 0..specs.len() {
        if done[i] {
            continue;
        }
        let same: Vec<usize> = (i..specs.len()).filter(|&j| specs[j] == specs[i]).collect();
        let buffers = zero_pools(
            client,
            device,
            same.len(),
            specs[i].element_type,
            &specs[i].dims,
        )?;
        for (j, buffer) in same.into_iter().zip(buffers) {
            done[j] = true;
            out[j] = Some(buffer);
        }
    }
    Ok(out
        .into_iter()
        .map(|b| b.expect("every spec filled"))
        .collect())
}

/// `count` zero-filled pools. One is uploaded from host zeros and the others are copied from
/// it on the device; where the plugin refuses a copy to the device a buffer is already on,
/// the others are uploaded from the same host zeros on several threads.
fn zero_pools(
    client: &Client,
    device: &Device,
    count: usize,
    element_type: ElementType,
    dims: &[i64],
) -> Result<Vec<Buffer>, tlaloc_pjrt::Error> {
    if count == 0 {
        return Ok(Vec::new());
    }
    let bytes = dims.iter().product::<i64>() as usize * element_type.byte_size();
    // Pinned where the plugin maps host memory: the pools are uploaded from these zeros when
    // the plugin refuses a copy on the device, and pageable zeros cross the link at a seventh
    // of the pinned rate.
    let pinned = mapped_or_none(client, bytes.max(1), "the pools' zeros");
    let pageable;
    let zeros: &[u8] = match &pinned {
        Some(pinned) => &pinned[..bytes],
        None => {
            pageable = vec![0u8; bytes];
            &pageable
        }
    };
    let upload = || client.buffer_from_host_bytes(zeros, element_type, dims, device);
    let first = upload()?;
    let mut pools = Vec::with_capacity(count);
    match first.copy_to_device(device) {
        Ok(copy) => {
            pools.push(copy);
            for _ in 2..count {
                pools.push(first.copy_to_device(device)?);
            }
        }
        Err(e) => {
            tracing::debug!(error = %e, "no copy on the device; uploading every pool");
            let rest: Vec<usize> = (1..count).collect();
            pools = parallel_map(&rest, cores().min(MAX_UPLOAD_THREADS), |_| upload())?;
        }
    }
    pools.insert(0, first);
    Ok(pools)
}

fn arg_plan(
    entry: &Entry,
    signature: &tlaloc_artifact::ProgramSignature,
    weight_index: &HashMap<&str, usize>,
    pools: &[PoolOperand],
) -> Result<ArgPlan, LoadError> {
    let pool_index = |role: &OperandRole| pools.iter().position(|p| p.role == *role);
    let unsupported =
        |what: String| LoadError::Unsupported(format!("entry {}: {what}", entry.name));
    let mut inputs = Vec::with_capacity(signature.inputs.len());
    for spec in &signature.inputs {
        inputs.push(match &spec.role {
            role if StepInput::from_role(role).is_some() => {
                Source::Step(StepInput::from_role(role).expect("matched"))
            }
            OperandRole::Weight { slot } => {
                Source::Weight(*weight_index.get(slot.as_str()).ok_or_else(|| {
                    unsupported(format!("weight slot {slot} is not in the manifest"))
                })?)
            }
            role if pool_index(role).is_some() => Source::Pool(pool_index(role).expect("matched")),
            other => {
                return Err(unsupported(format!(
                    "input {} has role {other:?}",
                    spec.name
                )));
            }
        });
    }
    let mut step_outputs = [None; ProgramOutput::ALL.len()];
    let mut pool_outputs = vec![usize::MAX; pools.len()];
    for (i, spec) in signature.outputs.iter().enumerate() {
        match &spec.role {
            role if ProgramOutput::from_role(role).is_some() => {
                step_outputs[ProgramOutput::from_role(role).expect("matched").index()] = Some(i);
            }
            role if pool_index(role).is_some() => {
                pool_outputs[pool_index(role).expect("matched")] = i;
            }
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
    let mut found = [0; ProgramOutput::ALL.len()];
    for (output, index) in ProgramOutput::ALL.into_iter().zip(step_outputs) {
        found[output.index()] =
            index.ok_or_else(|| unsupported(format!("no {} output", output.name())))?;
    }
    let mut donated_steps = [false; StepInput::ALL.len()];
    for donation in &signature.donations {
        if let Some(Source::Step(input)) = inputs.get(donation.input) {
            donated_steps[input.index()] = true;
        }
    }
    Ok(ArgPlan {
        inputs,
        step_outputs: found,
        pool_outputs,
        donated_steps,
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

    fn step(
        &mut self,
        key: &LadderPoint,
        inputs: &StepInputs,
    ) -> Result<StepOutput, ExecutorError> {
        let launched = self.launch(key, inputs, std::array::from_fn(|_| None))?;
        self.read(key, launched, inputs.want_logits)
    }

    fn max_decode_chain(&self) -> usize {
        self.max_decode_chain
    }

    fn decode_chain_window(&self) -> Duration {
        self.decode_chain_window
    }

    fn all_entries_compiled(&self) -> bool {
        self.entries.values().all(|e| e.executable.is_some())
    }

    fn decode_chain(
        &mut self,
        key: &LadderPoint,
        steps: &[StepInputs],
    ) -> Result<Vec<StepOutput>, ExecutorError> {
        if self.devices.len() > 1 {
            // No chains across several devices: each step reads its tokens back.
            return steps.iter().map(|inputs| self.step(key, inputs)).collect();
        }
        // Every step is launched before any result is read: the device runs them back to back.
        // After the first, no step input crosses from the host: each step takes its token ids,
        // positions, lengths and slots from the step before it (the contract's next-step
        // outputs, moved into the call where the program donates them, so that every step's
        // operands keep one address) and the first step's block tables.
        let mut launched: Vec<Launched> = Vec::with_capacity(steps.len());
        for inputs in steps {
            let mut carried: [Option<Buffer>; StepInput::ALL.len()] = std::array::from_fn(|_| None);
            if let Some(previous) = launched.last_mut() {
                let plan = &self.entries[key].plan;
                for input in StepInput::ALL {
                    if let Some(output) = input.carried_by() {
                        let index = plan.step_outputs[output.index()];
                        carried[input.index()] =
                            previous.outputs.get_mut(index).and_then(Option::take);
                    }
                }
            }
            let mut fed: [Option<Fed<'_>>; StepInput::ALL.len()] = std::array::from_fn(|_| None);
            if let Some(first) = launched.first() {
                for input in StepInput::ALL {
                    let buffer = match input.carried_by() {
                        Some(_) => carried[input.index()].take().map(Fed::Owned),
                        None => first.inputs[0][input.index()].as_ref().map(Fed::Borrowed),
                    };
                    fed[input.index()] = Some(buffer.ok_or_else(|| ExecutorError::Device {
                        entry: *key,
                        message: format!("no buffer to feed {} from", input.name()),
                    })?);
                }
            }
            let mut step = self.launch(key, inputs, fed)?;
            if !inputs.want_logits {
                // Unread logits go now, not at the end of the chain, so their memory is free
                // for the next step's.
                let index = self.entries[key].plan.step_outputs[ProgramOutput::Logits.index()];
                if let Some(logits) = step.outputs.get_mut(index) {
                    *logits = None;
                }
            }
            launched.push(step);
        }
        launched
            .into_iter()
            .zip(steps)
            .map(|(step, inputs)| self.read(key, step, inputs.want_logits))
            .collect()
    }
}

/// A step input that comes from the device instead of the host: a buffer the call may take
/// (an output of the step before, donated where the program donates that input) or one it
/// only reads (the first step's block tables).
enum Fed<'a> {
    Owned(Buffer),
    Borrowed(&'a Buffer),
}

/// A launched step: the first device's outputs (the pools already taken back by the model),
/// every device's step inputs that the call read without taking (`[device][StepInput::index]`,
/// `None` where donated or borrowed), which must outlive the launch, and the host time spent
/// so far.
struct Launched {
    outputs: Vec<Option<Buffer>>,
    inputs: Vec<Vec<Option<Buffer>>>,
    timings: StepTimings,
}

impl Model {
    /// Uploads the step inputs (except those `fed` gives as device buffers, by
    /// [`StepInput::index`]) and launches `key` without waiting for the device.
    fn launch(
        &mut self,
        key: &LadderPoint,
        inputs: &StepInputs,
        fed: [Option<Fed<'_>>; StepInput::ALL.len()],
    ) -> Result<Launched, ExecutorError> {
        if !self.entries.contains_key(key) {
            return Err(ExecutorError::UnknownEntry(*key));
        }
        if self.entries[key].executable.is_none() {
            let started = Instant::now();
            let entry = &self.entries[key].entry;
            let (executable, origin) =
                self.compiler()
                    .compile(entry)
                    .map_err(|e| ExecutorError::Device {
                        entry: *key,
                        message: e.to_string(),
                    })?;
            tracing::info!(entry = %key, ms = started.elapsed().as_millis() as u64, ?origin, "ready on first use");
            self.entries.get_mut(key).expect("checked").executable = Some(executable);
        }
        let any_fed = fed.iter().any(Option::is_some);
        if any_fed && key.tokens != 1 {
            return Err(ExecutorError::BadInputs {
                entry: *key,
                what: "device-fed step inputs on an entry of more than one token per row".into(),
            });
        }
        if any_fed && self.devices.len() > 1 {
            return Err(ExecutorError::BadInputs {
                entry: *key,
                what: "device-fed step inputs on a tensor-parallel model".into(),
            });
        }
        let mut timings = StepTimings::default();
        let started = Instant::now();
        if self.pools.iter().flatten().any(Option::is_none) {
            // A failed step consumed the donated pools; start over from zeros.
            self.refill_pools()
                .map_err(|e| Self::device_error(key, "reallocating the K/V pools", e))?;
        }
        let mut step_arrays = Vec::with_capacity(StepInput::ALL.len());
        for input in StepInput::ALL {
            let data = inputs.array(input);
            let dims = dims_i64(&input.dims(*key, self.shape.block_size));
            if data.len() as i64 != dims.iter().product::<i64>() {
                return Err(ExecutorError::BadInputs {
                    entry: *key,
                    what: format!(
                        "{} of {} values for dims {dims:?}",
                        input.name(),
                        data.len()
                    ),
                });
            }
            step_arrays.push((input, data, dims));
        }
        // `[device][StepInput::index]`: the uploads and the owned fed buffers. Every device
        // gets the same step inputs; fed ones exist only with one device (checked above).
        let mut lent: [Option<&Buffer>; StepInput::ALL.len()] = [None; StepInput::ALL.len()];
        let mut owned_fed: Vec<Option<Buffer>> = Vec::with_capacity(StepInput::ALL.len());
        for (i, fed) in fed.into_iter().enumerate() {
            owned_fed.push(match fed {
                Some(Fed::Owned(buffer)) => Some(buffer),
                Some(Fed::Borrowed(buffer)) => {
                    lent[i] = Some(buffer);
                    None
                }
                None => None,
            });
        }
        let mut step_buffers: Vec<Vec<Option<Buffer>>> = Vec::with_capacity(self.devices.len());
        for device in &self.devices {
            let mut on_device = Vec::with_capacity(step_arrays.len());
            for (input, data, dims) in &step_arrays {
                let i = input.index();
                if owned_fed[i].is_some() {
                    on_device.push(owned_fed[i].take());
                    continue;
                }
                if lent[i].is_some() {
                    on_device.push(None);
                    continue;
                }
                on_device.push(Some(
                    self.client
                        .buffer_from_host(data, dims, device)
                        .map_err(|e| Self::device_error(key, "uploading step inputs", e))?,
                ));
            }
            step_buffers.push(on_device);
        }
        timings.upload = started.elapsed();

        let state = &self.entries[key];
        let plan = &state.plan;
        let executable = state.executable.as_ref().expect("compiled above");
        // The inputs the program donates move into the call; the rest are read in place.
        let mut donated_steps: Vec<Vec<Option<Buffer>>> = step_buffers
            .iter_mut()
            .map(|on_device| {
                on_device
                    .iter_mut()
                    .enumerate()
                    .map(|(i, buffer)| {
                        if plan.donated_steps[i] {
                            buffer.take()
                        } else {
                            None
                        }
                    })
                    .collect()
            })
            .collect();
        let mut donated: Vec<Vec<Option<Buffer>>> = self
            .pools
            .iter_mut()
            .map(|pools| pools.iter_mut().map(Option::take).collect())
            .collect();
        // Each device's arguments: its step inputs in role order (the fed ones from the
        // device), its weights by reference, its pools donated.
        let args: Vec<Vec<ExecuteArg<'_>>> = step_buffers
            .iter()
            .zip(&mut donated_steps)
            .zip(&self.weights)
            .zip(&mut donated)
            .map(|(((step_buffers, donated_steps), weights), donated)| {
                plan.inputs
                    .iter()
                    .map(|source| match *source {
                        Source::Step(i) => match donated_steps[i.index()].take() {
                            Some(buffer) => ExecuteArg::Donated(buffer),
                            None => ExecuteArg::Borrowed(
                                step_buffers[i.index()]
                                    .as_ref()
                                    .or(lent[i.index()])
                                    .expect("an input is left out only when fed"),
                            ),
                        },
                        Source::Weight(i) => ExecuteArg::Borrowed(&weights[i]),
                        Source::Pool(i) => {
                            ExecuteArg::Donated(donated[i].take().expect("every pool present"))
                        }
                    })
                    .collect()
            })
            .collect();
        let started = Instant::now();
        let per_device = if args.len() == 1 {
            let args = args.into_iter().next().expect("one device");
            executable.execute(args).map(|outputs| vec![outputs])
        } else {
            executable.execute_per_device(args)
        }
        .map_err(|e| Self::device_error(key, "execute", e))?;
        timings.execute = started.elapsed();
        let mut first_outputs = Vec::new();
        for (k, outputs) in per_device.into_iter().enumerate() {
            let mut outputs: Vec<Option<Buffer>> = outputs.into_iter().map(Some).collect();
            for (pool, &output) in plan.pool_outputs.iter().enumerate() {
                self.pools[k][pool] = outputs.get_mut(output).and_then(Option::take);
            }
            if k == 0 {
                // Tokens and logits are replicated: the first device's are read.
                first_outputs = outputs;
            }
        }
        Ok(Launched {
            outputs: first_outputs,
            inputs: step_buffers,
            timings,
        })
    }

    /// Waits for a launched step and copies its next tokens (and logits when wanted) back.
    fn read(
        &self,
        key: &LadderPoint,
        launched: Launched,
        want_logits: bool,
    ) -> Result<StepOutput, ExecutorError> {
        let plan = &self.entries[key].plan;
        let Launched {
            outputs,
            mut timings,
            ..
        } = launched;
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
        let output = |o: ProgramOutput| read(plan.step_outputs[o.index()]);
        let next_tokens = output(ProgramOutput::NextTokens)?
            .to_host_vec::<i32>()
            .map_err(|e| Self::device_error(key, "reading nextTokens", e))?;
        let logits = if want_logits {
            Some(
                output(ProgramOutput::Logits)?
                    .to_host_vec::<f32>()
                    .map_err(|e| Self::device_error(key, "reading logits", e))?,
            )
        } else {
            None
        };
        timings.readback = started.elapsed();
        Ok(StepOutput {
            next_tokens,
            logits,
            timings,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parallel_map_keeps_the_item_order_of_a_sequential_map() {
        let items: Vec<u64> = (0..200).map(|i| (i * 7919) % 1000).collect();
        // Uneven work, so that threads finish items out of order.
        let f = |&x: &u64| -> Result<u64, String> {
            std::thread::sleep(Duration::from_micros(x % 5 * 50));
            Ok(x * x + 1)
        };
        let sequential: Vec<u64> = items.iter().map(|x| f(x).unwrap()).collect();
        for threads in [1, 3, 8, 500] {
            assert_eq!(parallel_map(&items, threads, f).unwrap(), sequential);
        }
        assert_eq!(
            parallel_map(&[] as &[u64], 4, f).unwrap(),
            Vec::<u64>::new()
        );
    }

    #[test]
    fn parallel_map_reports_the_first_failure_in_item_order() {
        let items: Vec<usize> = (0..100).collect();
        for threads in [1, 4] {
            let got = parallel_map(&items, threads, |&i| {
                if i == 37 || i == 80 {
                    Err(format!("item {i}"))
                } else {
                    Ok(i)
                }
            });
            assert_eq!(got, Err("item 37".to_string()));
        }
    }
}
