//! Tensor-parallel artifacts (`tensorParallel.degree > 1`, see
//! `tlaloc_artifact::tensor_parallel`): programs split over several devices, weights stored one
//! shard per device. This version of the runtime places every operand on one device, so it
//! refuses them when the manifest is first read, before a plugin is opened, rather than failing
//! later on a split weight or a program compiled for one partition.

use tlaloc_artifact::Manifest;

use crate::model::LoadError;

/// Refuses an artifact whose programs run on more than one device, naming its degree.
pub(crate) fn refuse_split_artifact(manifest: &Manifest) -> Result<(), LoadError> {
    check_degree(manifest.tensor_parallel_degree())
}

fn check_degree(degree: usize) -> Result<(), LoadError> {
    if degree == 1 {
        return Ok(());
    }
    Err(LoadError::Unsupported(format!(
        "the artifact is tensor-parallel over {degree} devices (tensorParallel.degree = \
         {degree}); this version of the runtime loads only degree 1 (re-export without \
         --tensor-parallel, or with --tensor-parallel 1)"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_degree_one_loads() {
        assert!(check_degree(1).is_ok());
        let err = check_degree(2).unwrap_err().to_string();
        assert!(
            err.contains("over 2 devices") && err.contains("loads only degree 1"),
            "{err}"
        );
    }
}
