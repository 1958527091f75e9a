//! Program signatures (`programs/<entry>.json`) and the whole signature an entry must have,
//! [`ProgramSignature::expected_for`] (built from the step contract in [`crate::step`]), used
//! both by the writer (to check each graph before writing it) and by the loader (to refuse a
//! program that disagrees).

use serde::{Deserialize, Serialize};

use crate::dtype::Dtype;
use crate::manifest::{Entry, Manifest};
use crate::step::{PoolOperand, StepInput, StepOutput};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProgramSignature {
    pub entry: String,
    pub inputs: Vec<TensorSpec>,
    pub outputs: Vec<TensorSpec>,
    pub donations: Vec<Donation>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TensorSpec {
    pub name: String,
    pub role: OperandRole,
    pub dtype: Dtype,
    pub dims: Vec<usize>,
}

/// What an operand is to the runtime. In JSON: `{"kind": "weight", "slot": "..."}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase", deny_unknown_fields)]
pub enum OperandRole {
    TokenIds,
    Positions,
    BlockTables,
    SeqLens,
    SlotMapping,
    Weight {
        slot: String,
    },
    KPool {
        layer: usize,
    },
    VPool {
        layer: usize,
    },
    /// The f32 scales beside a quantized K pool.
    KScales {
        layer: usize,
    },
    /// The f32 scales beside a quantized V pool.
    VScales {
        layer: usize,
    },
    Logits,
    NextTokens,
    /// The greedy next token shaped as the next decode step's `tokenIds` (`[B, 1]`), so that
    /// a runtime can feed one step's output to the next on the device.
    NextTokenIds,
    /// The next decode step's `positions`, `seqLens` and `slotMapping`
    /// ([`crate::step::next_decode_row`]).
    NextPositions,
    NextSeqLens,
    NextSlotMapping,
}

/// Input `input` is donated to (aliased with) output `output`; both are operand indices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Donation {
    pub input: usize,
    pub output: usize,
}

/// The first field where a signature differs from the expected one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignatureMismatch {
    /// e.g. `inputs[3] (seqLens).dims`
    pub field: String,
    pub expected: String,
    pub found: String,
}

impl std::fmt::Display for SignatureMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: expected {}, found {}",
            self.field, self.expected, self.found
        )
    }
}

fn spec(name: impl Into<String>, role: OperandRole, dtype: Dtype, dims: Vec<usize>) -> TensorSpec {
    TensorSpec {
        name: name.into(),
        role,
        dtype,
        dims,
    }
}

impl ProgramSignature {
    /// The exact contract signature of `entry` in an artifact described by `manifest`: the
    /// [`StepInput`]s, the weights in manifest order, the pools in [`PoolOperand::all`] order
    /// (`K0, V0, K1, ...`, with each layer's scales after its pools when quantized); then the
    /// [`StepOutput`]s and the pools. Each pool input is donated to its output, and in a
    /// decode entry each carried step input to the output that carries it
    /// ([`StepInput::donated_to`]).
    pub fn expected_for(manifest: &Manifest, entry: &Entry) -> ProgramSignature {
        let point = entry.point();
        let kv = &manifest.kv_cache;

        let mut inputs: Vec<TensorSpec> = StepInput::ALL
            .into_iter()
            .map(|i| {
                spec(
                    i.name(),
                    i.role(),
                    StepInput::DTYPE,
                    i.dims(point, kv.block_size),
                )
            })
            .collect();
        inputs.extend(manifest.weights.iter().map(|w| {
            // A block-quantized weight is its raw blocks; dims its format cannot store are
            // refused by manifest validation, and stated as they are here.
            let (dtype, dims) = w.operand().unwrap_or((w.dtype, w.dims.clone()));
            spec(
                w.slot.clone(),
                OperandRole::Weight {
                    slot: w.slot.clone(),
                },
                dtype,
                dims,
            )
        }));
        let mut outputs: Vec<TensorSpec> = StepOutput::ALL
            .into_iter()
            .map(|o| {
                spec(
                    o.name(),
                    o.role(),
                    o.dtype(),
                    o.dims(point, manifest.model.vocab_size),
                )
            })
            .collect();
        let pools = PoolOperand::all(kv);
        let mut donations: Vec<Donation> = StepInput::ALL
            .into_iter()
            .filter_map(|i| {
                i.donated_to(point).map(|o| Donation {
                    input: i.index(),
                    output: o.index(),
                })
            })
            .collect();
        for pool in pools {
            donations.push(Donation {
                input: inputs.len(),
                output: outputs.len(),
            });
            inputs.push(spec(
                pool.name.clone(),
                pool.role.clone(),
                pool.dtype,
                pool.dims.clone(),
            ));
            outputs.push(spec(pool.name, pool.role, pool.dtype, pool.dims));
        }
        ProgramSignature {
            entry: entry.name.clone(),
            inputs,
            outputs,
            donations,
        }
    }

    /// Compares with `expected` field by field; the first difference is named by its path.
    pub fn check_against(&self, expected: &ProgramSignature) -> Result<(), SignatureMismatch> {
        let mismatch = |field: String, expected: String, found: String| {
            Err(SignatureMismatch {
                field,
                expected,
                found,
            })
        };
        if self.entry != expected.entry {
            return mismatch(
                "entry".into(),
                format!("{:?}", expected.entry),
                format!("{:?}", self.entry),
            );
        }
        for (list, found, wanted) in [
            ("inputs", &self.inputs, &expected.inputs),
            ("outputs", &self.outputs, &expected.outputs),
        ] {
            for (i, (f, w)) in found.iter().zip(wanted.iter()).enumerate() {
                let at = |field: &str| format!("{list}[{i}] ({}).{field}", w.name);
                if f.name != w.name {
                    return mismatch(at("name"), format!("{:?}", w.name), format!("{:?}", f.name));
                }
                if f.role != w.role {
                    return mismatch(at("role"), format!("{:?}", w.role), format!("{:?}", f.role));
                }
                if f.dtype != w.dtype {
                    return mismatch(at("dtype"), w.dtype.to_string(), f.dtype.to_string());
                }
                if f.dims != w.dims {
                    return mismatch(at("dims"), format!("{:?}", w.dims), format!("{:?}", f.dims));
                }
            }
            if found.len() != wanted.len() {
                return mismatch(
                    format!("{list}.length"),
                    wanted.len().to_string(),
                    found.len().to_string(),
                );
            }
        }
        if self.donations != expected.donations {
            return mismatch(
                "donations".into(),
                format!("{:?}", expected.donations),
                format!("{:?}", self.donations),
            );
        }
        Ok(())
    }

    /// Pretty JSON with a trailing newline: the exact bytes of `programs/<entry>.json`.
    pub fn to_json_bytes(&self) -> Result<Vec<u8>, serde_json::Error> {
        crate::paths::pretty_json(self)
    }
}
