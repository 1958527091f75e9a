//! Whether a plugin can run an artifact's K/V pool dtype, found by running a tiny program that
//! uses it before anything else is compiled.
//!
//! i8, bf16 and f32 pools need nothing beyond what every forward program already compiles.
//! fp8 e4m3 (`f8E4M3FN`) is not universal: a plugin may refuse the type, or accept it and
//! compute something else, so the probe converts known values both ways and compares them
//! with their exact e4m3 encodings. A plugin that fails it is refused by name with what would
//! be accepted, instead of failing later inside the first entry's compilation.

use tlaloc_artifact::Dtype;
use tlaloc_pjrt::{Client, CompileOptions, Device, ElementType, ExecuteArg};

/// Takes e4m3 codes and f32 values; returns the codes widened to f32 and the values narrowed
/// to e4m3.
const F8E4M3FN_PROBE: &str = r#"module @tlaloc_fp8_probe {
  func.func public @main(%codes: tensor<4xf8E4M3FN>, %values: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf8E4M3FN>) {
    %0 = stablehlo.convert %codes : (tensor<4xf8E4M3FN>) -> tensor<4xf32>
    %1 = stablehlo.convert %values : (tensor<4xf32>) -> tensor<4xf8E4M3FN>
    return %0, %1 : tensor<4xf32>, tensor<4xf8E4M3FN>
  }
}
"#;

/// e4m3 bit patterns (sign, 4 exponent bits of bias 7, 3 mantissa bits) and their values:
/// 1.0, 448 (the largest), -3.25, 2^-9 (the smallest subnormal).
const PROBE_CODES: [(u8, f32); 4] = [
    (0x38, 1.0),
    (0x7E, 448.0),
    (0xC5, -3.25),
    (0x01, 1.0 / 512.0),
];

/// f32 values and the e4m3 code round-to-nearest-even gives each: 0.1 to 0.1015625
/// (1.625 * 2^-4, `0x1D`; the neighbours are 0.09375 and 0.109375), 3.3 to 3.25 (the
/// neighbours 3.25 and 3.5 are 0.25 apart), -448 and 0 exactly.
const PROBE_VALUES: [(f32, u8); 4] = [(0.1, 0x1D), (3.3, 0x45), (-448.0, 0xFE), (0.0, 0x00)];

/// Why a plugin cannot hold the artifact's pools.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvDtypeRefusal(pub String);

/// Checks that `client` runs `dtype` pools; `Err` says why not.
pub fn probe(
    client: &Client,
    device: &Device,
    dtype: Dtype,
    options: &CompileOptions,
) -> Result<(), KvDtypeRefusal> {
    match dtype {
        Dtype::F8E4M3FN => probe_f8e4m3fn(client, device, options),
        _ => Ok(()),
    }
}

fn probe_f8e4m3fn(
    client: &Client,
    device: &Device,
    options: &CompileOptions,
) -> Result<(), KvDtypeRefusal> {
    let fail = |what: &str, e: tlaloc_pjrt::Error| KvDtypeRefusal(format!("{what}: {e}"));
    let exe = client
        .compile(F8E4M3FN_PROBE, options)
        .map_err(|e| fail("compiling a program with f8E4M3FN", e))?;
    let codes: Vec<u8> = PROBE_CODES.iter().map(|&(bits, _)| bits).collect();
    let values: Vec<f32> = PROBE_VALUES.iter().map(|&(v, _)| v).collect();
    let codes = client
        .buffer_from_host_bytes(&codes, ElementType::F8E4M3FN, &[4], device)
        .map_err(|e| fail("uploading an f8E4M3FN buffer", e))?;
    let values = client
        .buffer_from_host(&values, &[4], device)
        .map_err(|e| fail("uploading the probe values", e))?;
    let outputs = exe
        .execute(vec![
            ExecuteArg::Borrowed(&codes),
            ExecuteArg::Borrowed(&values),
        ])
        .map_err(|e| fail("running a program with f8E4M3FN", e))?;
    let widened: Vec<f32> = outputs[0]
        .to_host_vec()
        .map_err(|e| fail("reading the widened codes", e))?;
    let mut narrowed = [0u8; 4];
    outputs[1]
        .copy_to_host_bytes(&mut narrowed)
        .map_err(|e| fail("reading the narrowed values", e))?;
    for (&(bits, want), got) in PROBE_CODES.iter().zip(&widened) {
        if want.to_bits() != got.to_bits() {
            return Err(KvDtypeRefusal(format!(
                "e4m3 code 0x{bits:02X} widens to {got}, not {want}"
            )));
        }
    }
    for (&(value, want), &got) in PROBE_VALUES.iter().zip(&narrowed) {
        if want != got {
            return Err(KvDtypeRefusal(format!(
                "{value} narrows to e4m3 code 0x{got:02X}, not 0x{want:02X}"
            )));
        }
    }
    Ok(())
}
