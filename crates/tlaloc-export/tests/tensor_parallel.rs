//! Tensor-parallel exports (`--tensor-parallel N`) run as SPMD programs on N devices of one CPU
//! client, against the same checkpoint exported for one device: greedy ids equal and logits
//! within an f32 tolerance derived from the model's magnitudes, on every test plugin. Also: the
//! artifact's layout (shards, shard-major fused rows, annotated bodies) and the refusal of
//! degrees a model cannot be split by.
//!
//! The tiny fixture has 4 attention heads and 2 KV heads, so it runs at degree 2 (4 would split
//! a KV head), with f32 and with int8 K/V pools; SmolLM2 has 9 and 3, so it runs at degree 3,
//! dense and with its Q4_1 matrices kept as blocks.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use support::{dims_i64, element_type};
use tlaloc_artifact::tensor_parallel::{POOL_SPLIT_AXIS, shard_dims};
use tlaloc_artifact::{Artifact, LadderOptions, LadderPoint, PoolOperand, StepInput, StepOutput};
use tlaloc_export::{ExportError, ExportOptions, export};
use tlaloc_pjrt::{Buffer, Client, CompileOptions, Device, ExecuteArg, LoadedExecutable};

const TINY: &str = "tiny-llama-tied";

/// Batch 1, one context bucket of 128 in blocks of 16, prefill chunks of 16 tokens: one decode
/// and one prefill entry.
fn ladder() -> LadderOptions {
    LadderOptions::full_pool(1, 128, 16, vec![16])
}

fn options(tensor_parallel: usize) -> ExportOptions {
    ExportOptions {
        ladder: ladder(),
        tensor_parallel,
        ..ExportOptions::default()
    }
}

fn export_at(checkpoint: &Path, name: &str, options: &ExportOptions) -> PathBuf {
    let out = support::scratch_dir(name);
    let start = Instant::now();
    export(checkpoint, &out, options, &mut |_| {})
        .unwrap_or_else(|e| panic!("exporting {} to {name}: {e}", checkpoint.display()));
    eprintln!("exported {name} in {:.2?}", start.elapsed());
    out
}

/// An artifact's programs on `degree` devices of one client (one device for degree 1): every
/// device holds its shard of each split weight and the whole of each replicated one, and its
/// KV-head slice of each pool; each step runs the same inputs on every device.
struct Devices {
    artifact: Artifact,
    client: Client,
    devices: Vec<Device>,
    options: CompileOptions,
    /// `[device][weight slot]`, manifest order.
    weights: Vec<Vec<Buffer>>,
    /// `[device][pool operand]`.
    pools: Vec<Vec<Buffer>>,
    executables: BTreeMap<String, LoadedExecutable>,
}

/// What one device returned from a step: the logits of the one row and its greedy token.
struct DeviceOutput {
    logits: Vec<f32>,
    next_token: i32,
}

impl Devices {
    fn new(dir: &Path, plugin: &Path) -> Devices {
        let artifact = Artifact::open(dir).unwrap_or_else(|e| panic!("opening {dir:?}: {e}"));
        let degree = artifact.manifest().tensor_parallel_degree();
        let client = if degree == 1 {
            tlaloc_pjrt::testing::client_for(plugin)
        } else {
            tlaloc_pjrt::testing::client_with_devices(plugin, degree as u32)
                .unwrap_or_else(|e| panic!("{}: {e}", plugin.display()))
        };
        let devices: Vec<Device> = client.addressable_devices().unwrap()[..degree].to_vec();
        let ids: Vec<i32> = devices.iter().map(Device::id).collect();
        let options = if degree == 1 {
            CompileOptions::default()
        } else {
            CompileOptions::spmd(&ids).unwrap()
        };
        let mut runner = Devices {
            artifact,
            client,
            devices,
            options,
            weights: Vec::new(),
            pools: Vec::new(),
            executables: BTreeMap::new(),
        };
        runner.weights = (0..degree).map(|k| runner.upload_weights(k)).collect();
        runner.pools = (0..degree).map(|k| runner.zero_pools(k)).collect();
        runner
    }

    fn degree(&self) -> usize {
        self.devices.len()
    }

    /// Device `k`'s piece of every weight, as the manifest says where it comes from.
    fn upload_weights(&self, k: usize) -> Vec<Buffer> {
        let degree = self.degree();
        self.artifact
            .manifest()
            .weights
            .iter()
            .map(|w| {
                let logical = match &w.split {
                    None => w.dims.clone(),
                    Some(split) => shard_dims(&w.dims, w.block_format, split.axis, degree).unwrap(),
                };
                let dims = match w.block_format {
                    None => logical,
                    Some(format) => format.operand_dims(&logical).unwrap(),
                };
                let bytes = self.artifact.weight_shard_bytes(&w.slot, k).unwrap();
                self.client
                    .buffer_from_host_bytes(
                        &bytes,
                        element_type(w.dtype),
                        &dims_i64(&dims),
                        &self.devices[k],
                    )
                    .unwrap()
            })
            .collect()
    }

    /// Device `k`'s zero-filled slice of every pool (its KV heads).
    fn zero_pools(&self, k: usize) -> Vec<Buffer> {
        let degree = self.degree();
        PoolOperand::all(&self.artifact.manifest().kv_cache)
            .iter()
            .map(|p| {
                let mut dims = p.dims.clone();
                dims[POOL_SPLIT_AXIS] /= degree;
                let bytes = vec![0u8; (p.byte_length() / degree as u64) as usize];
                self.client
                    .buffer_from_host_bytes(
                        &bytes,
                        element_type(p.dtype),
                        &dims_i64(&dims),
                        &self.devices[k],
                    )
                    .unwrap()
            })
            .collect()
    }

    /// Uploads `slot`'s shards swapped between devices 0 and 1 (a planted bug for the
    /// tolerance to catch).
    fn swap_shards(&mut self, slot: &str) {
        let manifest = self.artifact.manifest();
        let index = manifest
            .weights
            .iter()
            .position(|w| w.slot == slot)
            .unwrap();
        let w = &manifest.weights[index];
        let dims = shard_dims(&w.dims, None, w.split.as_ref().unwrap().axis, 2).unwrap();
        for device in 0..2 {
            let bytes = self.artifact.weight_shard_bytes(slot, 1 - device).unwrap();
            self.weights[device][index] = self
                .client
                .buffer_from_host_bytes(
                    &bytes,
                    element_type(w.dtype),
                    &dims_i64(&dims),
                    &self.devices[device],
                )
                .unwrap();
        }
    }

    fn executable(&mut self, point: LadderPoint) -> LoadedExecutable {
        let name = point.name();
        if let Some(e) = self.executables.get(&name) {
            return e.clone();
        }
        let entry = self.artifact.entry(&name).unwrap().clone();
        let text = self.artifact.body_text(&entry).unwrap();
        let start = Instant::now();
        let exe = self
            .client
            .compile(&text, &self.options)
            .unwrap_or_else(|e| panic!("compiling {name} for {} devices: {e}", self.degree()));
        eprintln!(
            "compiled {name} for {} device(s) in {:.2?}",
            self.degree(),
            start.elapsed()
        );
        self.executables.insert(name, exe.clone());
        exe
    }

    /// One step of one sequence: `tokens` at positions `start..`, its pages `blocks`. Returns
    /// every device's output.
    fn step(
        &mut self,
        point: LadderPoint,
        tokens: &[i32],
        start: usize,
        blocks: &[i32],
    ) -> Vec<DeviceOutput> {
        let (t, c) = (point.tokens, point.context);
        let bs = self.artifact.manifest().kv_cache.block_size;
        let pad = |input: StepInput| vec![input.padding(); input.dims(point, bs).iter().product()];
        let (mut token_ids, mut positions) = (pad(StepInput::TokenIds), pad(StepInput::Positions));
        let mut block_tables = pad(StepInput::BlockTables);
        let mut slot_mapping = pad(StepInput::SlotMapping);
        for (i, &token) in tokens.iter().enumerate() {
            let pos = start + i;
            token_ids[i] = token;
            positions[i] = pos as i32;
            slot_mapping[i] = blocks[pos / bs] * bs as i32 + (pos % bs) as i32;
        }
        block_tables[..blocks.len()].copy_from_slice(blocks);
        let seq_lens = vec![(start + tokens.len()) as i32];
        let exe = self.executable(point);
        let inputs: Vec<Vec<Buffer>> = self
            .devices
            .iter()
            .map(|device| {
                [
                    (&token_ids, vec![1, t]),
                    (&positions, vec![1, t]),
                    (&block_tables, vec![1, c / bs]),
                    (&seq_lens, vec![1]),
                    (&slot_mapping, vec![t]),
                ]
                .iter()
                .map(|(data, dims)| {
                    self.client
                        .buffer_from_host(data.as_slice(), &dims_i64(dims), device)
                        .unwrap()
                })
                .collect()
            })
            .collect();
        let pools = std::mem::take(&mut self.pools);
        let args: Vec<Vec<ExecuteArg<'_>>> = inputs
            .iter()
            .zip(&self.weights)
            .zip(pools)
            .map(|((inputs, weights), pools)| {
                let mut args: Vec<ExecuteArg<'_>> =
                    inputs.iter().map(ExecuteArg::Borrowed).collect();
                args.extend(weights.iter().map(ExecuteArg::Borrowed));
                args.extend(pools.into_iter().map(ExecuteArg::Donated));
                args
            })
            .collect();
        let outputs = if self.degree() == 1 {
            vec![exe.execute(args.into_iter().next().unwrap()).unwrap()]
        } else {
            exe.execute_per_device(args)
                .unwrap_or_else(|e| panic!("running {}: {e}", point.name()))
        };
        let mut results = Vec::new();
        for (k, mut outputs) in outputs.into_iter().enumerate() {
            assert_eq!(outputs[0].device().unwrap().id(), self.devices[k].id());
            self.pools.push(outputs.split_off(StepOutput::ALL.len()));
            let next: Vec<i32> = outputs[1].to_host_vec().unwrap();
            let next_ids: Vec<i32> = outputs[2].to_host_vec().unwrap();
            assert_eq!(next, next_ids, "nextTokenIds holds nextTokens");
            results.push(DeviceOutput {
                logits: outputs[0].to_host_vec().unwrap(),
                next_token: next[0],
            });
        }
        results
    }

    /// Prefills `prompt` (one chunk) and decodes `steps` more tokens greedily, feeding each
    /// step's in-graph argmax back. Returns every device's output of every step.
    fn greedy(&mut self, prompt: &[i32], steps: usize) -> Vec<Vec<DeviceOutput>> {
        let ladder = self.artifact.manifest().ladder.clone();
        let bs = ladder.block_size;
        let total = prompt.len() + steps;
        let blocks: Vec<i32> = (1..=total.div_ceil(bs) as i32).collect();
        let prefill = ladder.prefill_entry(prompt.len(), prompt.len()).unwrap();
        let mut outputs = vec![self.step(prefill, prompt, 0, &blocks)];
        for i in 0..steps {
            let start = prompt.len() + i;
            let token = outputs.last().unwrap()[0].next_token;
            let decode = ladder.decode_entry(1, start + 1).unwrap();
            outputs.push(self.step(decode, &[token], start, &blocks));
        }
        outputs
    }
}

/// The f32 tolerance of each logit of the degree-N program against the degree-1 one.
///
/// The two programs compute the same function; they differ only in the order of their
/// floating-point sums: XLA's partitioner turns each row-parallel matmul (o and down) into N
/// partial dot products and an all-reduce, and compiles every other reduction for other shapes
/// (other blocking, other vectorisation). A sum of `n` f32 terms in any order is within
/// `gamma_n ~ n * u` (u = 2^-24 = EPSILON / 2) of the exact sum, relative to the sum of the
/// terms' magnitudes (Higham, Accuracy and Stability of Numerical Algorithms, 3.1), so two
/// orders differ by at most `n * EPSILON` of it. To first order these errors add along the path
/// to a logit: per layer the q/k/v and gate/up projections (hidden each), the o projection
/// (heads * headDim), the down projection (intermediate), the scores (headDim) and the
/// softmax's two sums over the context; then the LM head (hidden). That total is
/// `accumulation`. The magnitude is the LM head's sum of |terms| for logit v,
/// `sum_h |last_h| |W_vh| <= ||last||_2 ||W_v||_2` (Cauchy-Schwarz), and the final RMSNorm
/// bounds `||last||_2 <= sqrt(hidden) * max |g|` (its normalised vector has norm at most
/// sqrt(hidden)), so `bound_v = sqrt(hidden) * max |g| * ||W_v||_2`, read off the weights. The
/// tolerance is `MARGIN * accumulation * EPSILON * bound_v`; the margin of 4 covers the
/// amplification of an early error by the layers after it (norms and softmax are well
/// conditioned, not contractions). A shard on the wrong device moves logits by O(bound), far
/// past it (checked below). Being a worst case, the bound grows with depth: on the 2-layer
/// fixture the measured errors are ~1e-3 of it, on SmolLM2's 30 layers ~1e-6 (a few 1e-5 on
/// logits up to 25), so there the equal greedy ids are the sharper half of the check.
struct Tolerance {
    accumulation: usize,
    bound: Vec<f64>,
}

const MARGIN: f64 = 4.0;

impl Tolerance {
    fn of(artifact: &Artifact, context: usize) -> Tolerance {
        let m = artifact.manifest();
        let model = &m.model;
        let hidden = model.hidden_size;
        let per_layer = 2 * hidden
            + model.num_heads * model.head_dim
            + model.intermediate_size
            + model.head_dim
            + 2 * context;
        let accumulation = model.num_layers * per_layer + hidden;
        let f32s = |slot: &str| -> Vec<f32> {
            artifact
                .weight_bytes(slot)
                .unwrap()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect()
        };
        let g = f32s("final_norm")
            .iter()
            .fold(0f64, |m, &x| m.max(f64::from(x).abs()));
        let head = if model.tied_embeddings {
            "embed_tokens"
        } else {
            "lm_head"
        };
        let bound = f32s(head)
            .chunks_exact(hidden)
            .map(|row| {
                let norm = row
                    .iter()
                    .map(|&w| f64::from(w).powi(2))
                    .sum::<f64>()
                    .sqrt();
                (hidden as f64).sqrt() * g * norm
            })
            .collect();
        Tolerance {
            accumulation,
            bound,
        }
    }

    /// The largest `|got - want| / tolerance` over the logits (under 1 passes), and where.
    fn worst(&self, got: &[f32], want: &[f32]) -> (f64, usize) {
        let scale = MARGIN * self.accumulation as f64 * f64::from(f32::EPSILON);
        got.iter()
            .zip(want)
            .zip(&self.bound)
            .enumerate()
            .map(|(v, ((&g, &w), &b))| ((f64::from(g) - f64::from(w)).abs() / (scale * b), v))
            .fold((0.0, 0), |best, x| if x.0 > best.0 { x } else { best })
    }
}

/// Runs `prompt` and `steps` greedy steps on the degree-1 artifact `single` and the degree-N
/// artifact `split` on every test plugin, and checks every device's ids and logits.
fn check_against_one_device(single: &Path, split: &Path, prompt: &[i32], steps: usize) {
    check_with_weights_of(single, single, split, prompt, steps);
}

/// [`check_against_one_device`] with the tolerance's magnitudes read from the dense f32
/// artifact `dense` of the same model (a kept-quantized artifact's LM head is blocks, which
/// dequantize exactly to the dense export's f32 values).
fn check_with_weights_of(dense: &Path, single: &Path, split: &Path, prompt: &[i32], steps: usize) {
    let tolerance = Tolerance::of(&Artifact::open(dense).unwrap(), ladder().max_context);
    for plugin in tlaloc_pjrt::testing::test_plugin_paths() {
        let start = Instant::now();
        let mut one = Devices::new(single, &plugin);
        let mut many = Devices::new(split, &plugin);
        let degree = many.degree();
        let want = one.greedy(prompt, steps);
        let got = many.greedy(prompt, steps);
        let want_ids: Vec<i32> = want.iter().map(|s| s[0].next_token).collect();
        let mut worst = (0.0f64, 0usize, 0usize);
        let (mut max_error, mut max_logit) = (0f32, 0f32);
        for (step, (want, got)) in want.iter().zip(&got).enumerate() {
            for (device, out) in got.iter().enumerate() {
                assert_eq!(
                    out.next_token,
                    want[0].next_token,
                    "{}: step {step}, device {device} of {degree}: greedy token differs \
                     (one device: {want_ids:?})",
                    plugin.display()
                );
                let (ratio, v) = tolerance.worst(&out.logits, &want[0].logits);
                assert!(
                    ratio <= 1.0,
                    "{}: step {step}, device {device} of {degree}: logit {v} is {} on {degree} \
                     devices and {} on one, {ratio:.2}x the tolerance",
                    plugin.display(),
                    out.logits[v],
                    want[0].logits[v]
                );
                if ratio > worst.0 {
                    worst = (ratio, step, device);
                }
                for (g, w) in out.logits.iter().zip(&want[0].logits) {
                    max_error = max_error.max((g - w).abs());
                    max_logit = max_logit.max(w.abs());
                }
            }
        }
        eprintln!(
            "{}: degree {degree} matches one device over {} steps: greedy ids {want_ids:?}, \
             max |logit error| {max_error:.2e} (|logits| up to {max_logit:.1}), worst {:.2e} of \
             the tolerance (step {}, device {}; accumulation {}) in {:.2?}",
            plugin.file_name().unwrap().to_string_lossy(),
            want.len(),
            worst.0,
            worst.1,
            worst.2,
            tolerance.accumulation,
            start.elapsed()
        );
    }
}

#[test]
fn tiny_llama_split_over_two_devices_matches_one_device() {
    let checkpoint = support::fixture(TINY);
    let single = export_at(&checkpoint, "tp-tiny-1", &options(1));
    let split = export_at(&checkpoint, "tp-tiny-2", &options(2));
    let prompt = [1, 450, 7010, 310, 3444, 338, 12];
    check_against_one_device(&single, &split, &prompt, 6);

    // The tolerance tells a wrong layout from a reordered sum: the o projection's shards swapped
    // between the devices (each device's heads meet the other's columns) fail it.
    let plugin = tlaloc_pjrt::testing::test_plugin_paths().remove(0);
    let mut one = Devices::new(&single, &plugin);
    let mut many = Devices::new(&split, &plugin);
    many.swap_shards("layers.1.o_proj");
    let tolerance = Tolerance::of(&one.artifact, 128);
    let want = one.greedy(&prompt, 0);
    let got = many.greedy(&prompt, 0);
    let (ratio, _) = tolerance.worst(&got[0][0].logits, &want[0][0].logits);
    assert!(
        ratio > 1.0,
        "swapped o_proj shards passed the tolerance ({ratio:.2}x)"
    );
    eprintln!("swapped o_proj shards: {ratio:.1}x the tolerance");
}

/// int8 K/V pools with their scale pools, both split over the KV heads. Both programs quantize
/// the same rows; a code could differ only where a reordered sum crossed a rounding boundary,
/// outside the f32 tolerance, and this prompt crosses none.
#[test]
fn tiny_llama_with_int8_pools_split_over_two_devices_matches_one_device() {
    let checkpoint = support::fixture(TINY);
    let int8 = |degree| ExportOptions {
        kv_dtype: Some(tlaloc_artifact::Dtype::I8),
        ..options(degree)
    };
    let single = export_at(&checkpoint, "tp-tiny-int8-1", &int8(1));
    let split = export_at(&checkpoint, "tp-tiny-int8-2", &int8(2));
    check_against_one_device(&single, &split, &[1, 450, 7010, 310, 3444, 338, 12], 6);
}

/// "The capital of France is" in SmolLM2's tokenizer.
const CAPITAL: [i32; 5] = [504, 3575, 282, 4649, 314];

/// SmolLM2 exported dense (f32) for one device, once for every test that needs it.
fn smollm2_single() -> &'static Path {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| export_at(&support::smollm2_gguf(), "tp-smollm2-1", &options(1)))
}

#[test]
fn smollm2_split_over_three_devices_matches_one_device() {
    let gguf = support::smollm2_gguf();
    let split = std::thread::scope(|s| {
        s.spawn(smollm2_single);
        export_at(&gguf, "tp-smollm2-3", &options(3))
    });
    check_against_one_device(smollm2_single(), &split, &CAPITAL, 4);
}

/// SmolLM2's Q4_1 matrices kept as blocks: the row-parallel o and down projections split
/// their rows of blocks at whole blocks (576 inputs are 18 blocks, 1536 are 48).
#[test]
fn smollm2_kept_as_blocks_split_over_three_devices_matches_one_device() {
    let gguf = support::smollm2_gguf();
    let kept = |degree| ExportOptions {
        keep_quantized: true,
        ..options(degree)
    };
    let single = export_at(&gguf, "tp-smollm2-q-1", &kept(1));
    let split = export_at(&gguf, "tp-smollm2-q-3", &kept(3));
    let m = Artifact::open(&split).unwrap().manifest().clone();
    let o = m.weight("layers.0.o_proj").unwrap();
    assert!(o.block_format.is_some() && o.split.as_ref().unwrap().axis == 1);
    check_with_weights_of(smollm2_single(), &single, &split, &CAPITAL, 2);
}

/// The layout a degree-2 export writes: the manifest's split axes, fused rows shard-major,
/// every other split weight a plain slice of the one-device weight, and bodies annotated for
/// two partitions (the one-device bodies carry no annotation).
#[test]
fn a_split_export_stores_shards_and_annotates_its_programs() {
    let checkpoint = support::fixture(TINY);
    let single = export_at(&checkpoint, "tp-layout-1", &options(1));
    let split = export_at(&checkpoint, "tp-layout-2", &options(2));
    let one = Artifact::open(&single).unwrap();
    let two = Artifact::open(&split).unwrap();
    two.verify().unwrap();
    let m = two.manifest();
    assert_eq!(m.tensor_parallel_degree(), 2);
    assert_eq!(one.manifest().tensor_parallel, None);
    assert_eq!(m.provenance.options["tensorParallel"], 2);
    let axis = |slot: &str| m.weight(slot).unwrap().split.as_ref().map(|s| s.axis);
    for (slot, expected) in [
        ("embed_tokens", Some(0)),
        ("layers.0.qkv_proj", Some(0)),
        ("layers.0.gate_up_proj", Some(0)),
        ("layers.0.o_proj", Some(1)),
        ("layers.1.down_proj", Some(1)),
        ("layers.0.input_norm", None),
        ("final_norm", None),
        ("rope.cos", None),
    ] {
        assert_eq!(axis(slot), expected, "{slot}");
    }

    let c = &m.model;
    let d = c.head_dim;
    let rows = |bytes: &[u8], width: usize, from: usize, to: usize| {
        bytes[from * width * 4..to * width * 4].to_vec()
    };
    // qkv: shard k is [q heads of k; k heads of k; v heads of k] of the one-device rows.
    let whole = one.weight_bytes("layers.0.qkv_proj").unwrap();
    let (q, kv) = (c.num_heads * d, c.num_kv_heads * d);
    let h = c.hidden_size;
    for k in 0..2 {
        let mut expected = rows(&whole, h, k * q / 2, (k + 1) * q / 2);
        expected.extend(rows(&whole, h, q + k * kv / 2, q + (k + 1) * kv / 2));
        expected.extend(rows(
            &whole,
            h,
            q + kv + k * kv / 2,
            q + kv + (k + 1) * kv / 2,
        ));
        assert_eq!(
            two.weight_shard_bytes("layers.0.qkv_proj", k).unwrap(),
            expected,
            "qkv shard {k}"
        );
    }
    // o: shard k is the columns of heads [k * heads / 2, (k + 1) * heads / 2).
    let whole = one.weight_bytes("layers.0.o_proj").unwrap();
    for k in 0..2 {
        let expected: Vec<u8> = whole
            .chunks(q * 4)
            .flat_map(|row| row[k * q * 2..(k + 1) * q * 2].to_vec())
            .collect();
        assert_eq!(
            two.weight_shard_bytes("layers.0.o_proj", k).unwrap(),
            expected
        );
    }

    let text = |a: &Artifact, kind: &str| {
        let entry = a
            .manifest()
            .entries
            .iter()
            .find(|e| e.name.starts_with(kind))
            .unwrap();
        a.body_text(entry).unwrap()
    };
    let decode = text(&two, "decode");
    assert!(
        decode.starts_with(
            "module @tlaloc_forward attributes {mhlo.num_partitions = 2 : i32, mhlo.num_replicas = 1 : i32} {"
        ),
        "{}",
        &decode[..200]
    );
    // tokenIds, replicated and donated to nextTokenIds (a decode entry).
    let token_ids = format!(
        "%arg0: tensor<1x1xi32> {{mhlo.sharding = \"{{replicated}}\", tf.aliasing_output = {} : i32}} loc(\"tokenIds\")",
        StepOutput::NextTokenIds.index()
    );
    assert!(decode.contains(&token_ids), "{token_ids} missing");
    for annotation in [
        // The embedding, split over the vocabulary.
        "{mhlo.sharding = \"{devices=[2,1]0,1}\"} loc(\"embed_tokens\")",
        // An o projection, over its input features.
        "{mhlo.sharding = \"{devices=[1,2]0,1}\"} loc(\"layers.0.o_proj\")",
    ] {
        assert!(decode.contains(annotation), "{annotation} missing");
    }
    // A pool, over its KV heads, donated to its output after the step outputs.
    let first_pool = format!(
        "{{mhlo.sharding = \"{{devices=[1,1,2,1]0,1}}\", tf.aliasing_output = {} : i32}} loc(\"kPool.0\")",
        StepOutput::ALL.len()
    );
    assert!(decode.contains(&first_pool), "{first_pool} missing");
    for body in [text(&one, "decode"), text(&one, "prefill")] {
        assert!(!body.contains("mhlo."), "a one-device body is annotated");
    }
}

#[test]
fn degrees_a_model_cannot_be_split_by_are_refused_by_name() {
    let refused = |checkpoint: &Path, options: &ExportOptions| -> String {
        let out = support::scratch_dir("tp-refused");
        let err = export(checkpoint, &out, options, &mut |_| {})
            .expect_err("an impossible split was exported");
        assert!(matches!(err, ExportError::TensorParallel(_)), "{err}");
        assert!(!out.exists(), "a refused export wrote {}", out.display());
        err.to_string()
    };
    let gguf = support::smollm2_gguf();
    assert_eq!(
        refused(&gguf, &options(2)),
        "--tensor-parallel 2 refused: the model has 3 KV heads (and 9 attention heads); the \
         degree must divide both (accepted here: 1, 3)"
    );
    let tiny = support::fixture(TINY);
    let text = refused(&tiny, &options(4));
    assert!(
        text.contains("2 KV heads (and 4 attention heads)") && text.contains("accepted here: 1, 2"),
        "{text}"
    );
    let text = refused(&tiny, &options(0));
    assert!(text.contains("--tensor-parallel 0 refused"), "{text}");
    let with_variant = ExportOptions {
        cpu_variant: true,
        ..options(2)
    };
    assert!(refused(&tiny, &with_variant).contains("cpu body variant"));
}
