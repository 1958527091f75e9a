//! Weight bandwidth of `matmul_xwt` on SmolLM2-135M's projection shapes, at decode row counts.
//!
//! `cargo run --release -p tlaloc-kernels --example matmul_bandwidth [-- --quick] [-- --dtype bf16]`
//!
//! `--quick` measures f32 only; `--dtype` one of `f32`, `bf16`, `q8_0`, `q4_0`, `q4_1`; `--int8`
//! runs `matmul_xwt_int8` (activations rounded to 8-bit codes) on the Q8_0, Q4_0 and Q4_1 shapes;
//! `--rows 1,2,4,8` sets the activation row counts (default 1 and 8).
//!
//! Each shape is measured cold: enough copies of the matrix are cycled through (at least 256 MiB)
//! that every call streams its weights from memory, not from cache, as a decode step does. GB/s
//! counts weight bytes read (activations and outputs are a rounding error). Times are the median of
//! several passes; on a shared machine they move with the neighbours' load. The last table runs a
//! whole decode step's matmuls (30 layers of qkv, o, gate_up, down, then the LM head) from one
//! model-sized set of weights.
//!
//! Two columns make the figures readable on a shared machine: `read GB/s` is a plain streaming sum
//! over 256 MiB (the memory floor a matmul can hope for, measured now), and `cpu` is the share of
//! the cores this process actually got while being timed (on-CPU time of all its threads, from
//! Linux's `/proc/self/task/*/schedstat`, over wall time × threads; blank elsewhere).

use rayon::prelude::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tlaloc_kernels::{KernelError, Matrix, matmul_xwt, matmul_xwt_int8};

/// Set by `--int8`: every call goes to `matmul_xwt_int8`.
static INT8: AtomicBool = AtomicBool::new(false);

fn matmul(
    x: &[f32],
    rows: usize,
    inner: usize,
    w: Matrix<'_>,
    out: usize,
    y: &mut [f32],
) -> Result<(), KernelError> {
    if INT8.load(Ordering::Relaxed) {
        matmul_xwt_int8(x, rows, inner, w, out, y)
    } else {
        matmul_xwt(x, rows, inner, w, out, y)
    }
}

const HIDDEN: usize = 576;
const INTERMEDIATE: usize = 1536;
const KV: usize = 192;
const VOCAB: usize = 49152;
const LAYERS: usize = 30;

/// (name, out, inner)
const SHAPES: [(&str, usize, usize); 5] = [
    ("qkv", HIDDEN + 2 * KV, HIDDEN),
    ("o", HIDDEN, HIDDEN),
    ("gate_up", 2 * INTERMEDIATE, HIDDEN),
    ("down", HIDDEN, INTERMEDIATE),
    ("lm_head", VOCAB, HIDDEN),
];

const COLD_BYTES: usize = 256 << 20;

#[derive(Clone, Copy, PartialEq)]
enum Dtype {
    F32,
    Bf16,
    Q8_0,
    Q4_0,
    Q4_1,
}

impl Dtype {
    fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::Bf16 => "bf16",
            Dtype::Q8_0 => "q8_0",
            Dtype::Q4_0 => "q4_0",
            Dtype::Q4_1 => "q4_1",
        }
    }

    fn bytes(self, out: usize, inner: usize) -> usize {
        match self {
            Dtype::F32 => out * inner * 4,
            Dtype::Bf16 => out * inner * 2,
            Dtype::Q8_0 => out * inner / 32 * 34,
            Dtype::Q4_0 => out * inner / 32 * 18,
            Dtype::Q4_1 => out * inner / 32 * 20,
        }
    }
}

/// One weight matrix's storage.
enum Store {
    F32(Vec<f32>),
    Bf16(Vec<u16>),
    Q8_0(Vec<u8>),
    Q4_0(Vec<u8>),
    Q4_1(Vec<u8>),
}

impl Store {
    fn matrix(&self) -> Matrix<'_> {
        match self {
            Store::F32(v) => Matrix::F32(v),
            Store::Bf16(v) => Matrix::Bf16(v),
            Store::Q8_0(v) => Matrix::Q8_0(v),
            Store::Q4_0(v) => Matrix::Q4_0(v),
            Store::Q4_1(v) => Matrix::Q4_1(v),
        }
    }
}

/// xorshift64*: fills weights fast without a dependency.
struct Fill(u64);

impl Fill {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }

    fn store(&mut self, dtype: Dtype, out: usize, inner: usize) -> Store {
        let n = out * inner;
        match dtype {
            Dtype::F32 => Store::F32((0..n).map(|_| self.unit() * 0.05).collect()),
            Dtype::Bf16 => Store::Bf16(
                (0..n)
                    .map(|_| ((self.unit() * 0.05).to_bits() >> 16) as u16)
                    .collect(),
            ),
            Dtype::Q8_0 => {
                let mut v = Vec::with_capacity(dtype.bytes(out, inner));
                for _ in 0..n / 32 {
                    v.extend_from_slice(&0x1c00u16.to_le_bytes()); // d = 2^-8
                    v.extend((0..32).map(|_| self.next() as u8));
                }
                Store::Q8_0(v)
            }
            Dtype::Q4_0 | Dtype::Q4_1 => {
                let mut v = Vec::with_capacity(dtype.bytes(out, inner));
                for _ in 0..n / 32 {
                    v.extend_from_slice(&0x1c00u16.to_le_bytes()); // d = 2^-8
                    if dtype == Dtype::Q4_1 {
                        v.extend_from_slice(&0xa000u16.to_le_bytes()); // m = -2^-7
                    }
                    v.extend((0..16).map(|_| self.next() as u8));
                }
                if dtype == Dtype::Q4_0 {
                    Store::Q4_0(v)
                } else {
                    Store::Q4_1(v)
                }
            }
        }
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Median time per call over passes through `mats` (each pass calls every matrix once).
fn time_calls(mats: &[Store], rows: usize, out: usize, inner: usize) -> Duration {
    let x: Vec<f32> = (0..rows * inner).map(|i| (i % 7) as f32 * 0.1).collect();
    let mut y = vec![0.0f32; rows * out];
    let mut pass = || {
        let t = Instant::now();
        for m in mats {
            matmul(&x, rows, inner, m.matrix(), out, &mut y).expect("shapes are consistent");
        }
        t.elapsed() / mats.len() as u32
    };
    pass();
    let first = pass();
    // About 0.2 s of passes, at least 5.
    let passes = ((0.2 / (first.as_secs_f64() * mats.len() as f64)) as usize).clamp(5, 200);
    median((0..passes).map(|_| pass()).collect())
}

/// On-CPU nanoseconds of every thread of this process so far (Linux), or `None`.
fn cpu_ns() -> Option<u64> {
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
        total += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(total)
}

/// Runs `f`, returning its result and the share of `threads` cores this process was on.
fn with_cpu_share<T>(threads: usize, f: impl FnOnce() -> T) -> (T, String) {
    let (c0, t0) = (cpu_ns(), Instant::now());
    let r = f();
    let wall = t0.elapsed().as_nanos() as f64;
    let share = match (c0, cpu_ns()) {
        (Some(a), Some(b)) => format!("{:>3.0}%", (b - a) as f64 / (wall * threads as f64) * 100.0),
        _ => "   -".to_string(),
    };
    (r, share)
}

/// Streaming read of `buf` (sum, 16 independent lanes), GB/s, median of 5.
fn read_gbps(buf: &[f32]) -> f64 {
    fn sum(c: &[f32]) -> f32 {
        let mut acc = [0.0f32; 16];
        for blk in c.chunks_exact(16) {
            for (a, v) in acc.iter_mut().zip(blk) {
                *a += v;
            }
        }
        acc.iter().sum()
    }
    let t = median(
        (0..5)
            .map(|_| {
                let t = Instant::now();
                let s: f32 = buf.par_chunks(1 << 18).map(sum).sum();
                std::hint::black_box(s);
                t.elapsed()
            })
            .collect(),
    );
    gbps(size_of_val(buf), t)
}

fn gbps(bytes: usize, t: Duration) -> f64 {
    bytes as f64 / t.as_secs_f64() / 1e9
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let threads = rayon::current_num_threads();
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("a one-thread pool");
    let args: Vec<String> = std::env::args().collect();
    let only = args
        .iter()
        .position(|a| a == "--dtype")
        .and_then(|i| args.get(i + 1));
    let all = [
        Dtype::F32,
        Dtype::Bf16,
        Dtype::Q8_0,
        Dtype::Q4_0,
        Dtype::Q4_1,
    ];
    let int8 = args.iter().any(|a| a == "--int8");
    let row_counts: Vec<usize> = match args.iter().position(|a| a == "--rows") {
        Some(i) => args
            .get(i + 1)
            .expect("--rows takes a list, e.g. 1,2,4,8")
            .split(',')
            .map(|r| r.parse().expect("--rows takes row counts, e.g. 1,2,4,8"))
            .collect(),
        None => vec![1, 8],
    };
    INT8.store(int8, Ordering::Relaxed);
    let mut dtypes: Vec<Dtype> = match only {
        Some(name) => all.into_iter().filter(|d| d.name() == name).collect(),
        None if quick => vec![Dtype::F32],
        None => all.to_vec(),
    };
    if int8 {
        dtypes.retain(|d| matches!(d, Dtype::Q8_0 | Dtype::Q4_0 | Dtype::Q4_1));
    }
    assert!(
        !dtypes.is_empty(),
        "--dtype takes f32, bf16, q8_0, q4_0 or q4_1"
    );
    let mut fill = Fill(0x9e37_79b9_7f4a_7c15);

    let buf: Vec<f32> = (0..COLD_BYTES / 4).map(|i| (i % 3) as f32).collect();
    let (read_all, cpu_all) = with_cpu_share(threads, || read_gbps(&buf));
    let (read_one, cpu_one) = with_cpu_share(1, || one.install(|| read_gbps(&buf)));
    drop(buf);
    println!(
        "streaming read of {} MiB: {read_all:.1} GB/s on {threads} threads (cpu {cpu_all}), \
         {read_one:.1} GB/s on 1 thread (cpu {cpu_one})",
        COLD_BYTES >> 20
    );
    println!();
    println!(
        "per call, cold weights (>= {} MiB cycled)",
        COLD_BYTES >> 20
    );
    println!(
        "{:<5} {:<8} {:>13} {:>4} | {:>9} {:>7} {:>4} ({threads} threads) | {:>9} {:>7} {:>4} (1 thread)",
        "dtype", "matrix", "[out, inner]", "rows", "ms", "GB/s", "cpu", "ms", "GB/s", "cpu"
    );
    for &dtype in &dtypes {
        for &(name, out, inner) in &SHAPES {
            let bytes = dtype.bytes(out, inner);
            let copies = COLD_BYTES.div_ceil(bytes).max(2);
            let mats: Vec<Store> = (0..copies).map(|_| fill.store(dtype, out, inner)).collect();
            for &rows in &row_counts {
                let (t_all, cpu_all) =
                    with_cpu_share(threads, || time_calls(&mats, rows, out, inner));
                let (t_one, cpu_one) =
                    with_cpu_share(1, || one.install(|| time_calls(&mats, rows, out, inner)));
                println!(
                    "{:<5} {:<8} {:>13} {:>4} | {:>9.3} {:>7.1} {}              | {:>9.3} {:>7.1} {}",
                    dtype.name(),
                    name,
                    format!("[{out}, {inner}]"),
                    rows,
                    t_all.as_secs_f64() * 1e3,
                    gbps(bytes, t_all),
                    cpu_all,
                    t_one.as_secs_f64() * 1e3,
                    gbps(bytes, t_one),
                    cpu_one,
                );
            }
        }
    }

    println!();
    println!(
        "one decode step's matmuls ({LAYERS} layers + LM head, weights from one model-sized set)"
    );
    println!(
        "{:<5} {:>9} {:>4} | {:>9} {:>7} {:>4} ({threads} threads)",
        "dtype", "MB", "rows", "ms/step", "GB/s", "cpu"
    );
    for &dtype in &dtypes {
        let mut layers = Vec::with_capacity(LAYERS * 4);
        for _ in 0..LAYERS {
            for &(_, out, inner) in &SHAPES[..4] {
                layers.push((fill.store(dtype, out, inner), out, inner));
            }
        }
        layers.push((fill.store(dtype, VOCAB, HIDDEN), VOCAB, HIDDEN));
        let bytes: usize = layers.iter().map(|(_, o, i)| dtype.bytes(*o, *i)).sum();
        for &rows in &row_counts {
            let xs: Vec<f32> = (0..rows * INTERMEDIATE).map(|i| (i % 5) as f32).collect();
            let mut ys = vec![0.0f32; rows * VOCAB];
            let mut step = || {
                let t = Instant::now();
                for (m, out, inner) in &layers {
                    let (x, y) = (&xs[..rows * inner], &mut ys[..rows * out]);
                    matmul(x, rows, *inner, m.matrix(), *out, y).expect("consistent");
                }
                t.elapsed()
            };
            step();
            let steps = if quick { 5 } else { 15 };
            let (t, cpu) = with_cpu_share(threads, || median((0..steps).map(|_| step()).collect()));
            println!(
                "{:<5} {:>9.1} {:>4} | {:>9.2} {:>7.1} {}",
                dtype.name(),
                bytes as f64 / 1e6,
                rows,
                t.as_secs_f64() * 1e3,
                gbps(bytes, t),
                cpu
            );
        }
    }
}
