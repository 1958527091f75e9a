//! Tensor parallelism through XLA SPMD: one program, compiled with `num_partitions = 2`, run in
//! one call across two devices of one client, XLA's partitioner inserting the all-reduce.

use std::path::Path;

use tlaloc_pjrt::{Buffer, Client, CompileOptions, Device, Error, ExecuteArg};

use crate::common::values;

const M: usize = 3;
const K: usize = 16;
const H: usize = 8;
const N: usize = 5;
const PARTITIONS: usize = 2;
const HALF: usize = H / PARTITIONS;

/// y = (x @ W1) @ W2 with x replicated, W1 split by columns and W2 by rows (Megatron's MLP
/// split): each partition computes its half of the hidden layer and a partial y, and the SPMD
/// partitioner adds an all-reduce over the partials so that every device holds the whole y.
/// The shardings name partitions (0, 1); the device assignment maps them to devices.
fn tensor_parallel_program() -> String {
    let dot = "contracting_dims = [1] x [0], precision = [HIGHEST, HIGHEST]";
    format!(
        r#"module @tensor_parallel_mlp attributes {{mhlo.num_partitions = {PARTITIONS} : i32, mhlo.num_replicas = 1 : i32}} {{
  func.func public @main(%x: tensor<{M}x{K}xf32> {{mhlo.sharding = "{{replicated}}"}}, %w1: tensor<{K}x{H}xf32> {{mhlo.sharding = "{{devices=[1,2]0,1}}"}}, %w2: tensor<{H}x{N}xf32> {{mhlo.sharding = "{{devices=[2,1]0,1}}"}}) -> (tensor<{M}x{N}xf32> {{mhlo.sharding = "{{replicated}}"}}) {{
    %h = stablehlo.dot_general %x, %w1, {dot} : (tensor<{M}x{K}xf32>, tensor<{K}x{H}xf32>) -> tensor<{M}x{H}xf32>
    %y = stablehlo.dot_general %h, %w2, {dot} : (tensor<{M}x{H}xf32>, tensor<{H}x{N}xf32>) -> tensor<{M}x{N}xf32>
    return %y : tensor<{M}x{N}xf32>
  }}
}}"#
    )
}

/// The host reference over hidden units `hidden` (all of them for y, one half for a partial):
/// `(y, bound)` in f64, where `bound[i][j] = sum_h (sum_k |x_ik| |w1_kh|) |w2_hj|`.
fn reference(
    x: &[f32],
    w1: &[f32],
    w2: &[f32],
    hidden: std::ops::Range<usize>,
) -> (Vec<f64>, Vec<f64>) {
    let mut y = vec![0f64; M * N];
    let mut bound = vec![0f64; M * N];
    for i in 0..M {
        for h in hidden.clone() {
            let (mut value, mut magnitude) = (0f64, 0f64);
            for k in 0..K {
                let product = f64::from(x[i * K + k]) * f64::from(w1[k * H + h]);
                value += product;
                magnitude += product.abs();
            }
            for j in 0..N {
                let w = f64::from(w2[h * N + j]);
                y[i * N + j] += value * w;
                bound[i * N + j] += magnitude * w.abs();
            }
        }
    }
    (y, bound)
}

/// Whether `got` is within `tolerance(bound)` of `expected`, element by element; the first
/// element that is not, otherwise.
fn first_mismatch(got: &[f32], expected: &[f64], bound: &[f64]) -> Option<String> {
    // Rounding-error bound of y computed in f32 (Higham, "Accuracy and Stability of Numerical
    // Algorithms", 3.1: a dot product of length n in any summation order is off by at most
    // gamma_n * sum |a||b|, gamma_n ~ n * u, u = 2^-24): h = x @ W1 is off by
    // gamma_K * sum_k |x||w1|; each partition's partial y sums H/2 products (gamma_{H/2}) of
    // those h, and the all-reduce adds the 2 partials (one more rounding, u). To first order
    // |y_f32 - y| <= (K + H/2 + 1) * u * bound with bound = sum_h (sum_k |x||w1|) |w2|. The
    // inputs are f32 values, so the f64 reference is exact to ~2^-53, negligible here. The
    // tolerance takes (K + H) * f32::EPSILON = 2 (K + H) u, more than twice that bound, so
    // any summation order, blocking or FMA passes, while a missing or doubled all-reduce,
    // which is off by a whole partial sum, does not (checked below).
    let factor = (K + H) as f64 * f64::from(f32::EPSILON);
    got.iter()
        .zip(expected)
        .zip(bound)
        .enumerate()
        .find(|(_, ((g, e), b))| (f64::from(**g) - **e).abs() > factor * **b)
        .map(|(index, ((g, e), b))| {
            format!(
                "element {index} (row {}, column {}): got {g}, expected {e}, tolerance {}",
                index / N,
                index % N,
                factor * b
            )
        })
}

/// Columns `[p * HALF, (p + 1) * HALF)` of the row-major `K x H` W1.
fn column_shard(w1: &[f32], partition: usize) -> Vec<f32> {
    (0..K)
        .flat_map(|k| w1[k * H + partition * HALF..k * H + (partition + 1) * HALF].to_vec())
        .collect()
}

/// Rows `[p * HALF, (p + 1) * HALF)` of the row-major `H x N` W2.
fn row_shard(w2: &[f32], partition: usize) -> Vec<f32> {
    w2[partition * HALF * N..(partition + 1) * HALF * N].to_vec()
}

/// Each partition's inputs `[x, W1 shard, W2 shard]` on that partition's device
/// (`by_partition[p]`).
fn upload_shards(
    client: &Client,
    by_partition: &[Device],
    x: &[f32],
    w1: &[f32],
    w2: &[f32],
) -> Vec<Vec<Buffer>> {
    (0..PARTITIONS)
        .map(|p| {
            let device = &by_partition[p];
            vec![
                client
                    .buffer_from_host(x, &[M as i64, K as i64], device)
                    .unwrap(),
                client
                    .buffer_from_host(&column_shard(w1, p), &[K as i64, HALF as i64], device)
                    .unwrap(),
                client
                    .buffer_from_host(&row_shard(w2, p), &[HALF as i64, N as i64], device)
                    .unwrap(),
            ]
        })
        .collect()
}

fn borrowed(lists: &[Vec<Buffer>]) -> Vec<Vec<ExecuteArg<'_>>> {
    lists
        .iter()
        .map(|list| list.iter().map(ExecuteArg::Borrowed).collect())
        .collect()
}

/// Compiles the program with partition `p` on device `ids[p]` of `client`, runs it, and checks
/// every device's y; `Err` is the plugin's refusal.
fn run_tensor_parallel_mlp(path: &Path, client: &Client, ids: &[i32]) -> Result<(), String> {
    let devices = client.addressable_devices().unwrap();
    let by_partition: Vec<Device> = ids
        .iter()
        .map(|&id| devices.iter().find(|d| d.id() == id).unwrap().clone())
        .collect();
    let options = CompileOptions::spmd(ids).unwrap();
    let program = tensor_parallel_program();
    let executable = client.compile(&program, &options).map_err(|e| {
        format!("compiling with num_partitions = 2, SPMD and device assignment {ids:?} failed: {e}")
    })?;
    assert_eq!(executable.num_parameters(), Some(3));
    assert_eq!(executable.num_outputs(), 1);
    let executable_ids: Vec<i32> = executable
        .addressable_devices()
        .unwrap()
        .iter()
        .map(|d| d.id())
        .collect();
    // Also shows that the plugin read the device assignment: its default would be [0, 1] for
    // every call, while the reversed assignment must give [1, 0].
    assert_eq!(
        executable_ids, ids,
        "the executable's devices are the assignment's, partition by partition"
    );

    let x = values(101, M * K);
    let w1 = values(102, K * H);
    let w2 = values(103, H * N);
    let (expected, bound) = reference(&x, &w1, &w2, 0..H);
    let shards = upload_shards(client, &by_partition, &x, &w1, &w2);
    let outputs = executable
        .execute_per_device(borrowed(&shards))
        .map_err(|e| format!("executing on devices {ids:?} failed: {e}"))?;
    assert_eq!(outputs.len(), PARTITIONS);
    for (partition, row) in outputs.iter().enumerate() {
        assert_eq!(row.len(), 1);
        assert_eq!(row[0].dims().unwrap(), vec![M as i64, N as i64]);
        assert_eq!(row[0].device().unwrap().id(), ids[partition]);
        let got = row[0].to_host_vec::<f32>().unwrap();
        if let Some(mismatch) = first_mismatch(&got, &expected, &bound) {
            panic!(
                "{}: partition {partition} (device {}): {mismatch}",
                path.display(),
                ids[partition]
            );
        }
        eprintln!(
            "{}: partition {partition} on device {} matches the f64 reference",
            path.display(),
            ids[partition]
        );
    }
    // The tolerance is tight enough to tell a partial sum (no all-reduce) from the whole y.
    let (partial, _) = reference(&x, &w1, &w2, 0..HALF);
    let partial: Vec<f32> = partial.iter().map(|&v| v as f32).collect();
    assert!(
        first_mismatch(&partial, &expected, &bound).is_some(),
        "partition 0's partial y must fail the check"
    );

    // One argument list for a two-device executable is refused before reaching the plugin.
    match executable.execute_per_device(borrowed(&shards[..1])) {
        Err(Error::InvalidArgument(message)) => assert!(
            message.contains("1 argument lists were given")
                && message.contains("runs on 2 devices"),
            "{message}"
        ),
        other => panic!("one argument list for two devices: {other:?}"),
    }
    // So is a shard on the other partition's device.
    let mut swapped = borrowed(&shards);
    let (first, second) = swapped.split_at_mut(1);
    std::mem::swap(&mut first[0][1], &mut second[0][1]);
    match executable.execute_per_device(swapped) {
        Err(Error::InvalidArgument(message)) => assert!(
            message.contains(&format!(
                "argument 1 of the list for device id {} (position 0) is a buffer on device id {}",
                ids[0], ids[1]
            )),
            "{message}"
        ),
        other => panic!("a W1 shard on the wrong device: {other:?}"),
    }
    // And a list short of an argument.
    let mut short = borrowed(&shards);
    short[1].pop();
    match executable.execute_per_device(short) {
        Err(Error::InvalidArgument(message)) => assert!(
            message.contains("(position 1) has 2 arguments; every list must have 3"),
            "{message}"
        ),
        other => panic!("a list of 2 arguments for a program of 3: {other:?}"),
    }
    Ok(())
}

#[test]
fn tensor_parallel_mlp_on_two_devices_matches_the_host() {
    let mut refusals = Vec::new();
    let mut ran = 0;
    for path in tlaloc_pjrt::testing::test_plugin_paths() {
        eprintln!("plugin {}", path.display());
        // Partition 0 on device 0, then (a second compile) partition 0 on device 1.
        let outcome = tlaloc_pjrt::testing::client_with_devices(&path, PARTITIONS as u32).and_then(
            |client| {
                let ids: Vec<i32> = client.addressable_devices().unwrap()[..PARTITIONS]
                    .iter()
                    .map(|d| d.id())
                    .collect();
                let reversed: Vec<i32> = ids.iter().rev().copied().collect();
                run_tensor_parallel_mlp(&path, &client, &ids)?;
                run_tensor_parallel_mlp(&path, &client, &reversed)
            },
        );
        match outcome {
            Ok(()) => ran += 1,
            Err(refusal) => refusals.push(format!("{}: {refusal}", path.display())),
        }
    }
    assert!(
        refusals.is_empty(),
        "ran on {ran} plugins; refused by:\n{}",
        refusals.join("\n")
    );
}
