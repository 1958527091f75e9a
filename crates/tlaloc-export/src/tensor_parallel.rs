//! Tensor parallelism at export (`--tensor-parallel N`): which weights split over which
//! dimension, the row order of the fused projections, and the refusal of a degree the model
//! cannot be split by evenly.
//!
//! The split is Megatron's: the q/k/v and gate/up projections (and their biases) over their
//! output features (column-parallel: each device computes its own heads and its own part of the
//! MLP's hidden layer with no communication), the o and down projections over their input
//! features (row-parallel: each device's partial product, summed by one all-reduce), the
//! embedding and the LM head over the vocabulary; norms, the q/k norm, the o and down biases
//! (added after the sum) and the RoPE tables are replicated. The K/V pools split over their KV
//! heads, which the column split of k and v produces on each device. XLA's SPMD partitioner
//! derives every other layout from these and inserts the collectives; the program keeps its
//! global shapes.
//!
//! A fused slot holds the rows of several checkpoint tensors (`[q; k; v]`, `[gate; up]`). Split
//! as stored, device 0 would get all of q and device 1 the rest, and every head would cross
//! devices. So a fused slot split over N devices is written **shard-major**: the rows of shard
//! `k` are shard `k` of each tensor in turn (`[q_k; k_k; v_k]`, `[gate_k; up_k]`), and the
//! graph reads the fused output as `[N, parts...]` (see `graph`). For N = 1 shard-major is the
//! plain concatenation, so single-device exports are unchanged.

use std::fmt;

use tlaloc_artifact::tensor_parallel::shard_dims;

use crate::checkpoint::{LayerRole, TensorRole};
use crate::graph::{SlotSource, WeightPlan, WeightSlot};

/// Why a tensor-parallel degree was refused; each names what does not split.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TensorParallelError {
    #[error(
        "--tensor-parallel 0 refused: the degree is the number of devices the model runs on, at least 1"
    )]
    Zero,
    #[error(
        "--tensor-parallel {degree} refused with the cpu body variant: its host kernels run on one device; export without --variants cpu"
    )]
    CpuVariant { degree: usize },
    #[error(
        "--tensor-parallel {degree} refused: the model has {kv_heads} KV heads (and {heads} attention heads); the degree must divide both (accepted here: {accepted})"
    )]
    Heads {
        degree: usize,
        kv_heads: usize,
        heads: usize,
        accepted: Degrees,
    },
    #[error(
        "--tensor-parallel {degree} refused: the MLP's intermediate size {intermediate} does not split into {degree} equal parts (accepted here: {accepted})"
    )]
    Intermediate {
        degree: usize,
        intermediate: usize,
        accepted: Degrees,
    },
    #[error(
        "--tensor-parallel {degree} refused: the vocabulary of {vocab} tokens, over which the embedding and the LM head are split, does not split into {degree} equal parts (accepted here: {accepted})"
    )]
    Vocab {
        degree: usize,
        vocab: usize,
        accepted: Degrees,
    },
    #[error(
        "--tensor-parallel {degree} refused: weight {slot} is kept as blocks and does not split along dimension {axis} into {degree} whole-block parts: {reason} (accepted here: {accepted})"
    )]
    Blocks {
        degree: usize,
        slot: String,
        axis: usize,
        reason: String,
        accepted: Degrees,
    },
}

/// A list of degrees, printed `1, 3`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Degrees(pub Vec<usize>);

impl fmt::Display for Degrees {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(|d| d.to_string()).collect();
        f.write_str(&parts.join(", "))
    }
}

/// The dimension of `slot` split over the devices, or `None` for a replicated slot.
pub fn split_axis(slot: &WeightSlot) -> Option<usize> {
    use LayerRole::*;
    let SlotSource::Rows(roles) = &slot.source else {
        return None;
    };
    match roles.first()? {
        TensorRole::Embedding | TensorRole::LmHead => Some(0),
        TensorRole::Layer(_, Q | QBias | Gate | GateBias) => Some(0),
        TensorRole::Layer(_, O | Down) => Some(1),
        _ => None,
    }
}

/// The first reason `plan`'s model does not split over `degree` devices, given the degrees
/// that would be accepted.
fn refusal(plan: &WeightPlan, degree: usize, accepted: &Degrees) -> Option<TensorParallelError> {
    let c = &plan.config;
    let accepted = accepted.clone();
    if c.num_key_value_heads % degree != 0 || c.num_attention_heads % degree != 0 {
        return Some(TensorParallelError::Heads {
            degree,
            kv_heads: c.num_key_value_heads,
            heads: c.num_attention_heads,
            accepted,
        });
    }
    if c.intermediate_size % degree != 0 {
        return Some(TensorParallelError::Intermediate {
            degree,
            intermediate: c.intermediate_size,
            accepted,
        });
    }
    if c.vocab_size % degree != 0 {
        return Some(TensorParallelError::Vocab {
            degree,
            vocab: c.vocab_size,
            accepted,
        });
    }
    for slot in &plan.slots {
        if let (Some(axis), Some(format)) = (split_axis(slot), slot.block)
            && let Err(reason) = shard_dims(&slot.dims, Some(format), axis, degree)
        {
            return Some(TensorParallelError::Blocks {
                degree,
                slot: slot.name.clone(),
                axis,
                reason,
                accepted,
            });
        }
    }
    None
}

/// Splits `plan` over `degree` devices: refuses a degree the model does not split by evenly,
/// naming what does not and the degrees that would do, and otherwise marks each slot's split
/// axis. Degree 1 changes nothing.
pub fn apply(plan: &mut WeightPlan, degree: usize) -> Result<(), TensorParallelError> {
    if degree == 0 {
        return Err(TensorParallelError::Zero);
    }
    if degree == 1 {
        return Ok(());
    }
    let none = Degrees(Vec::new());
    let accepted = Degrees(
        (1..=plan.config.num_key_value_heads)
            .filter(|&d| refusal(plan, d, &none).is_none())
            .collect(),
    );
    if let Some(refused) = refusal(plan, degree, &accepted) {
        return Err(refused);
    }
    plan.tensor_parallel = degree;
    for slot in &mut plan.slots {
        slot.split = split_axis(slot);
    }
    Ok(())
}

/// The rows of a fused slot's tensors (`parts`, each its own rows in order, of one row width)
/// in shard-major order for `degree` devices: shard `k` of every part in turn, for each `k`.
/// With one part or degree 1 it is the plain concatenation. Every part's length divides by
/// `degree` (whole rows per shard: checked by [`apply`]).
pub fn shard_major<T: Copy>(parts: &[Vec<T>], degree: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(parts.iter().map(Vec::len).sum());
    for k in 0..degree {
        for part in parts {
            let piece = part.len() / degree;
            out.extend_from_slice(&part[k * piece..(k + 1) * piece]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fused_rows_are_written_shard_by_shard() {
        let q = vec![1, 2, 3, 4];
        let k = vec![5, 6];
        let v = vec![7, 8];
        let parts = [q, k, v];
        assert_eq!(shard_major(&parts, 1), [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(shard_major(&parts, 2), [1, 2, 5, 7, 3, 4, 6, 8]);
    }

    #[test]
    fn degrees_print_as_a_list() {
        assert_eq!(Degrees(vec![1, 3]).to_string(), "1, 3");
    }
}
