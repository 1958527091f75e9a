//! `tlaloc bench`: start-up time, prefill time, steady-state decode time per step and tokens/s
//! for each batch size, each as a ratio to the bytes-per-step floor of SPEC.md section 8.
//!
//! For a batch of B, after an untimed warm-up run of the same shapes, B requests of seeded
//! random prompt ids are submitted at once, each ignoring end-of-sequence and asking for exactly
//! `gen-len` tokens. The decode window opens when the last of them has its first token (all B
//! prefilled) and closes when the first one finishes, so every decode step inside it carries all
//! B rows; the engine's cumulative step counters and clock, stamped by the engine at both
//! moments, give the steps, rows, wall time and host-time split of the window.
//!
//! The floor is (weight bytes + K/V bytes of every row at the window's mean context) divided by
//! a bandwidth: `--bandwidth-gbps` when the caller measured one, else, on a CPU plugin, a host
//! memcpy over all cores timed here (counting bytes read plus bytes written).

use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use clap::Args;
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};
use serde_json::{Value, json};
use tlaloc_runtime::{
    CompileMode, EngineHandle, GenerateRequest, StepMark, StepMarks, StepTimings, TokenEvent,
};

use crate::cmd::generate::{EngineArgs, load_json, ms, split_json};

/// Arguments of `tlaloc bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(flatten)]
    engine: EngineArgs,
    /// Batch sizes to measure, comma-separated (each at most the artifact's largest decode batch).
    #[arg(long, value_delimiter = ',', default_value = "1,8")]
    batch: Vec<usize>,
    /// Prompt tokens per request.
    #[arg(long, default_value_t = 128)]
    prompt_len: usize,
    /// Generated tokens per request.
    #[arg(long, default_value_t = 64)]
    gen_len: usize,
    /// Memory bandwidth for the floor, in GB/s (measured by the caller); default: a host memcpy
    /// measured here, on CPU plugins only.
    #[arg(long)]
    bandwidth_gbps: Option<f64>,
    /// Seed of the random prompt ids.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Compile each entry on first use instead of at start (then the ready time has no compile).
    #[arg(long)]
    lazy_compile: bool,
    /// Measure each batch's first run (by default an untimed run of the same shapes goes
    /// first, so that first-execution costs and lazy compiles stay out of the numbers).
    #[arg(long)]
    no_warmup: bool,
    /// Print one JSON document instead of a table.
    #[arg(long)]
    json: bool,
}

/// Where the floor's bandwidth came from.
#[derive(Debug, Clone)]
struct Bandwidth {
    gbps: f64,
    source: String,
}

/// One batch's measurements.
#[derive(Debug)]
struct BatchResult {
    batch: usize,
    prefill_steps: u64,
    prefill_tokens: u64,
    prefill_time: StepTimings,
    all_prefilled: Duration,
    decode_steps: u64,
    decode_chained_steps: u64,
    decode_rows: u64,
    decode_time: StepTimings,
    decode_wall: Duration,
    mean_context: usize,
    floor_bytes: u64,
    total: Duration,
}

impl BatchResult {
    fn decode_wall_ms_per_step(&self) -> f64 {
        ms(self.decode_wall) / self.decode_steps.max(1) as f64
    }

    fn decode_host_ms_per_step(&self) -> f64 {
        ms(self.decode_time.total()) / self.decode_steps.max(1) as f64
    }

    fn tokens_per_s(&self) -> f64 {
        self.decode_rows as f64 / self.decode_wall.as_secs_f64().max(1e-9)
    }

    fn floor_ms(&self, bandwidth: &Bandwidth) -> f64 {
        self.floor_bytes as f64 / (bandwidth.gbps * 1e9) * 1e3
    }
}

fn sub(a: StepTimings, b: StepTimings) -> StepTimings {
    StepTimings {
        build: a.build.saturating_sub(b.build),
        upload: a.upload.saturating_sub(b.upload),
        execute: a.execute.saturating_sub(b.execute),
        readback: a.readback.saturating_sub(b.readback),
        other: a.other.saturating_sub(b.other),
    }
}

/// Best of a few multi-threaded copies of a buffer much larger than any cache, in GB/s of
/// bytes read plus bytes written.
fn measure_copy_bandwidth() -> Bandwidth {
    const BYTES: usize = 512 << 20;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let source = vec![1u8; BYTES];
    let mut target = vec![0u8; BYTES];
    let chunk = BYTES.div_ceil(threads);
    let mut best = Duration::MAX;
    for _ in 0..6 {
        let started = Instant::now();
        std::thread::scope(|scope| {
            for (to, from) in target.chunks_mut(chunk).zip(source.chunks(chunk)) {
                scope.spawn(move || to.copy_from_slice(from));
            }
        });
        best = best.min(started.elapsed());
    }
    std::hint::black_box(&target);
    Bandwidth {
        gbps: 2.0 * BYTES as f64 / best.as_secs_f64() / 1e9,
        source: format!(
            "host memcpy measured here ({threads} threads, {} MiB, best of 6, read + write bytes)",
            BYTES >> 20
        ),
    }
}

/// Runs `tlaloc bench`.
pub fn run(args: BenchArgs) -> Result<()> {
    let started = Instant::now();
    let compile = if args.lazy_compile {
        CompileMode::Lazy
    } else {
        CompileMode::Eager
    };
    let engine = args.engine.start(compile)?;
    let ready = started.elapsed();
    let outcome = measure(&args, &engine, ready);
    engine.shutdown();
    outcome
}

fn measure(args: &BenchArgs, engine: &EngineHandle, ready: Duration) -> Result<()> {
    let shape = engine.shape().clone();
    let max_batch = shape.ladder.max_decode_batch();
    if args.prompt_len == 0 || args.gen_len < 2 {
        bail!(
            "--prompt-len {} / --gen-len {} refused: a prompt needs at least 1 token and a decode window at least 2 generated tokens",
            args.prompt_len,
            args.gen_len
        );
    }
    let pages_per_sequence = (args.prompt_len + args.gen_len).div_ceil(shape.block_size);
    for &b in &args.batch {
        if b == 0 || b > max_batch {
            bail!(
                "--batch {b} refused: the artifact decodes 1 to {max_batch} rows per step; export with a larger --max-batch"
            );
        }
        if b * pages_per_sequence > shape.allocatable_pages() {
            bail!(
                "--batch {b} refused: {b} sequences of {} tokens need {} K/V pages but the pool has {}; they would preempt each other. Export with more blocks or lower --prompt-len/--gen-len",
                args.prompt_len + args.gen_len,
                b * pages_per_sequence,
                shape.allocatable_pages()
            );
        }
    }
    let platform = engine.platform();
    let is_cpu = platform.is_some_and(|p| p.identity.platform_name.eq_ignore_ascii_case("cpu"));
    let bandwidth = match (args.bandwidth_gbps, is_cpu) {
        (Some(gbps), _) if gbps > 0.0 && gbps.is_finite() => Some(Bandwidth {
            gbps,
            source: "given with --bandwidth-gbps".into(),
        }),
        (Some(gbps), _) => bail!("--bandwidth-gbps {gbps} refused: give a positive number"),
        (None, true) => Some(measure_copy_bandwidth()),
        (None, false) => None,
    };

    let mut results = Vec::new();
    for &b in &args.batch {
        if !args.no_warmup {
            warm_up(engine, args, b)?;
        }
        results.push(run_batch(engine, args, b)?);
    }

    let cache_enabled = !args.engine.no_compile_cache;
    let load = load_json(engine.load_timings(), cache_enabled);
    if args.json {
        let batches: Vec<Value> = results
            .iter()
            .map(|r| batch_json(r, args, bandwidth.as_ref()))
            .collect();
        let doc = json!({
            "artifact": args.engine.artifact.display().to_string(),
            "plugin": platform.map(|p| p.plugin_path.display().to_string()),
            "platform": platform.map(|p| p.identity.platform_name.clone()),
            "device_kind": platform.map(|p| p.identity.device_kind.clone()),
            "ready_ms": ms(ready),
            "load": load,
            "compile_mode": if args.lazy_compile { "lazy" } else { "eager" },
            "weight_bytes": shape.weight_bytes,
            "kv_bytes_per_token": shape.kv_bytes_per_token,
            "bandwidth_gbps": bandwidth.as_ref().map(|b| b.gbps),
            "bandwidth_source": bandwidth.as_ref().map(|b| b.source.clone()),
            "batches": batches,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        print_table(args, engine, ready, &load, bandwidth.as_ref(), &results);
    }
    Ok(())
}

fn random_prompt(rng: &mut ChaCha8Rng, len: usize, vocab: usize) -> Vec<u32> {
    (0..len)
        .map(|_| (rng.next_u64() % vocab as u64) as u32)
        .collect()
}

/// Runs `batch` requests of the measured prompt length for a few tokens, untimed, on the
/// entries the measurement will use.
fn warm_up(engine: &EngineHandle, args: &BenchArgs, batch: usize) -> Result<()> {
    let mut rng = ChaCha8Rng::seed_from_u64(!args.seed);
    let streams = (0..batch)
        .map(|_| {
            let prompt = random_prompt(&mut rng, args.prompt_len, engine.shape().vocab_size);
            let mut request = GenerateRequest::greedy(prompt, args.gen_len.min(batch + 2));
            request.ignore_eos = true;
            Ok(engine.submit(request)?.1)
        })
        .collect::<Result<Vec<_>>>()?;
    for mut events in streams {
        while let Some(event) = events.blocking_recv() {
            match event {
                TokenEvent::Token { .. } => {}
                TokenEvent::Finished { .. } => break,
                TokenEvent::Error { message } => {
                    bail!("batch {batch}: a warm-up request failed: {message}")
                }
            }
        }
    }
    Ok(())
}

fn run_batch(engine: &EngineHandle, args: &BenchArgs, batch: usize) -> Result<BatchResult> {
    let shape = engine.shape();
    let mut rng = ChaCha8Rng::seed_from_u64(args.seed ^ (batch as u64).rotate_left(32));
    let before = engine.stats();
    if before.running + before.waiting != 0 {
        bail!("the engine is busy: {before:?}");
    }
    let started = Instant::now();
    // Each listener reports its request's engine-side marks; the window is cut at those, not
    // at when a listener thread happened to run (on a loaded machine it runs late, and its
    // sample of the counts would take in steps after the window).
    let (marks_tx, marks_rx) = mpsc::channel::<Result<StepMarks, String>>();
    let mut listeners = Vec::with_capacity(batch);
    for _ in 0..batch {
        let mut request = GenerateRequest::greedy(
            random_prompt(&mut rng, args.prompt_len, shape.vocab_size),
            args.gen_len,
        );
        request.ignore_eos = true;
        let (_, mut events) = engine.submit(request)?;
        let marks = marks_tx.clone();
        listeners.push(std::thread::spawn(move || {
            while let Some(event) = events.blocking_recv() {
                match event {
                    TokenEvent::Token { .. } => {}
                    TokenEvent::Finished { marks: m, .. } => {
                        let _ = marks.send(Ok(*m));
                        return;
                    }
                    TokenEvent::Error { message } => {
                        let _ = marks.send(Err(message));
                        return;
                    }
                }
            }
            let _ = marks.send(Err("the stream ended early".into()));
        }));
    }
    drop(marks_tx);

    let mut window_start: Option<StepMark> = None;
    let mut window_end: Option<StepMark> = None;
    for marks in marks_rx {
        let marks =
            marks.map_err(|message| anyhow!("batch {batch}: a request failed: {message}"))?;
        let Some(first) = marks.first_token else {
            bail!("batch {batch}: a request finished without a token");
        };
        // The window opens at the last first token (every row prefilled) and closes at the
        // first finish.
        if window_start.is_none_or(|s| first.steps.decode_steps > s.steps.decode_steps) {
            window_start = Some(first);
        }
        if window_end.is_none_or(|e| marks.finished.steps.decode_steps < e.steps.decode_steps) {
            window_end = Some(marks.finished);
        }
    }
    for listener in listeners {
        let _ = listener.join();
    }
    let total = started.elapsed();
    let (
        Some(StepMark {
            at: start_at,
            steps: start,
        }),
        Some(StepMark {
            at: end_at,
            steps: end,
        }),
    ) = (window_start, window_end)
    else {
        bail!("batch {batch}: no request finished; no decode window");
    };
    if end.decode_steps <= start.decode_steps {
        bail!(
            "batch {batch}: no decode step ran with all {batch} rows (the first request finished while the last was still in prefill); raise --gen-len"
        );
    }
    let after = engine.stats();
    let mean_context = args.prompt_len + args.gen_len / 2;
    Ok(BatchResult {
        batch,
        prefill_steps: after.steps.prefill_steps - before.steps.prefill_steps,
        prefill_tokens: after.steps.prefill_tokens - before.steps.prefill_tokens,
        prefill_time: sub(after.steps.prefill_time, before.steps.prefill_time),
        all_prefilled: start_at - started,
        decode_steps: end.decode_steps - start.decode_steps,
        decode_chained_steps: end.decode_chained_steps - start.decode_chained_steps,
        decode_rows: end.decode_rows - start.decode_rows,
        decode_time: sub(end.decode_time, start.decode_time),
        decode_wall: end_at.saturating_duration_since(start_at),
        mean_context,
        floor_bytes: shape.decode_floor_bytes(&vec![mean_context; batch]),
        total,
    })
}

fn batch_json(r: &BatchResult, args: &BenchArgs, bandwidth: Option<&Bandwidth>) -> Value {
    let floor_ms = bandwidth.map(|b| r.floor_ms(b));
    json!({
        "batch": r.batch,
        "prompt_len": args.prompt_len,
        "gen_len": args.gen_len,
        "prefill": {
            "steps": r.prefill_steps,
            "tokens": r.prefill_tokens,
            "ms_total": ms(r.prefill_time.total()),
            "ms_per_prompt": ms(r.prefill_time.total()) / r.batch as f64,
            "tokens_per_s": r.prefill_tokens as f64 / r.prefill_time.total().as_secs_f64().max(1e-9),
            "split_per_step": split_json(r.prefill_time, r.prefill_steps),
            "wall_ms_until_all_prefilled": ms(r.all_prefilled),
        },
        "decode": {
            "steps": r.decode_steps,
            "chained_steps": r.decode_chained_steps,
            "rows_per_step": r.decode_rows as f64 / r.decode_steps.max(1) as f64,
            "wall_ms_per_step": r.decode_wall_ms_per_step(),
            "host_ms_per_step": r.decode_host_ms_per_step(),
            "split_per_step": split_json(r.decode_time, r.decode_steps),
            "tokens_per_s": r.tokens_per_s(),
            "mean_context": r.mean_context,
            "floor_bytes": r.floor_bytes,
            "floor_ms": floor_ms,
            "ratio_to_floor": floor_ms.map(|f| r.decode_wall_ms_per_step() / f),
        },
        "total_ms": ms(r.total),
    })
}

fn print_table(
    args: &BenchArgs,
    engine: &EngineHandle,
    ready: Duration,
    load: &Value,
    bandwidth: Option<&Bandwidth>,
    results: &[BatchResult],
) {
    let shape = engine.shape();
    println!("artifact  {}", args.engine.artifact.display());
    if let Some(p) = engine.platform() {
        println!(
            "plugin    {} ({}, device {})",
            p.plugin_path.display(),
            p.identity.platform_name,
            p.identity.device_kind
        );
    }
    println!(
        "ready     {:.0} ms from the start of the command (load {:.0} ms, of which compile {:.0} ms: {} compiled, {} from the cache, {} from the artifact; compile cache {})",
        ms(ready),
        load["total_ms"].as_f64().unwrap_or(0.0),
        load["compile_ms"].as_f64().unwrap_or(0.0),
        load["compiled"],
        load["cache_hits"],
        load["from_artifact"],
        load["compile_cache"].as_str().unwrap_or("?"),
    );
    for key in ["executables", "bodies"] {
        if let Some(line) = load[key].as_str() {
            println!("          {line}");
        }
    }
    match bandwidth {
        Some(b) => println!("bandwidth {:.1} GB/s, {}", b.gbps, b.source),
        None => {
            println!("bandwidth unknown (not a CPU plugin): pass --bandwidth-gbps for the floor")
        }
    }
    println!(
        "floor     (weights {:.1} MB + K/V {} bytes/token x rows x mean context) / bandwidth",
        shape.weight_bytes as f64 / 1e6,
        shape.kv_bytes_per_token
    );
    println!(
        "prompts   {} random ids each (seed {}), {} generated tokens each, end-of-sequence ignored",
        args.prompt_len, args.seed, args.gen_len
    );
    println!();
    println!(
        "{:>5} {:>11} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} | per decode step ms: {:>6} {:>6} {:>8} {:>8} {:>6}",
        "batch",
        "prefill ms",
        "decode ms",
        "host ms",
        "tokens/s",
        "floor ms",
        "x floor",
        "rows",
        "build",
        "upload",
        "execute",
        "readback",
        "other",
    );
    for r in results {
        let floor = bandwidth.map(|b| r.floor_ms(b));
        let per = |d: Duration| ms(d) / r.decode_steps.max(1) as f64;
        println!(
            "{:>5} {:>11.1} {:>9.2} {:>9.2} {:>9.1} {:>9} {:>9} {:>8.2} | {:>26.3} {:>6.3} {:>8.3} {:>8.3} {:>6.3}",
            r.batch,
            ms(r.prefill_time.total()) / r.batch as f64,
            r.decode_wall_ms_per_step(),
            r.decode_host_ms_per_step(),
            r.tokens_per_s(),
            floor.map_or("-".into(), |f| format!("{f:.2}")),
            floor.map_or("-".into(), |f| format!(
                "{:.2}",
                r.decode_wall_ms_per_step() / f
            )),
            r.decode_rows as f64 / r.decode_steps.max(1) as f64,
            per(r.decode_time.build),
            per(r.decode_time.upload),
            per(r.decode_time.execute),
            per(r.decode_time.readback),
            per(r.decode_time.other),
        );
    }
    println!();
    println!(
        "prefill ms: per prompt (step time); decode ms: wall time per step with all rows decoding; host ms: the same steps as the engine times them (build + upload + execute + readback + other)"
    );
}
