//! Tensor parallelism in the artifact: how one program's operands are laid out over the `degree`
//! devices it runs on, and how a split weight is stored (one file per shard).
//!
//! An artifact of degree N > 1 has a [`TensorParallel`] section; its bodies are SPMD programs
//! (`mhlo.num_partitions = N`) over the global shapes the program files state, and every device
//! runs the same program on its own piece of each operand:
//! - step inputs (`tokenIds`, `positions`, `blockTables`, `seqLens`, `slotMapping`) are
//!   replicated: every device gets the same bytes, and the step outputs (`logits`,
//!   `nextTokens`, `nextTokenIds` and the next decode step's inputs) are replicated (every
//!   device returns the same values);
//! - every K/V pool and scale pool is split over its KV-head dimension (dim 2): device `k`
//!   holds heads `[k * kv / N, (k + 1) * kv / N)`, and each updated pool output comes back split
//!   the same way, in the buffer of its donated input;
//! - each weight is either replicated (no [`WeightSplit`]: one file, every device uploads it
//!   whole) or split as its [`WeightSplit`] says: shard `k` is the slice `k` of N equal,
//!   contiguous pieces along `axis`, a dense (or block) row-major tensor of its own, in file
//!   `weights/NNNN_<slot>.shard<k>.bin` ([`crate::paths::weight_shard_path`]), uploaded to
//!   device `k` alone.
//!
//! An artifact without the section is of degree 1, as every artifact written before it.

use serde::{Deserialize, Serialize};

use crate::dtype::Dtype;
use crate::quant::BlockFormat;

/// The `tensorParallel` section of the manifest (absent for degree 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TensorParallel {
    /// Devices one program runs on (`mhlo.num_partitions`): at least 2, dividing the model's
    /// attention and KV heads.
    pub degree: usize,
}

/// The K/V pools' (and scale pools') dimension split over the devices: the KV heads.
pub const POOL_SPLIT_AXIS: usize = 2;

/// How a weight is split over the devices of a tensor-parallel artifact.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WeightSplit {
    /// The dimension of the weight's `dims` cut into `degree` equal, contiguous pieces (for a
    /// block-quantized weight, axis 1 is cut at whole blocks).
    pub axis: usize,
    /// One file per device, shard `k` at index `k`.
    pub shards: Vec<WeightShard>,
}

/// One shard of a split weight: its file, length and hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WeightShard {
    /// `weights/NNNN_<slot>.shard<k>.bin`
    pub file: String,
    pub byte_length: u64,
    pub sha256: String,
}

/// The logical dims of one shard of a weight of `dims` split along `axis` over `degree`
/// devices, or why it does not split: `axis` must be a dimension, divisible by `degree`, and for
/// a block-quantized weight's input dimension each piece whole blocks.
pub fn shard_dims(
    dims: &[usize],
    block_format: Option<BlockFormat>,
    axis: usize,
    degree: usize,
) -> Result<Vec<usize>, String> {
    let Some(&d) = dims.get(axis) else {
        return Err(format!(
            "axis {axis} is not a dimension of dims {dims:?} (rank {})",
            dims.len()
        ));
    };
    if degree == 0 || d % degree != 0 {
        return Err(format!(
            "dimension {axis} ({d}) of dims {dims:?} does not split into {degree} equal pieces"
        ));
    }
    let mut piece = dims.to_vec();
    piece[axis] = d / degree;
    if let Some(format) = block_format {
        format.operand_dims(&piece).map_err(|reason| {
            format!("a shard of dims {piece:?} is not whole {format} blocks: {reason}")
        })?;
    }
    Ok(piece)
}

/// The `degree` shards of a weight's operand bytes `bytes` (dense row-major of `elem` bytes per
/// element, dims `operand_dims`) along `axis`: shard `k` holds indices `[k * d / degree, (k + 1)
/// * d / degree)` of that dimension, every other dimension whole. The caller has checked the
/// split with [`shard_dims`] and the length against the dims.
pub fn split_operand(
    bytes: &[u8],
    operand_dims: &[usize],
    elem: usize,
    axis: usize,
    degree: usize,
) -> Vec<Vec<u8>> {
    let outer: usize = operand_dims[..axis].iter().product();
    let inner: usize = operand_dims[axis + 1..].iter().product::<usize>() * elem;
    let row = operand_dims[axis] * inner;
    let piece = row / degree;
    (0..degree)
        .map(|k| {
            let mut shard = Vec::with_capacity(outer * piece);
            for o in 0..outer {
                let start = o * row + k * piece;
                shard.extend_from_slice(&bytes[start..start + piece]);
            }
            shard
        })
        .collect()
}

/// The element size and operand dims of a weight as stored (`u8 [out, row bytes]` for a
/// block-quantized one), or why its dims cannot be stored.
pub(crate) fn operand_layout(
    dtype: Dtype,
    dims: &[usize],
    block_format: Option<BlockFormat>,
) -> Result<(usize, Vec<usize>), String> {
    match block_format {
        None => Ok((dtype.byte_size(), dims.to_vec())),
        Some(format) => Ok((
            BlockFormat::OPERAND_DTYPE.byte_size(),
            format.operand_dims(dims)?,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_are_contiguous_pieces_along_the_axis() {
        // A 2 x 4 matrix of one-byte elements 0..8.
        let bytes: Vec<u8> = (0..8).collect();
        assert_eq!(
            split_operand(&bytes, &[2, 4], 1, 0, 2),
            [vec![0, 1, 2, 3], vec![4, 5, 6, 7]]
        );
        assert_eq!(
            split_operand(&bytes, &[2, 4], 1, 1, 2),
            [vec![0, 1, 4, 5], vec![2, 3, 6, 7]]
        );
        // Two-byte elements keep their bytes together.
        assert_eq!(
            split_operand(&bytes, &[2, 2], 2, 1, 2),
            [vec![0, 1, 4, 5], vec![2, 3, 6, 7]]
        );
    }

    #[test]
    fn a_split_must_be_even_and_keep_whole_blocks() {
        assert_eq!(shard_dims(&[6, 4], None, 0, 3).unwrap(), [2, 4]);
        let err = shard_dims(&[6, 4], None, 1, 3).unwrap_err();
        assert!(err.contains("dimension 1 (4)"), "{err}");
        assert!(shard_dims(&[6], None, 1, 2).unwrap_err().contains("axis 1"));
        // 96 inputs of Q8_0 are 3 blocks: two devices would cut one.
        let err = shard_dims(&[4, 96], Some(BlockFormat::Q8_0), 1, 2).unwrap_err();
        assert!(err.contains("q8_0"), "{err}");
        assert_eq!(
            shard_dims(&[4, 128], Some(BlockFormat::Q8_0), 1, 2).unwrap(),
            [4, 64]
        );
    }
}
