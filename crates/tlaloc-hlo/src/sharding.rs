//! XLA shardings of `@main`'s arguments and results, for programs that XLA's SPMD partitioner
//! splits over the devices of one client (`mhlo.num_partitions = N`).
//!
//! The program keeps its global shapes; each argument and result says how it is laid out over
//! the N partitions, and the partitioner rewrites every op between them for one partition's
//! piece, inserting the collectives. The one layout a caller can ask for besides replication is
//! one dimension cut into N equal, contiguous pieces, piece `k` on partition `k` (a 1-D device
//! mesh): what tensor parallelism needs, and what a loader can place with nothing but a slice.
//! The printed form is `HloSharding`'s (`{replicated}`, `{devices=[1,2]0,1}`), with the device
//! list written out rather than as an iota (`<=[2]`), which older parsers do not read.

use std::fmt::Write as _;

use crate::types::TensorType;

/// How one tensor is laid out over the partitions of an SPMD program.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Sharding {
    /// Every partition holds the whole tensor.
    Replicated,
    /// Dimension `dim` is cut into `parts` equal, contiguous pieces and partition `k` holds
    /// piece `k` (indices `[k * d / parts, (k + 1) * d / parts)` of it); the other dimensions
    /// are whole.
    Split { dim: usize, parts: usize },
}

impl Sharding {
    /// Dimension `dim` split over `parts` partitions.
    pub fn split(dim: usize, parts: usize) -> Sharding {
        Sharding::Split { dim, parts }
    }

    /// The partitions this sharding names: `None` for [`Sharding::Replicated`], which fits any
    /// count.
    pub fn parts(&self) -> Option<usize> {
        match *self {
            Sharding::Replicated => None,
            Sharding::Split { parts, .. } => Some(parts),
        }
    }

    /// Why this sharding cannot lay out `ty`, if it cannot: a split needs a dimension of the
    /// tensor, at least two parts, and pieces of equal size.
    pub fn check(&self, ty: &TensorType) -> Result<(), String> {
        let Sharding::Split { dim, parts } = *self else {
            return Ok(());
        };
        if parts < 2 {
            return Err(format!(
                "a split over {parts} partitions is not a split; use Sharding::Replicated"
            ));
        }
        match ty.dims.get(dim) {
            None => Err(format!(
                "{ty} has no dimension {dim} to split (rank {})",
                ty.rank()
            )),
            Some(&d) if d % parts != 0 => Err(format!(
                "dimension {dim} of {ty} ({d}) does not split into {parts} equal pieces"
            )),
            Some(_) => Ok(()),
        }
    }

    /// The dims of one partition's piece of a tensor of `dims` (checked by [`Sharding::check`]).
    pub fn piece_dims(&self, dims: &[usize]) -> Vec<usize> {
        let mut piece = dims.to_vec();
        if let Sharding::Split { dim, parts } = *self
            && let Some(d) = piece.get_mut(dim)
        {
            *d /= parts;
        }
        piece
    }

    /// The `HloSharding` text for a tensor of rank `rank`: `{replicated}`, or the tile
    /// assignment `{devices=[1,..,parts,..,1]0,1,..}` with `parts` at `dim`.
    pub fn hlo_text(&self, rank: usize) -> String {
        match *self {
            Sharding::Replicated => "{replicated}".to_owned(),
            Sharding::Split { dim, parts } => {
                let tiles: Vec<String> = (0..rank)
                    .map(|i| if i == dim { parts } else { 1 }.to_string())
                    .collect();
                let devices: Vec<String> = (0..parts).map(|p| p.to_string()).collect();
                let mut text = String::new();
                let _ = write!(
                    text,
                    "{{devices=[{}]{}}}",
                    tiles.join(","),
                    devices.join(",")
                );
                text
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DotDims, FunctionBuilder, HloError, ScalarType};

    fn f32s(dims: &[usize]) -> TensorType {
        TensorType::new(ScalarType::F32, dims.to_vec())
    }

    #[test]
    fn the_printed_text_is_the_hlo_sharding_of_a_one_dimensional_mesh() {
        assert_eq!(Sharding::Replicated.hlo_text(0), "{replicated}");
        assert_eq!(Sharding::Replicated.hlo_text(3), "{replicated}");
        assert_eq!(Sharding::split(0, 2).hlo_text(2), "{devices=[2,1]0,1}");
        assert_eq!(Sharding::split(1, 2).hlo_text(2), "{devices=[1,2]0,1}");
        assert_eq!(
            Sharding::split(2, 4).hlo_text(4),
            "{devices=[1,1,4,1]0,1,2,3}"
        );
        assert_eq!(Sharding::split(0, 3).hlo_text(1), "{devices=[3]0,1,2}");
    }

    #[test]
    fn a_split_must_name_a_dimension_that_divides_evenly() {
        assert!(Sharding::Replicated.check(&f32s(&[])).is_ok());
        assert!(Sharding::split(1, 2).check(&f32s(&[3, 4])).is_ok());
        let err = Sharding::split(0, 2).check(&f32s(&[3, 4])).unwrap_err();
        assert!(err.contains("dimension 0 of tensor<3x4xf32> (3)"), "{err}");
        let err = Sharding::split(2, 2).check(&f32s(&[3, 4])).unwrap_err();
        assert!(
            err.contains("no dimension 2") && err.contains("rank 2"),
            "{err}"
        );
        let err = Sharding::split(0, 1).check(&f32s(&[4])).unwrap_err();
        assert!(err.contains("Replicated"), "{err}");
    }

    #[test]
    fn a_piece_divides_the_split_dimension_only() {
        assert_eq!(Sharding::split(1, 4).piece_dims(&[6, 8, 2]), [6, 2, 2]);
        assert_eq!(Sharding::Replicated.piece_dims(&[6, 8]), [6, 8]);
    }

    /// x replicated, w split by its output rows, the pool donated and split like its result;
    /// the results' shardings are left to each test.
    fn spmd_function(partitions: usize) -> (FunctionBuilder, [crate::Value; 3]) {
        let mut f = FunctionBuilder::new("tp");
        let x = f.arg_named("x", f32s(&[1, 4])).unwrap();
        let w = f.arg_named("w", f32s(&[6, 4])).unwrap();
        let pool = f.arg_named("pool", f32s(&[2, 6])).unwrap();
        f.set_partitions(partitions).unwrap();
        f.shard_argument(x, Sharding::Replicated).unwrap();
        f.shard_argument(w, Sharding::split(0, 2)).unwrap();
        f.shard_argument(pool, Sharding::split(1, 2)).unwrap();
        f.donate(pool, 1).unwrap();
        (f, [x, w, pool])
    }

    /// `(x w^T, pool)`.
    fn finish(
        (mut f, [x, w, pool]): (FunctionBuilder, [crate::Value; 3]),
        results: [Sharding; 2],
    ) -> Result<crate::Module, HloError> {
        let y = f
            .dot_general(x, w, &DotDims::contracting(1, 1), None, None)
            .unwrap();
        for (i, s) in results.into_iter().enumerate() {
            f.shard_result(i, s).unwrap();
        }
        f.finish(&[y, pool])
    }

    #[test]
    fn an_spmd_module_prints_its_partitions_and_every_sharding() {
        let split = Sharding::split(1, 2);
        let text = finish(spmd_function(2), [split, split]).unwrap().to_text();
        let header: Vec<&str> = text.lines().take(2).collect();
        assert_eq!(
            header,
            [
                "module @tp attributes {mhlo.num_partitions = 2 : i32, mhlo.num_replicas = 1 : i32} {",
                "  func.func public @main(\
                 %arg0: tensor<1x4xf32> {mhlo.sharding = \"{replicated}\"} loc(\"x\"), \
                 %arg1: tensor<6x4xf32> {mhlo.sharding = \"{devices=[2,1]0,1}\"} loc(\"w\"), \
                 %arg2: tensor<2x6xf32> {mhlo.sharding = \"{devices=[1,2]0,1}\", tf.aliasing_output = 1 : i32} loc(\"pool\")) \
                 -> (tensor<1x6xf32> {mhlo.sharding = \"{devices=[1,2]0,1}\"}, \
                 tensor<2x6xf32> {mhlo.sharding = \"{devices=[1,2]0,1}\"}) {",
            ]
        );
    }

    #[test]
    fn a_module_without_partitions_prints_no_sharding_attributes() {
        let mut f = FunctionBuilder::new("one");
        let x = f.arg(f32s(&[2]));
        let text = f.finish(&[x]).unwrap().to_text();
        assert!(text.starts_with("module @one {\n"), "{text}");
        assert!(!text.contains("mhlo."), "{text}");
    }

    #[test]
    fn the_signature_refuses_inconsistent_shardings() {
        let refused = |r: Result<crate::Module, HloError>, needle: &str| {
            let err = r
                .expect_err("an inconsistent signature was accepted")
                .to_string();
            assert!(err.contains(needle), "{err:?} does not mention {needle:?}");
        };
        let (rep, split) = (Sharding::Replicated, Sharding::split(1, 2));
        // A result left without a sharding.
        let (mut f, [x, _, pool]) = spmd_function(2);
        f.shard_result(0, rep).unwrap();
        refused(f.finish(&[x, pool]), "result 1 has no sharding");
        // A donated pool whose result is laid out differently.
        refused(
            finish(spmd_function(2), [rep, rep]),
            "argument 2 is donated to result 1 but laid out differently",
        );
        // Splits over 2 in a program over 3 partitions.
        refused(
            finish(spmd_function(3), [rep, split]),
            "argument 1 is split over 2 partitions, but the program runs on 3",
        );
        // A result sharding that does not fit the result.
        refused(
            finish(spmd_function(2), [Sharding::split(0, 2), split]),
            "result 0: dimension 0 of tensor<1x6xf32> (1)",
        );
        // The same result sharded twice.
        let (mut f, _) = spmd_function(2);
        f.shard_result(0, rep).unwrap();
        assert!(f.shard_result(0, rep).is_err());
        // Shardings without a partition count.
        let mut f = FunctionBuilder::new("t");
        let x = f.arg(f32s(&[2]));
        f.shard_argument(x, Sharding::split(0, 2)).unwrap();
        refused(f.finish(&[x]), "no partition count");
        // An argument sharding that does not fit is refused when given.
        let mut f = FunctionBuilder::new("t");
        let x = f.arg(f32s(&[3]));
        let err = f.shard_argument(x, Sharding::split(0, 2)).unwrap_err();
        assert!(err.to_string().contains("argument 0: dimension 0"), "{err}");
    }
}
