//! StableHLO programs run on every test plugin and checked against Rust reference computations.

use half::bf16;
use tlaloc_pjrt::{
    Buffer, Client, CompileOptions, ElementType, Error, ExecuteArg, LoadedExecutable,
};

use crate::common::{compile, on_each_plugin, values};

const M: usize = 8;
const K: usize = 16;
const N: usize = 5;

fn matmul_program() -> String {
    format!(
        r#"module @matmul {{
  func.func public @main(%a: tensor<{M}x{K}xf32>, %b: tensor<{K}x{N}xf32>) -> tensor<{M}x{N}xf32> {{
    %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0], precision = [HIGHEST, HIGHEST] : (tensor<{M}x{K}xf32>, tensor<{K}x{N}xf32>) -> tensor<{M}x{N}xf32>
    return %0 : tensor<{M}x{N}xf32>
  }}
}}"#
    )
}

fn matmul_reference(a: &[f32], b: &[f32]) -> Vec<f32> {
    let mut out = vec![0f32; M * N];
    for i in 0..M {
        for j in 0..N {
            let mut acc = 0f64;
            for k in 0..K {
                acc += f64::from(a[i * K + k]) * f64::from(b[k * N + j]);
            }
            out[i * N + j] = acc as f32;
        }
    }
    out
}

fn assert_close(actual: &[f32], expected: &[f32], tolerance: f32) {
    assert_eq!(actual.len(), expected.len());
    for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
        assert!(
            (a - e).abs() <= tolerance * e.abs().max(1.0),
            "element {i}: got {a}, expected {e}"
        );
    }
}

/// The matmul inputs for `seed` (the second from `seed + 1`), on the host and on the first device.
struct MatmulInputs {
    a: Vec<f32>,
    b: Vec<f32>,
    a_buf: Buffer,
    b_buf: Buffer,
}

impl MatmulInputs {
    fn upload(client: &Client, seed: u64) -> Self {
        let device = client.first_device().unwrap();
        let a = values(seed, M * K);
        let b = values(seed + 1, K * N);
        let a_buf = client
            .buffer_from_host(&a, &[M as i64, K as i64], &device)
            .unwrap();
        let b_buf = client
            .buffer_from_host(&b, &[K as i64, N as i64], &device)
            .unwrap();
        MatmulInputs { a, b, a_buf, b_buf }
    }

    fn args(&self) -> Vec<ExecuteArg<'_>> {
        vec![
            ExecuteArg::Borrowed(&self.a_buf),
            ExecuteArg::Borrowed(&self.b_buf),
        ]
    }

    fn reference(&self) -> Vec<f32> {
        matmul_reference(&self.a, &self.b)
    }
}

/// Runs `executable` with every buffer borrowed, in order.
fn execute_borrowed(executable: &LoadedExecutable, buffers: &[&Buffer]) -> Vec<Buffer> {
    executable
        .execute(buffers.iter().map(|b| ExecuteArg::Borrowed(b)).collect())
        .unwrap()
}

fn run_matmul(client: &Client, executable: &LoadedExecutable, seed: u64) {
    let inputs = MatmulInputs::upload(client, seed);
    let outputs = executable.execute(inputs.args()).unwrap();
    assert_eq!(outputs.len(), 1);
    assert_eq!(outputs[0].dims().unwrap(), vec![M as i64, N as i64]);
    assert_eq!(outputs[0].element_type().unwrap(), ElementType::F32);
    assert_close(
        &outputs[0].to_host_vec::<f32>().unwrap(),
        &inputs.reference(),
        1e-5,
    );
}

#[test]
fn dot_general_matches_a_rust_matmul() {
    on_each_plugin(|_, client| {
        let executable = compile(client, &matmul_program());
        assert_eq!(executable.num_outputs(), 1);
        assert_eq!(executable.num_parameters(), Some(2));
        run_matmul(client, &executable, 7);
    });
}

#[test]
fn gather_takes_rows_by_index() {
    let program = r#"module @gather {
  func.func public @main(%table: tensor<5x3xf32>, %idx: tensor<4xi32>) -> tensor<4x3xf32> {
    %0 = "stablehlo.gather"(%table, %idx) {dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, slice_sizes = array<i64: 1, 3>, indices_are_sorted = false} : (tensor<5x3xf32>, tensor<4xi32>) -> tensor<4x3xf32>
    return %0 : tensor<4x3xf32>
  }
}"#;
    on_each_plugin(|_, client| {
        let device = client.first_device().unwrap();
        let table = values(3, 15);
        let indices: Vec<i32> = vec![4, 0, 2, 4];
        let expected: Vec<f32> = indices
            .iter()
            .flat_map(|&i| table[i as usize * 3..i as usize * 3 + 3].to_vec())
            .collect();
        let executable = compile(client, program);
        let t = client.buffer_from_host(&table, &[5, 3], &device).unwrap();
        let i = client.buffer_from_host(&indices, &[4], &device).unwrap();
        let out = execute_borrowed(&executable, &[&t, &i]);
        assert_eq!(out[0].to_host_vec::<f32>().unwrap(), expected);
    });
}

#[test]
fn scatter_drops_out_of_bounds_indices() {
    let program = r#"module @scatter {
  func.func public @main(%table: tensor<6x2xf32>, %idx: tensor<4xi32>, %upd: tensor<4x2xf32>) -> tensor<6x2xf32> {
    %0 = "stablehlo.scatter"(%table, %idx, %upd) ({
    ^bb0(%old: tensor<f32>, %new: tensor<f32>):
      stablehlo.return %new : tensor<f32>
    }) {scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, indices_are_sorted = false, unique_indices = false} : (tensor<6x2xf32>, tensor<4xi32>, tensor<4x2xf32>) -> tensor<6x2xf32>
    return %0 : tensor<6x2xf32>
  }
}"#;
    on_each_plugin(|_, client| {
        let device = client.first_device().unwrap();
        let table = values(11, 12);
        let indices: Vec<i32> = vec![1, -1, 4, 6];
        let updates = values(12, 8);
        let mut expected = table.clone();
        for (row, &index) in indices.iter().enumerate() {
            if (0..6).contains(&index) {
                let index = index as usize;
                expected[index * 2..index * 2 + 2].copy_from_slice(&updates[row * 2..row * 2 + 2]);
            }
        }
        let executable = compile(client, program);
        let t = client.buffer_from_host(&table, &[6, 2], &device).unwrap();
        let i = client.buffer_from_host(&indices, &[4], &device).unwrap();
        let u = client.buffer_from_host(&updates, &[4, 2], &device).unwrap();
        let out = execute_borrowed(&executable, &[&t, &i, &u]);
        let got = out[0].to_host_vec::<f32>().unwrap();
        assert_eq!(got, expected);
        // Rows only an out-of-bounds index aimed at keep their old values bit for bit.
        for row in [0usize, 2, 3, 5] {
            assert_eq!(
                got[row * 2..row * 2 + 2],
                table[row * 2..row * 2 + 2],
                "row {row}"
            );
        }
        for (row, update) in [(1usize, 0usize), (4, 2)] {
            assert_eq!(
                got[row * 2..row * 2 + 2],
                updates[update * 2..update * 2 + 2],
                "row {row}"
            );
        }
    });
}

const UPDATE_SLICE: &str = r#"module @update {
  func.func public @main(%pool: tensor<8x4xf32> {tf.aliasing_output = 0 : i32}, %upd: tensor<2x4xf32>, %row: tensor<i32>) -> tensor<8x4xf32> {
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    %0 = stablehlo.dynamic_update_slice %pool, %upd, %row, %c0 : (tensor<8x4xf32>, tensor<2x4xf32>, tensor<i32>, tensor<i32>) -> tensor<8x4xf32>
    return %0 : tensor<8x4xf32>
  }
}"#;

/// The inputs of `UPDATE_SLICE`: the pool (from `seed`) and the update (from `seed + 1`) on the
/// host, and the update and the row index on the first device.
struct UpdateInputs {
    pool: Vec<f32>,
    update: Vec<f32>,
    row: usize,
    update_buf: Buffer,
    row_buf: Buffer,
}

impl UpdateInputs {
    /// The inputs and the pool's own buffer, kept apart so that a test can donate it.
    fn upload(client: &Client, seed: u64, row: usize) -> (Self, Buffer) {
        let device = client.first_device().unwrap();
        let pool = values(seed, 32);
        let update = values(seed + 1, 8);
        let pool_buf = client.buffer_from_host(&pool, &[8, 4], &device).unwrap();
        let update_buf = client.buffer_from_host(&update, &[2, 4], &device).unwrap();
        let row_buf = client
            .buffer_from_host(&[row as i32], &[], &device)
            .unwrap();
        let inputs = UpdateInputs {
            pool,
            update,
            row,
            update_buf,
            row_buf,
        };
        (inputs, pool_buf)
    }

    /// Runs the update on `pool`, borrowed or donated.
    fn run<'a>(&'a self, executable: &LoadedExecutable, pool: ExecuteArg<'a>) -> Vec<Buffer> {
        executable
            .execute(vec![
                pool,
                ExecuteArg::Borrowed(&self.update_buf),
                ExecuteArg::Borrowed(&self.row_buf),
            ])
            .unwrap()
    }

    fn expected(&self) -> Vec<f32> {
        let mut expected = self.pool.clone();
        expected[self.row * 4..self.row * 4 + 8].copy_from_slice(&self.update);
        expected
    }
}

#[test]
fn donated_input_is_updated_in_place() {
    on_each_plugin(|_, client| {
        let executable = compile(client, UPDATE_SLICE);
        let (inputs, pool_buf) = UpdateInputs::upload(client, 21, 3);
        let before = pool_buf.unsafe_device_pointer().unwrap();
        // `pool_buf` is moved into the call: the compiler refuses any later use of it.
        let out = inputs.run(&executable, ExecuteArg::Donated(pool_buf));
        assert_eq!(
            out[0].unsafe_device_pointer().unwrap(),
            before,
            "the output must reuse the donated memory"
        );
        assert_eq!(out[0].to_host_vec::<f32>().unwrap(), inputs.expected());
    });
}

#[test]
fn borrowed_input_is_never_donated() {
    on_each_plugin(|_, client| {
        let executable = compile(client, UPDATE_SLICE);
        let (inputs, pool_buf) = UpdateInputs::upload(client, 31, 5);
        let out = inputs.run(&executable, ExecuteArg::Borrowed(&pool_buf));
        assert_eq!(out[0].to_host_vec::<f32>().unwrap(), inputs.expected());
        assert!(!pool_buf.is_deleted().unwrap());
        assert_ne!(
            out[0].unsafe_device_pointer().unwrap(),
            pool_buf.unsafe_device_pointer().unwrap()
        );
        assert_eq!(
            pool_buf.to_host_vec::<f32>().unwrap(),
            inputs.pool,
            "a borrowed input must be left intact"
        );
    });
}

#[test]
fn bf16_program_matches_rust_bf16() {
    let program = r#"module @bf16 {
  func.func public @main(%a: tensor<6xbf16>, %b: tensor<6xbf16>) -> tensor<6xbf16> {
    %0 = stablehlo.multiply %a, %b : tensor<6xbf16>
    %1 = stablehlo.add %0, %a : tensor<6xbf16>
    return %1 : tensor<6xbf16>
  }
}"#;
    on_each_plugin(|_, client| {
        let device = client.first_device().unwrap();
        // Values whose products and sums are exact in bf16, so no rounding-order question arises.
        let a: Vec<bf16> = [1.5f32, -2.0, 0.25, 3.0, -0.5, 8.0]
            .map(bf16::from_f32)
            .to_vec();
        let b: Vec<bf16> = [2.0f32, 0.5, -4.0, 1.25, 6.0, -0.125]
            .map(bf16::from_f32)
            .to_vec();
        let expected: Vec<bf16> = a
            .iter()
            .zip(&b)
            .map(|(x, y)| bf16::from_f32(x.to_f32() * y.to_f32() + x.to_f32()))
            .collect();
        let executable = compile(client, program);
        let a_buf = client.buffer_from_host(&a, &[6], &device).unwrap();
        let b_buf = client.buffer_from_host(&b, &[6], &device).unwrap();
        let out = execute_borrowed(&executable, &[&a_buf, &b_buf]);
        assert_eq!(out[0].element_type().unwrap(), ElementType::BF16);
        assert_eq!(out[0].on_device_size().unwrap(), 12);
        assert_eq!(out[0].to_host_vec::<bf16>().unwrap(), expected);
    });
}

#[test]
fn concurrent_executes_from_several_threads() {
    on_each_plugin(|_, client| {
        let executable = compile(client, &matmul_program());
        std::thread::scope(|scope| {
            for thread in 0..4u64 {
                let executable = &executable;
                scope.spawn(move || {
                    for step in 0..10u64 {
                        run_matmul(client, executable, 1000 * thread + step);
                    }
                });
            }
        });
    });
}

#[test]
fn async_readback_lands_after_launching_more_work() {
    on_each_plugin(|_, client| {
        let executable = compile(client, &matmul_program());
        let inputs = MatmulInputs::upload(client, 41);
        let first = executable.execute(inputs.args()).unwrap();
        let pending = first[0].to_host_async().unwrap();
        let (second, done) = executable.execute_with_completion(inputs.args()).unwrap();
        drop(first);
        let bytes = pending.wait().unwrap();
        let got: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_close(&got, &inputs.reference(), 1e-5);
        if let Some(done) = done {
            done.wait().unwrap();
            assert!(done.is_ready().unwrap());
        }
        assert_close(
            &second[0].to_host_vec::<f32>().unwrap(),
            &inputs.reference(),
            1e-5,
        );
    });
}

#[test]
fn invalid_program_is_a_typed_compile_error() {
    let program = r#"module @bad {
  func.func public @main(%a: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.add %a, %undefined : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}"#;
    on_each_plugin(
        |_, client| match client.compile(program, &CompileOptions::default()) {
            Err(Error::Pjrt { call, message, .. }) => {
                assert_eq!(call, "PJRT_Client_Compile");
                assert!(!message.is_empty());
            }
            other => panic!("expected a compile error, got {other:?}"),
        },
    );
}

#[test]
fn wrong_argument_count_is_refused_before_the_plugin() {
    on_each_plugin(|_, client| {
        let device = client.first_device().unwrap();
        let executable = compile(client, &matmul_program());
        let a = client
            .buffer_from_host(&values(1, M * K), &[M as i64, K as i64], &device)
            .unwrap();
        match executable.execute(vec![ExecuteArg::Borrowed(&a)]) {
            Err(Error::ArgumentCount {
                expected: 2,
                found: 1,
            }) => {}
            other => panic!("expected an argument-count error, got {other:?}"),
        }
    });
}

#[test]
fn serialized_executable_runs_after_deserialization() {
    on_each_plugin(|_, client| {
        let executable = compile(client, &matmul_program());
        let bytes = executable.serialize().unwrap();
        let restored = client
            .deserialize_executable(&bytes, &CompileOptions::default())
            .unwrap();
        assert_eq!(restored.num_outputs(), 1);
        assert_eq!(restored.num_parameters(), Some(2));
        run_matmul(client, &restored, 99);
        assert!(matches!(
            client.deserialize_executable(&bytes[8..], &CompileOptions::default()),
            Err(Error::BadSerializedExecutable(_))
        ));
    });
}

#[test]
fn host_upload_refuses_a_size_mismatch() {
    on_each_plugin(|_, client| {
        let device = client.first_device().unwrap();
        let result = client.buffer_from_host(&[1f32, 2.0, 3.0], &[2, 2], &device);
        assert!(
            matches!(result, Err(Error::InvalidArgument(_))),
            "{result:?}"
        );
        let buffer: Buffer = client
            .buffer_from_host(&[1i32, 2, 3, 4], &[2, 2], &device)
            .unwrap();
        assert!(matches!(
            buffer.to_host_vec::<f32>(),
            Err(Error::InvalidArgument(_))
        ));
        assert_eq!(buffer.to_host_vec::<i32>().unwrap(), vec![1, 2, 3, 4]);
    });
}

#[test]
fn a_copy_on_the_same_device_is_an_independent_buffer() {
    on_each_plugin(|_, client| {
        let device = client.first_device().unwrap();
        let executable = compile(client, UPDATE_SLICE);
        let (inputs, original) = UpdateInputs::upload(client, 41, 2);
        let copy = original.copy_to_device(&device).unwrap();
        let spare = original.copy_to_device(&device).unwrap();
        assert_eq!(copy.to_host_vec::<f32>().unwrap(), inputs.pool);
        assert_ne!(
            copy.unsafe_device_pointer().unwrap(),
            original.unsafe_device_pointer().unwrap(),
            "a copy must have memory of its own"
        );
        // Donating the copy must leave the original untouched, and donating the original must
        // leave the other copy untouched.
        let out = inputs.run(&executable, ExecuteArg::Donated(copy));
        assert_eq!(out[0].to_host_vec::<f32>().unwrap(), inputs.expected());
        assert_eq!(original.to_host_vec::<f32>().unwrap(), inputs.pool);
        let out = inputs.run(&executable, ExecuteArg::Donated(original));
        assert_eq!(out[0].to_host_vec::<f32>().unwrap(), inputs.expected());
        assert!(!spare.is_deleted().unwrap());
        assert_eq!(spare.to_host_vec::<f32>().unwrap(), inputs.pool);
    });
}
