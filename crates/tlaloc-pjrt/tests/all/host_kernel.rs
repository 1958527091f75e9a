//! Rust host kernels registered as XLA typed-FFI custom calls, run inside compiled StableHLO
//! programs on every test plugin and checked against references computed here.

use std::sync::Arc;

use tlaloc_pjrt::{
    Buffer, Client, CompileOptions, Error, ExecuteArg, HostBuffer, HostBufferMut, HostElementType,
    HostKernel, LoadedExecutable, register_host_kernel,
};

use crate::common::{compile, on_each_plugin, values};

const M: usize = 6;
const K: usize = 24;
const N: usize = 5;

/// `y = x · wᵀ` over f32: `x` is `[M, K]`, `w` is `[N, K]`, `y` is `[M, N]`.
struct MatmulTransposed;

impl HostKernel for MatmulTransposed {
    fn execute(
        &self,
        args: &[HostBuffer<'_>],
        results: &mut [HostBufferMut<'_>],
    ) -> Result<(), String> {
        let [x, w] = args else {
            return Err(format!("expected 2 operands, got {}", args.len()));
        };
        let [y] = results else {
            return Err(format!("expected 1 result, got {}", results.len()));
        };
        let (&[m, k], &[n, k2], &[m2, n2]) = (x.dims(), w.dims(), y.dims()) else {
            return Err("expected rank-2 operands and result".to_string());
        };
        if k != k2 || m != m2 || n != n2 {
            return Err(format!(
                "shapes do not agree: x {:?}, w {:?}, y {:?}",
                x.dims(),
                w.dims(),
                y.dims()
            ));
        }
        let (m, k, n) = (m as usize, k as usize, n as usize);
        let x = x.as_f32().ok_or("x is not f32")?;
        let w = w.as_f32().ok_or("w is not f32")?;
        let y = y.as_f32_mut().ok_or("y is not f32")?;
        for i in 0..m {
            for j in 0..n {
                y[i * n + j] = (0..k).map(|p| x[i * k + p] * w[j * k + p]).sum();
            }
        }
        Ok(())
    }
}

/// Two results from one operand: `2x + 1` (f32) and `floor(8x)` (i32).
struct AffineAndBucket;

impl HostKernel for AffineAndBucket {
    fn execute(
        &self,
        args: &[HostBuffer<'_>],
        results: &mut [HostBufferMut<'_>],
    ) -> Result<(), String> {
        let x = args[0].as_f32().ok_or("x is not f32")?;
        let [affine, bucket] = results else {
            return Err(format!("expected 2 results, got {}", results.len()));
        };
        if bucket.dtype() != HostElementType::I32 || bucket.element_count() != x.len() {
            return Err(format!(
                "bucket is {:?} {:?}",
                bucket.dtype(),
                bucket.dims()
            ));
        }
        for (out, &v) in affine
            .as_f32_mut()
            .ok_or("affine is not f32")?
            .iter_mut()
            .zip(x)
        {
            *out = v * 2.0 + 1.0;
        }
        for (out, &v) in bucket
            .as_i32_mut()
            .ok_or("bucket is not i32")?
            .iter_mut()
            .zip(x)
        {
            *out = (v * 8.0).floor() as i32;
        }
        Ok(())
    }
}

struct Failing;

impl HostKernel for Failing {
    fn execute(&self, _: &[HostBuffer<'_>], _: &mut [HostBufferMut<'_>]) -> Result<(), String> {
        Err("the operand was refused on purpose (code 4711)".to_string())
    }
}

struct Panicking;

impl HostKernel for Panicking {
    fn execute(&self, _: &[HostBuffer<'_>], _: &mut [HostBufferMut<'_>]) -> Result<(), String> {
        panic!("a kernel bug (code 1234)")
    }
}

/// Copies its operand.
struct Identity;

impl HostKernel for Identity {
    fn execute(
        &self,
        args: &[HostBuffer<'_>],
        results: &mut [HostBufferMut<'_>],
    ) -> Result<(), String> {
        results[0].bytes_mut().copy_from_slice(args[0].bytes());
        Ok(())
    }
}

fn register(client: &Client, target: &str, kernel: &Arc<dyn HostKernel>) {
    register_host_kernel(client.plugin(), target, Arc::clone(kernel))
        .unwrap_or_else(|e| panic!("registering {target}: {e}"));
}

/// A program whose body is one custom call of `target` from `f32[len]` to `f32[len]`.
fn unary_program(target: &str, len: usize) -> String {
    format!(
        r#"module @unary {{
  func.func public @main(%x: tensor<{len}xf32>) -> tensor<{len}xf32> {{
    %0 = stablehlo.custom_call @{target}(%x) {{api_version = 4 : i32}} : (tensor<{len}xf32>) -> tensor<{len}xf32>
    return %0 : tensor<{len}xf32>
  }}
}}"#
    )
}

fn upload(client: &Client, data: &[f32], dims: &[i64]) -> Buffer {
    let device = client.first_device().unwrap();
    client.buffer_from_host(data, dims, &device).unwrap()
}

/// Executes and reads every output back as f32; the first error of either step.
fn run_f32(executable: &LoadedExecutable, args: &[&Buffer]) -> Result<Vec<Vec<f32>>, Error> {
    let outputs = executable.execute(args.iter().map(|b| ExecuteArg::Borrowed(b)).collect())?;
    outputs.iter().map(|b| b.to_host_vec::<f32>()).collect()
}

fn matmul_reference(x: &[f32], w: &[f32]) -> (Vec<f64>, Vec<f64>) {
    let mut y = vec![0f64; M * N];
    let mut magnitude = vec![0f64; M * N];
    for i in 0..M {
        for j in 0..N {
            for p in 0..K {
                let term = f64::from(x[i * K + p]) * f64::from(w[j * K + p]);
                y[i * N + j] += term;
                magnitude[i * N + j] += term.abs();
            }
        }
    }
    (y, magnitude)
}

#[test]
fn the_test_plugins_support_ffi_handlers() {
    on_each_plugin(|path, client| {
        client
            .plugin()
            .ffi_handlers_supported()
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    });
}

#[test]
fn a_host_matmul_runs_inside_a_compiled_program() {
    let kernel: Arc<dyn HostKernel> = Arc::new(MatmulTransposed);
    let program = format!(
        r#"module @host_matmul {{
  func.func public @main(%x: tensor<{M}x{K}xf32>, %w: tensor<{N}x{K}xf32>) -> tensor<{M}x{N}xf32> {{
    %y = stablehlo.custom_call @tlaloc.test.matmul(%x, %w) {{api_version = 4 : i32}} : (tensor<{M}x{K}xf32>, tensor<{N}x{K}xf32>) -> tensor<{M}x{N}xf32>
    %z = stablehlo.negate %y : tensor<{M}x{N}xf32>
    return %z : tensor<{M}x{N}xf32>
  }}
}}"#
    );
    on_each_plugin(|_, client| {
        register(client, "tlaloc.test.matmul", &kernel);
        let executable = compile(client, &program);
        let x = values(11, M * K);
        let w = values(12, N * K);
        let x_buf = upload(client, &x, &[M as i64, K as i64]);
        let w_buf = upload(client, &w, &[N as i64, K as i64]);
        let out = run_f32(&executable, &[&x_buf, &w_buf]).unwrap();
        let (expected, magnitude) = matmul_reference(&x, &w);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].len(), M * N);
        for (i, (&got, (&want, &mag))) in out[0]
            .iter()
            .zip(expected.iter().zip(&magnitude))
            .enumerate()
        {
            // f32 summation of K products: each step rounds by at most eps relative to the
            // running sum, bounded by the sum of magnitudes.
            let tolerance = K as f64 * f64::from(f32::EPSILON) * mag;
            assert!(
                (f64::from(-got) - want).abs() <= tolerance,
                "element {i}: got {}, expected {want} (tolerance {tolerance})",
                -got
            );
        }
        // A second execution reuses the compiled custom call.
        let again = run_f32(&executable, &[&x_buf, &w_buf]).unwrap();
        assert_eq!(again, out);
    });
}

#[test]
fn a_kernel_with_two_results_of_different_types() {
    let kernel: Arc<dyn HostKernel> = Arc::new(AffineAndBucket);
    const LEN: usize = 37;
    let program = format!(
        r#"module @two_results {{
  func.func public @main(%x: tensor<{LEN}xf32>) -> (tensor<{LEN}xf32>, tensor<{LEN}xi32>) {{
    %0:2 = stablehlo.custom_call @tlaloc.test.affine_bucket(%x) {{api_version = 4 : i32}} : (tensor<{LEN}xf32>) -> (tensor<{LEN}xf32>, tensor<{LEN}xi32>)
    return %0#0, %0#1 : tensor<{LEN}xf32>, tensor<{LEN}xi32>
  }}
}}"#
    );
    on_each_plugin(|_, client| {
        register(client, "tlaloc.test.affine_bucket", &kernel);
        let executable = compile(client, &program);
        let x = values(21, LEN);
        let x_buf = upload(client, &x, &[LEN as i64]);
        let outputs = executable
            .execute(vec![ExecuteArg::Borrowed(&x_buf)])
            .unwrap();
        assert_eq!(outputs.len(), 2);
        let affine = outputs[0].to_host_vec::<f32>().unwrap();
        let bucket = outputs[1].to_host_vec::<i32>().unwrap();
        let want_affine: Vec<f32> = x.iter().map(|v| v * 2.0 + 1.0).collect();
        let want_bucket: Vec<i32> = x.iter().map(|v| (v * 8.0).floor() as i32).collect();
        // The same f32 operations in the same order: bit-identical.
        assert_eq!(affine, want_affine);
        assert_eq!(bucket, want_bucket);
    });
}

#[test]
fn a_kernel_error_fails_the_execution_with_its_message() {
    let kernel: Arc<dyn HostKernel> = Arc::new(Failing);
    on_each_plugin(|path, client| {
        register(client, "tlaloc.test.failing", &kernel);
        let executable = compile(client, &unary_program("tlaloc.test.failing", 4));
        let x = upload(client, &[1.0, 2.0, 3.0, 4.0], &[4]);
        let error = run_f32(&executable, &[&x]).expect_err(&format!(
            "{}: a failing kernel must fail the execution",
            path.display()
        ));
        let message = error.to_string();
        assert!(
            message.contains("tlaloc.test.failing")
                && message.contains("the operand was refused on purpose (code 4711)"),
            "{}: {message}",
            path.display()
        );
    });
}

#[test]
fn a_panicking_kernel_fails_the_execution_and_the_process_lives() {
    let kernel: Arc<dyn HostKernel> = Arc::new(Panicking);
    on_each_plugin(|path, client| {
        register(client, "tlaloc.test.panicking", &kernel);
        let executable = compile(client, &unary_program("tlaloc.test.panicking", 3));
        let x = upload(client, &[1.0, 2.0, 3.0], &[3]);
        let error = run_f32(&executable, &[&x]).expect_err(&format!(
            "{}: a panicking kernel must fail the execution",
            path.display()
        ));
        let message = error.to_string();
        assert!(
            message.contains("panicked") && message.contains("a kernel bug (code 1234)"),
            "{}: {message}",
            path.display()
        );
        // The client still works after the failed execution.
        let identity: Arc<dyn HostKernel> = Arc::new(Identity);
        register(client, "tlaloc.test.after_panic", &identity);
        let executable = compile(client, &unary_program("tlaloc.test.after_panic", 3));
        assert_eq!(
            run_f32(&executable, &[&x]).unwrap(),
            vec![vec![1.0, 2.0, 3.0]]
        );
    });
}

#[test]
fn an_unregistered_target_fails_to_compile() {
    on_each_plugin(|path, client| {
        let error = client
            .compile(
                &unary_program("tlaloc.test.never_registered", 2),
                &CompileOptions::default(),
            )
            .err()
            .unwrap_or_else(|| panic!("{}: compiled an unknown custom call", path.display()));
        let message = error.to_string();
        assert!(
            message.contains("tlaloc.test.never_registered"),
            "{}: {message}",
            path.display()
        );
    });
}

#[test]
fn registration_is_idempotent_and_a_different_kernel_is_refused() {
    let kernel: Arc<dyn HostKernel> = Arc::new(Identity);
    on_each_plugin(|path, client| {
        register(client, "tlaloc.test.idempotent", &kernel);
        register(client, "tlaloc.test.idempotent", &kernel);
        let executable = compile(client, &unary_program("tlaloc.test.idempotent", 2));
        let x = upload(client, &[5.0, -6.0], &[2]);
        assert_eq!(run_f32(&executable, &[&x]).unwrap(), vec![vec![5.0, -6.0]]);
        let other: Arc<dyn HostKernel> = Arc::new(Identity);
        match register_host_kernel(client.plugin(), "tlaloc.test.idempotent", other) {
            Err(Error::HostKernelConflict { target, .. }) => {
                assert_eq!(target, "tlaloc.test.idempotent")
            }
            other => panic!("{}: expected a conflict, got {other:?}", path.display()),
        }
        // The registered kernel still answers.
        assert_eq!(run_f32(&executable, &[&x]).unwrap(), vec![vec![5.0, -6.0]]);
    });
}

/// Widens a bf16 operand to f32 from its raw bits (bf16 is the top half of an f32).
struct WidenBf16;

impl HostKernel for WidenBf16 {
    fn execute(
        &self,
        args: &[HostBuffer<'_>],
        results: &mut [HostBufferMut<'_>],
    ) -> Result<(), String> {
        if args[0].dtype() != HostElementType::Bf16 {
            return Err(format!("operand is {:?}", args[0].dtype()));
        }
        let bits = args[0].as_u16().ok_or("operand is not 16-bit")?;
        let out = results[0].as_f32_mut().ok_or("result is not f32")?;
        for (o, &b) in out.iter_mut().zip(bits) {
            *o = f32::from_bits(u32::from(b) << 16);
        }
        Ok(())
    }
}

#[test]
fn a_bf16_operand_arrives_as_its_raw_bits() {
    let kernel: Arc<dyn HostKernel> = Arc::new(WidenBf16);
    const LEN: usize = 9;
    let program = format!(
        r#"module @widen {{
  func.func public @main(%x: tensor<{LEN}xbf16>) -> tensor<{LEN}xf32> {{
    %0 = stablehlo.custom_call @tlaloc.test.widen_bf16(%x) {{api_version = 4 : i32}} : (tensor<{LEN}xbf16>) -> tensor<{LEN}xf32>
    return %0 : tensor<{LEN}xf32>
  }}
}}"#
    );
    on_each_plugin(|_, client| {
        register(client, "tlaloc.test.widen_bf16", &kernel);
        let executable = compile(client, &program);
        let x: Vec<half::bf16> = values(31, LEN)
            .into_iter()
            .map(|v| half::bf16::from_f32(v * 100.0))
            .collect();
        let device = client.first_device().unwrap();
        let x_buf = client.buffer_from_host(&x, &[LEN as i64], &device).unwrap();
        let out = run_f32(&executable, &[&x_buf]).unwrap();
        // Widening bf16 to f32 is exact.
        let want: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
        assert_eq!(out, vec![want]);
    });
}

#[test]
fn a_result_aliasing_its_operand_is_refused_by_name() {
    let kernel: Arc<dyn HostKernel> = Arc::new(Identity);
    let program = r#"module @aliased {
  func.func public @main(%x: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.custom_call @tlaloc.test.aliased(%x) {api_version = 4 : i32, output_operand_aliases = [#stablehlo.output_operand_alias<output_tuple_indices = [], operand_index = 0, operand_tuple_indices = []>]} : (tensor<4xf32>) -> tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}"#;
    on_each_plugin(|path, client| {
        register(client, "tlaloc.test.aliased", &kernel);
        let executable = compile(client, program);
        let x = upload(client, &[1.0, 2.0, 3.0, 4.0], &[4]);
        let error = run_f32(&executable, &[&x]).expect_err(&format!(
            "{}: an aliased result must be refused",
            path.display()
        ));
        let message = error.to_string();
        assert!(
            message.contains("tlaloc.test.aliased")
                && message.contains("result 0 shares memory with operand 0"),
            "{}: {message}",
            path.display()
        );
    });
}

#[test]
fn a_serialized_executable_calls_the_kernel_after_loading() {
    let kernel: Arc<dyn HostKernel> = Arc::new(AffineAndBucket);
    const LEN: usize = 5;
    let program = format!(
        r#"module @reloaded {{
  func.func public @main(%x: tensor<{LEN}xf32>) -> (tensor<{LEN}xf32>, tensor<{LEN}xi32>) {{
    %0:2 = stablehlo.custom_call @tlaloc.test.reloaded(%x) {{api_version = 4 : i32}} : (tensor<{LEN}xf32>) -> (tensor<{LEN}xf32>, tensor<{LEN}xi32>)
    return %0#0, %0#1 : tensor<{LEN}xf32>, tensor<{LEN}xi32>
  }}
}}"#
    );
    on_each_plugin(|_, client| {
        register(client, "tlaloc.test.reloaded", &kernel);
        let bytes = compile(client, &program).serialize().unwrap();
        let executable = client
            .deserialize_executable(&bytes, &CompileOptions::default())
            .unwrap();
        let x = [0.5f32, -0.25, 0.0, 0.75, -1.0];
        let x_buf = upload(client, &x, &[LEN as i64]);
        let outputs = executable
            .execute(vec![ExecuteArg::Borrowed(&x_buf)])
            .unwrap();
        assert_eq!(
            outputs[0].to_host_vec::<f32>().unwrap(),
            vec![2.0, 0.5, 1.0, 2.5, -1.0]
        );
        assert_eq!(
            outputs[1].to_host_vec::<i32>().unwrap(),
            vec![4, -2, 0, 6, -8]
        );
    });
}
