//! Compiles each case's printed text on every test plugin, runs it, and compares the outputs
//! with the case's Rust reference.

use std::path::PathBuf;
use std::sync::OnceLock;

use tlaloc_hlo::{ScalarType, TensorType};
use tlaloc_pjrt::{Buffer, Client, CompileOptions, ElementType, ExecuteArg};

use crate::support::{Case, Tensor, compare};

/// One client per test plugin, shared by all tests of this binary.
fn clients() -> &'static [(PathBuf, Client)] {
    static CLIENTS: OnceLock<Vec<(PathBuf, Client)>> = OnceLock::new();
    CLIENTS.get_or_init(tlaloc_pjrt::testing::test_clients)
}

fn element_type(dtype: ScalarType) -> ElementType {
    match dtype {
        ScalarType::F32 => ElementType::F32,
        ScalarType::Bf16 => ElementType::BF16,
        ScalarType::F16 => ElementType::F16,
        ScalarType::I32 => ElementType::S32,
        ScalarType::I64 => ElementType::S64,
        ScalarType::I8 => ElementType::S8,
        ScalarType::U8 => ElementType::U8,
        ScalarType::F8E4M3FN => ElementType::F8E4M3FN,
        ScalarType::Pred => ElementType::Pred,
    }
}

fn dims_i64(dims: &[usize]) -> Vec<i64> {
    dims.iter().map(|&d| d as i64).collect()
}

/// Runs `case` on one client; `Err` describes the first way it went wrong.
fn run_on(client: &Client, case: &Case, text: &str) -> Result<(), String> {
    let exe = client
        .compile(text, &CompileOptions::default())
        .map_err(|e| format!("compile failed: {e}"))?;
    let device = client.first_device().map_err(|e| e.to_string())?;
    let donated: Vec<bool> = case
        .module
        .arguments()
        .iter()
        .map(|a| a.aliasing_output.is_some())
        .collect();
    let mut buffers = Vec::new();
    for input in &case.inputs {
        let b = client
            .buffer_from_host_bytes(
                &input.to_bytes(),
                element_type(input.data.dtype()),
                &dims_i64(&input.dims),
                &device,
            )
            .map_err(|e| format!("upload of {}: {e}", input.ty()))?;
        buffers.push(b);
    }
    // Where each donated input lives, to check that its output reuses the memory.
    let mut aliased = Vec::new();
    for (i, a) in case.module.arguments().iter().enumerate() {
        if let Some(out) = a.aliasing_output {
            let ptr = buffers[i]
                .unsafe_device_pointer()
                .map_err(|e| e.to_string())?;
            aliased.push((i, out, ptr));
        }
    }
    // Donated buffers move into the call; the others are lent.
    let mut moved: Vec<Option<Buffer>> = Vec::new();
    let mut kept: Vec<Option<Buffer>> = Vec::new();
    for (b, &d) in buffers.into_iter().zip(&donated) {
        let (m, k) = if d { (Some(b), None) } else { (None, Some(b)) };
        moved.push(m);
        kept.push(k);
    }
    let args: Vec<ExecuteArg<'_>> = moved
        .iter_mut()
        .zip(&kept)
        .map(|(m, k)| match (m.take(), k) {
            (Some(b), _) => ExecuteArg::Donated(b),
            (None, Some(b)) => ExecuteArg::Borrowed(b),
            (None, None) => unreachable!("each input is either moved or kept"),
        })
        .collect();
    let outputs = exe
        .execute(args)
        .map_err(|e| format!("execute failed: {e}"))?;
    if outputs.len() != case.expected.len() {
        return Err(format!(
            "{} outputs, the reference has {}",
            outputs.len(),
            case.expected.len()
        ));
    }
    let mut problems = Vec::new();
    for (i, out, ptr) in aliased {
        let got = outputs[out]
            .unsafe_device_pointer()
            .map_err(|e| e.to_string())?;
        if got != ptr {
            problems.push(format!(
                "output {out} does not reuse the memory of donated argument {i}"
            ));
        }
    }
    for (k, (out, want)) in outputs.iter().zip(&case.expected).enumerate() {
        let ty: TensorType = want.ty();
        let dims = out.dims().map_err(|e| e.to_string())?;
        let et = out.element_type().map_err(|e| e.to_string())?;
        if dims != dims_i64(&want.dims) || et != element_type(ty.dtype) {
            problems.push(format!("output {k}: {et:?}{dims:?}, the reference is {ty}"));
            continue;
        }
        let mut bytes = vec![0u8; ty.element_count().unwrap() * ty.dtype.byte_size()];
        out.copy_to_host_bytes(&mut bytes)
            .map_err(|e| format!("readback of output {k}: {e}"))?;
        let got = Tensor::from_bytes(&ty, &bytes);
        if let Some(m) = compare(&got, want, case.tolerance) {
            problems.push(format!("output {k} ({ty}): {m}"));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
}

/// Runs the case on every test plugin; fails naming each plugin that disagreed.
pub fn run_case(name: &str, make: fn() -> Case) {
    let case = make();
    let text = case.module.to_text();
    let failures: Vec<String> = clients()
        .iter()
        .filter_map(|(path, client)| {
            run_on(client, &case, &text)
                .err()
                .map(|e| format!("on {}:\n{e}", path.display()))
        })
        .collect();
    assert!(
        failures.is_empty(),
        "case {name} (tolerance {:?}):\n{}\n\nprogram:\n{text}",
        case.tolerance,
        failures.join("\n\n")
    );
}
