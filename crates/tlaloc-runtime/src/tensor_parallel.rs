//! Tensor-parallel artifacts (`tensorParallel.degree > 1`, see
//! `tlaloc_artifact::tensor_parallel`): SPMD programs run on N devices of one client, each
//! device holding its shard of every split weight, the whole of every replicated one and its
//! KV-head slice of every pool.
//!
//! This module decides what a degree asks of the client: a CPU client is created with
//! `cpu_device_count = N`; any other plugin must offer at least N addressable devices, of which
//! the first N are used (refused by name when there are fewer). Entries compile with
//! [`CompileOptions::spmd`] over those devices' ids, so the compile cache and shipped
//! executables, which key on the compile options' bytes, never mix them with one-device ones.
//!
//! What is still refused or turned off at degree > 1, each with a log line or an error naming
//! it: compiling executables into the artifact ([`refuse_compiling_split_artifact`]), body
//! variants (the portable bodies run) and device-side decode chains (every decode step reads
//! its tokens back; see [`features_off_line`]).

use tlaloc_artifact::Manifest;
use tlaloc_artifact::tensor_parallel::POOL_SPLIT_AXIS;
use tlaloc_pjrt::{Client, ClientOptions, CompileOptions, Device};

use crate::model::LoadError;

/// The client options for an artifact of `degree`: `base` itself for degree 1, a CPU client of
/// `degree` devices where `base` is the one-device CPU client, `base` otherwise (a GPU plugin
/// exposes its devices whatever the options).
pub(crate) fn client_options(base: ClientOptions, degree: usize) -> ClientOptions {
    if degree > 1 && base == ClientOptions::cpu() {
        ClientOptions::cpu_with_devices(u32::try_from(degree).unwrap_or(u32::MAX))
    } else {
        base
    }
}

/// The first `degree` addressable devices of `client`, or why there are not enough.
pub(crate) fn devices_for(
    client: &Client,
    degree: usize,
    plugin: &str,
) -> Result<Vec<Device>, LoadError> {
    let devices = client
        .addressable_devices()
        .map_err(|source| LoadError::Pjrt {
            what: "listing the addressable devices".into(),
            source,
        })?;
    check_device_count(devices.len(), degree, plugin)?;
    Ok(devices[..degree].to_vec())
}

fn check_device_count(found: usize, degree: usize, plugin: &str) -> Result<(), LoadError> {
    if found >= degree {
        return Ok(());
    }
    Err(LoadError::Unsupported(format!(
        "the artifact is tensor-parallel over {degree} devices (tensorParallel.degree = \
         {degree}) but the client of {plugin} has {found} addressable device(s); serve it where \
         {degree} devices are visible, or re-export with a --tensor-parallel that is at most {found}"
    )))
}

/// The compile options of every entry run on `devices`: the one-device default for one device,
/// SPMD partitioning over their ids for more.
pub(crate) fn compile_options(devices: &[Device]) -> Result<CompileOptions, LoadError> {
    if devices.len() <= 1 {
        return Ok(CompileOptions::default());
    }
    let ids: Vec<i32> = devices.iter().map(Device::id).collect();
    CompileOptions::spmd(&ids).map_err(|source| LoadError::Pjrt {
        what: format!("compile options for devices {ids:?}"),
        source,
    })
}

/// One device's dims of a pool of `dims` (the whole pool's) at `degree`: the KV heads divided.
pub(crate) fn pool_slice_dims(dims: &[i64], degree: usize) -> Vec<i64> {
    let mut slice = dims.to_vec();
    if degree > 1 {
        slice[POOL_SPLIT_AXIS] /= degree as i64;
    }
    slice
}

/// The load log's line about what a degree > 1 turns off (`None` for degree 1).
pub(crate) fn features_off_line(degree: usize) -> Option<String> {
    (degree > 1).then(|| {
        format!(
            "tensor parallel over {degree} devices: body variants off (portable bodies run), \
             decode chains off (each decode step reads its tokens back)"
        )
    })
}

/// Refuses adding compiled executables to an artifact whose programs run on several devices
/// (`tlaloc compile` has no device assignment to record yet), naming its degree.
pub(crate) fn refuse_compiling_split_artifact(manifest: &Manifest) -> Result<(), LoadError> {
    check_compile_degree(manifest.tensor_parallel_degree())
}

fn check_compile_degree(degree: usize) -> Result<(), LoadError> {
    if degree == 1 {
        return Ok(());
    }
    Err(LoadError::Unsupported(format!(
        "the artifact is tensor-parallel over {degree} devices (tensorParallel.degree = \
         {degree}); compiling executables into it is not supported (serving it compiles its \
         entries through the compile cache)"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cpu_client_gets_one_device_per_partition() {
        assert_eq!(
            client_options(ClientOptions::cpu(), 1),
            ClientOptions::cpu()
        );
        assert_eq!(
            client_options(ClientOptions::cpu(), 3),
            ClientOptions::cpu_with_devices(3)
        );
    }

    #[test]
    fn too_few_devices_are_refused_by_name() {
        assert!(check_device_count(2, 2, "p.so").is_ok());
        let err = check_device_count(1, 2, "p.so").unwrap_err().to_string();
        assert!(
            err.contains("over 2 devices") && err.contains("has 1 addressable"),
            "{err}"
        );
    }

    #[test]
    fn pools_split_over_their_kv_heads() {
        assert_eq!(pool_slice_dims(&[9, 16, 4, 8], 2), vec![9, 16, 2, 8]);
        assert_eq!(pool_slice_dims(&[9, 16, 4, 8], 1), vec![9, 16, 4, 8]);
    }

    #[test]
    fn only_degree_one_artifacts_take_compiled_executables() {
        assert!(check_compile_degree(1).is_ok());
        let err = check_compile_degree(2).unwrap_err().to_string();
        assert!(err.contains("over 2 devices"), "{err}");
    }
}
