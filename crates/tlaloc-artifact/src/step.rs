//! The step contract: the operands every forward program takes before its weights and the
//! results it returns before its pools, each with its name, role, dtype, dims at a ladder point
//! and (for inputs) the value that fills a dead row or token.
//!
//! This is the one description of the contract: [`ProgramSignature::expected_for`] builds
//! signatures from it (the writer checks graphs against them, the loader checks program files),
//! the graph builder declares its arguments by these names, and the runtime lays out step inputs
//! with these padding values.
//!
//! [`ProgramSignature::expected_for`]: crate::ProgramSignature::expected_for

use crate::dtype::Dtype;
use crate::ladder::LadderPoint;
use crate::manifest::KvCacheLayout;
use crate::program::OperandRole;

/// The per-step inputs, in operand order (weights and then the K/V pools follow them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StepInput {
    /// `[B, T]` token ids.
    TokenIds,
    /// `[B, T]` positions of those tokens in their sequences.
    Positions,
    /// `[B, C / blockSize]` the pages of each row's sequence.
    BlockTables,
    /// `[B]` each row's context length after the step.
    SeqLens,
    /// `[B * T]` the pool slot each token's K/V is written to.
    SlotMapping,
}

impl StepInput {
    /// Every step input, in operand order.
    pub const ALL: [StepInput; 5] = [
        StepInput::TokenIds,
        StepInput::Positions,
        StepInput::BlockTables,
        StepInput::SeqLens,
        StepInput::SlotMapping,
    ];

    /// Every step input is an i32 array.
    pub const DTYPE: Dtype = Dtype::I32;

    /// Its operand index (its place in [`StepInput::ALL`]).
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The operand's name in program signatures and StableHLO bodies.
    pub const fn name(self) -> &'static str {
        match self {
            StepInput::TokenIds => "tokenIds",
            StepInput::Positions => "positions",
            StepInput::BlockTables => "blockTables",
            StepInput::SeqLens => "seqLens",
            StepInput::SlotMapping => "slotMapping",
        }
    }

    /// Its role in a program signature.
    pub const fn role(self) -> OperandRole {
        match self {
            StepInput::TokenIds => OperandRole::TokenIds,
            StepInput::Positions => OperandRole::Positions,
            StepInput::BlockTables => OperandRole::BlockTables,
            StepInput::SeqLens => OperandRole::SeqLens,
            StepInput::SlotMapping => OperandRole::SlotMapping,
        }
    }

    /// The step input with `role`, if it is one.
    pub fn from_role(role: &OperandRole) -> Option<StepInput> {
        StepInput::ALL.into_iter().find(|i| i.role() == *role)
    }

    /// Its dims in the entry for `point` of an artifact whose pages hold `block_size` tokens.
    pub fn dims(self, point: LadderPoint, block_size: usize) -> Vec<usize> {
        let (b, t) = (point.batch, point.tokens);
        match self {
            StepInput::TokenIds | StepInput::Positions => vec![b, t],
            StepInput::BlockTables => vec![b, point.context / block_size.max(1)],
            StepInput::SeqLens => vec![b],
            StepInput::SlotMapping => vec![b * t],
        }
    }

    /// The output of a decode step that holds this input of the decode step after it, so that
    /// a chain of decode steps can feed each step from the last on the device. The block
    /// tables have none: a chain's pages are known when it starts, and its first step's block
    /// tables serve every step.
    pub const fn carried_by(self) -> Option<StepOutput> {
        match self {
            StepInput::TokenIds => Some(StepOutput::NextTokenIds),
            StepInput::Positions => Some(StepOutput::NextPositions),
            StepInput::SeqLens => Some(StepOutput::NextSeqLens),
            StepInput::SlotMapping => Some(StepOutput::NextSlotMapping),
            StepInput::BlockTables => None,
        }
    }

    /// The output this input is donated to (its buffer becomes that output's) in the entry
    /// for `point`: in a decode entry (one token per row) every input a decode step carries to
    /// the next ([`StepInput::carried_by`]), whose dims then match; in a prefill entry none.
    /// So a chain that feeds each step from the one before keeps every step operand at one
    /// device address: XLA re-records a program's command buffer whenever an operand moves.
    pub const fn donated_to(self, point: LadderPoint) -> Option<StepOutput> {
        if point.tokens == 1 {
            self.carried_by()
        } else {
            None
        }
    }

    /// The value of a dead row's (or a padding token's) element.
    ///
    /// Block 0 is the scratch page; a sequence length is never 0 (a zero length masks every key
    /// and the softmax becomes 0/0); slot -1 is out of bounds, so the K/V scatter drops it and a
    /// dead token writes nothing.
    pub const fn padding(self) -> i32 {
        match self {
            StepInput::TokenIds | StepInput::Positions | StepInput::BlockTables => 0,
            StepInput::SeqLens => 1,
            StepInput::SlotMapping => -1,
        }
    }
}

/// The per-step results, in output order (the updated K/V pools follow them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StepOutput {
    /// `[B, V]` f32: the last real token's logits of each row.
    Logits,
    /// `[B]` i32: the in-graph greedy next token of each row.
    NextTokens,
    /// `[B, 1]` i32: the same tokens shaped as the next decode step's `tokenIds`, so that a
    /// runtime can feed one step's output to the next on the device.
    NextTokenIds,
    /// `[B, 1]` i32: the `positions` of the decode step that follows this one (same batch and
    /// context bucket). With the next two outputs, a runtime can run a chain of decode steps
    /// with no step input uploaded after the first; [`next_decode_row`] is the rule.
    NextPositions,
    /// `[B]` i32: that decode step's `seqLens`.
    NextSeqLens,
    /// `[B]` i32: that decode step's `slotMapping`.
    NextSlotMapping,
}

impl StepOutput {
    /// Every step output, in output order.
    pub const ALL: [StepOutput; 6] = [
        StepOutput::Logits,
        StepOutput::NextTokens,
        StepOutput::NextTokenIds,
        StepOutput::NextPositions,
        StepOutput::NextSeqLens,
        StepOutput::NextSlotMapping,
    ];

    /// Its output index (its place in [`StepOutput::ALL`]).
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The result's name in program signatures.
    pub const fn name(self) -> &'static str {
        match self {
            StepOutput::Logits => "logits",
            StepOutput::NextTokens => "nextTokens",
            StepOutput::NextTokenIds => "nextTokenIds",
            StepOutput::NextPositions => "nextPositions",
            StepOutput::NextSeqLens => "nextSeqLens",
            StepOutput::NextSlotMapping => "nextSlotMapping",
        }
    }

    /// Its role in a program signature.
    pub const fn role(self) -> OperandRole {
        match self {
            StepOutput::Logits => OperandRole::Logits,
            StepOutput::NextTokens => OperandRole::NextTokens,
            StepOutput::NextTokenIds => OperandRole::NextTokenIds,
            StepOutput::NextPositions => OperandRole::NextPositions,
            StepOutput::NextSeqLens => OperandRole::NextSeqLens,
            StepOutput::NextSlotMapping => OperandRole::NextSlotMapping,
        }
    }

    /// The step output with `role`, if it is one.
    pub fn from_role(role: &OperandRole) -> Option<StepOutput> {
        StepOutput::ALL.into_iter().find(|o| o.role() == *role)
    }

    /// Its dtype.
    pub const fn dtype(self) -> Dtype {
        match self {
            StepOutput::Logits => Dtype::F32,
            StepOutput::NextTokens
            | StepOutput::NextTokenIds
            | StepOutput::NextPositions
            | StepOutput::NextSeqLens
            | StepOutput::NextSlotMapping => Dtype::I32,
        }
    }

    /// Its dims in the entry for `point` of a model with `vocab_size` tokens.
    pub fn dims(self, point: LadderPoint, vocab_size: usize) -> Vec<usize> {
        match self {
            StepOutput::Logits => vec![point.batch, vocab_size],
            StepOutput::NextTokens | StepOutput::NextSeqLens | StepOutput::NextSlotMapping => {
                vec![point.batch]
            }
            StepOutput::NextTokenIds | StepOutput::NextPositions => vec![point.batch, 1],
        }
    }
}

/// One row of the decode step that follows a step, as its `nextPositions`, `nextSeqLens` and
/// `nextSlotMapping` outputs give it: `(position, seqLen, slot)`, from the row's first slot,
/// its `seqLens` and its block table in this step.
///
/// A row is live when its first token's slot is not -1. A live row's next token sits at
/// position `seq_len` (its context after this step), the next step's length is one more, and
/// its slot is the page of `block_table` holding that position plus the offset in the page, or
/// -1 once the position is past the context bucket (`block_table.len() * block_size`). A dead
/// row stays dead: the padding values. So a chain fed this way keeps a row live past the end
/// of its sequence; it writes only at positions past its last token, into its own last page or
/// (past its pages, whose block table entries are padding) the scratch page, and a later step
/// writes each position before any step reads it.
pub fn next_decode_row(
    first_slot: i32,
    seq_len: i32,
    block_table: &[i32],
    block_size: usize,
) -> (i32, i32, i32) {
    if first_slot < 0 {
        return (
            StepInput::Positions.padding(),
            StepInput::SeqLens.padding(),
            StepInput::SlotMapping.padding(),
        );
    }
    let block_size = block_size.max(1);
    let position = seq_len;
    let slot = usize::try_from(position)
        .ok()
        .and_then(|p| Some((block_table.get(p / block_size)?, p % block_size)))
        .map_or(StepInput::SlotMapping.padding(), |(&page, offset)| {
            page * block_size as i32 + offset as i32
        });
    (position, seq_len + 1, slot)
}

/// The names of layer `layer`'s K and V pool operands.
pub fn pool_names(layer: usize) -> [String; 2] {
    [KvPool::K.name(layer), KvPool::V.name(layer)]
}

/// One kind of donated K/V operand of a layer: the K and V pools, and beside quantized pools
/// their scales.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KvPool {
    K,
    V,
    /// `[numBlocks, blockSize, numKvHeads]` f32: the scale of each token's K row per head.
    KScales,
    /// The same for V.
    VScales,
}

impl KvPool {
    /// The operand's name for `layer`, e.g. `kPool.3` or `kScales.3`.
    pub fn name(self, layer: usize) -> String {
        let base = match self {
            KvPool::K => "kPool",
            KvPool::V => "vPool",
            KvPool::KScales => "kScales",
            KvPool::VScales => "vScales",
        };
        format!("{base}.{layer}")
    }

    /// Its role for `layer` in a program signature.
    pub fn role(self, layer: usize) -> OperandRole {
        match self {
            KvPool::K => OperandRole::KPool { layer },
            KvPool::V => OperandRole::VPool { layer },
            KvPool::KScales => OperandRole::KScales { layer },
            KvPool::VScales => OperandRole::VScales { layer },
        }
    }

    /// The kinds every layer of `kv` has, in operand order: K and V, then their scales where
    /// the pools are quantized.
    pub fn kinds(kv: &KvCacheLayout) -> &'static [KvPool] {
        if kv.scales.is_some() {
            &[KvPool::K, KvPool::V, KvPool::KScales, KvPool::VScales]
        } else {
            &[KvPool::K, KvPool::V]
        }
    }
}

/// One donated K/V operand: taken after the weights and returned after the step outputs, in
/// the same order, each input donated to its output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolOperand {
    pub layer: usize,
    pub kind: KvPool,
    pub name: String,
    pub role: OperandRole,
    pub dtype: Dtype,
    pub dims: Vec<usize>,
}

impl PoolOperand {
    /// Every donated K/V operand of `kv` in operand order: per layer `K, V` and, for quantized
    /// pools, `KScales, VScales`. The graph declares them, the signature checks them and the
    /// runtime allocates them from this one list.
    pub fn all(kv: &KvCacheLayout) -> Vec<PoolOperand> {
        let pool_dims = kv.pool_dims();
        let scale_dims = kv.scale_dims();
        let scale_dtype = kv.scales.map_or(Dtype::F32, |s| s.dtype);
        let mut out = Vec::with_capacity(kv.num_layers * KvPool::kinds(kv).len());
        for layer in 0..kv.num_layers {
            for &kind in KvPool::kinds(kv) {
                let (dtype, dims) = match kind {
                    KvPool::K | KvPool::V => (kv.dtype, pool_dims.clone()),
                    KvPool::KScales | KvPool::VScales => (
                        scale_dtype,
                        scale_dims.clone().expect("scale kinds only with scales"),
                    ),
                };
                out.push(PoolOperand {
                    layer,
                    kind,
                    name: kind.name(layer),
                    role: kind.role(layer),
                    dtype,
                    dims,
                });
            }
        }
        out
    }

    /// Bytes of this operand's buffer.
    pub fn byte_length(&self) -> u64 {
        self.dtype
            .byte_length(&self.dims)
            .expect("pool dims validated by the manifest")
    }
}
