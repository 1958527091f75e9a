//! Every malformed op is refused when built, with an error naming the op and the mismatch.

use tlaloc_hlo::{
    CompareDirection, CompareType, DotDims, FunctionBuilder, GatherSpec, HloError, Precision,
    ReduceOp, ScalarType, ScatterSpec, ScatterUpdate, TensorType, Value,
};

use crate::support::embedding_spec;

fn ty(dtype: ScalarType, dims: &[usize]) -> TensorType {
    TensorType::new(dtype, dims)
}

/// Asserts `r` is a refusal by `op` whose message contains every one of `needles`.
#[track_caller]
fn refused<T: std::fmt::Debug>(r: Result<T, HloError>, op: &str, needles: &[&str]) {
    let err = r.expect_err("the builder accepted a malformed op");
    match &err {
        HloError::Invalid { op: got, .. } | HloError::ForeignValue { op: got, .. } => {
            assert_eq!(*got, op, "wrong op named in {err}")
        }
        HloError::Signature { .. } => panic!("expected a refusal by {op}, got {err}"),
    }
    let text = err.to_string();
    assert!(text.starts_with(&format!("stablehlo.{op}: ")), "{text}");
    for n in needles {
        assert!(text.contains(n), "{text:?} does not mention {n:?}");
    }
}

#[track_caller]
fn signature_refused<T: std::fmt::Debug>(r: Result<T, HloError>, needles: &[&str]) {
    let err = r.expect_err("the builder accepted a malformed signature");
    assert!(matches!(err, HloError::Signature { .. }), "{err}");
    let text = err.to_string();
    for n in needles {
        assert!(text.contains(n), "{text:?} does not mention {n:?}");
    }
}

fn two_args(a: TensorType, b: TensorType) -> (FunctionBuilder, Value, Value) {
    let mut f = FunctionBuilder::new("t");
    let x = f.arg(a);
    let y = f.arg(b);
    (f, x, y)
}

#[test]
fn elementwise_refuses_mismatched_or_unsuited_types() {
    let (mut f, x, y) = two_args(ty(ScalarType::F32, &[2, 3]), ty(ScalarType::F32, &[3, 2]));
    refused(f.add(x, y), "add", &["tensor<2x3xf32>", "tensor<3x2xf32>"]);
    let (mut f, x, y) = two_args(ty(ScalarType::F32, &[2]), ty(ScalarType::Bf16, &[2]));
    refused(f.mul(x, y), "multiply", &["tensor<2xbf16>"]);
    let (mut f, i, p) = two_args(ty(ScalarType::I32, &[2]), ty(ScalarType::Pred, &[2]));
    refused(f.exp(i), "exponential", &["tensor<2xi32>", "float"]);
    refused(f.abs(p), "abs", &["i1"]);
    refused(f.div(p, p), "divide", &["tensor<2xi1>"]);
    let x = f.arg(ty(ScalarType::F32, &[2]));
    refused(f.and(x, x), "and", &["f32"]);
}

#[test]
fn compare_refuses_a_compare_type_unsuited_to_the_dtype() {
    let (mut f, x, y) = two_args(ty(ScalarType::F32, &[2]), ty(ScalarType::F32, &[2]));
    refused(
        f.compare_as(x, CompareDirection::Lt, y, CompareType::Signed),
        "compare",
        &["SIGNED", "FLOAT"],
    );
    let u = f.arg(ty(ScalarType::U8, &[2]));
    refused(
        f.compare_as(u, CompareDirection::Lt, u, CompareType::Signed),
        "compare",
        &["UNSIGNED"],
    );
}

#[test]
fn select_and_clamp_check_predicate_and_bounds() {
    let (mut f, x, y) = two_args(ty(ScalarType::F32, &[2, 2]), ty(ScalarType::F32, &[2, 2]));
    refused(f.select(x, x, y), "select", &["tensor<2x2xi1>"]);
    let p = f.arg(ty(ScalarType::Pred, &[2]));
    refused(f.select(p, x, y), "select", &["tensor<2xi1>"]);
    let lo = f.arg(ty(ScalarType::F32, &[2]));
    refused(f.clamp(lo, x, y), "clamp", &["min", "tensor<2xf32>"]);
}

#[test]
fn shape_ops_check_dims() {
    let mut f = FunctionBuilder::new("t");
    let x = f.arg(ty(ScalarType::F32, &[2, 3]));
    refused(
        f.broadcast_in_dim(x, [2, 4], [0, 1]),
        "broadcast_in_dim",
        &["size 3", "size 4"],
    );
    refused(
        f.broadcast_in_dim(x, [2, 3], [0]),
        "broadcast_in_dim",
        &["needs 2"],
    );
    refused(
        f.broadcast_in_dim(x, [3, 2, 3], [2, 2]),
        "broadcast_in_dim",
        &["twice"],
    );
    refused(f.broadcast_to(x, [3]), "broadcast_in_dim", &["lower rank"]);
    refused(f.reshape(x, [5]), "reshape", &["element counts"]);
    refused(f.transpose(x, [0, 0]), "transpose", &["twice"]);
    refused(f.transpose(x, [1]), "transpose", &["needs 2"]);
    refused(
        f.slice(x, [0, 1], [2, 4], [1, 1]),
        "slice",
        &["dim 1", "limit 4"],
    );
    refused(f.slice(x, [0, 0], [2, 3], [1, 0]), "slice", &["stride"]);
    let y = f.arg(ty(ScalarType::F32, &[3, 3]));
    refused(
        f.concatenate(&[x, y], 1),
        "concatenate",
        &["operand 1", "tensor<3x3xf32>"],
    );
    refused(f.concatenate(&[x, y], 2), "concatenate", &["dimension 2"]);
    refused(f.concatenate(&[], 0), "concatenate", &["at least one"]);
}

#[test]
fn dot_general_refuses_mismatched_contracting_dims() {
    let (mut f, a, b) = two_args(ty(ScalarType::F32, &[2, 3]), ty(ScalarType::F32, &[4, 5]));
    let dims = DotDims::contracting(1, 0);
    refused(
        f.dot_general(a, b, &dims, Some(Precision::Highest), None),
        "dot_general",
        &[
            "contracting dims differ",
            "lhs dim 1",
            "is 3",
            "rhs dim 0",
            "is 4",
        ],
    );
    let dims = DotDims {
        lhs_batch: vec![0],
        rhs_batch: vec![],
        ..DotDims::default()
    };
    refused(
        f.dot_general(a, b, &dims, None, None),
        "dot_general",
        &["batching"],
    );
    let dims = DotDims {
        lhs_contract: vec![1, 1],
        rhs_contract: vec![0, 1],
        ..DotDims::default()
    };
    refused(
        f.dot_general(a, b, &dims, None, None),
        "dot_general",
        &["twice"],
    );
    let (mut f, a, b) = two_args(ty(ScalarType::Bf16, &[2, 3]), ty(ScalarType::Bf16, &[3, 4]));
    let dims = DotDims::contracting(1, 0);
    refused(
        f.dot_general(a, b, &dims, None, Some(ScalarType::I32)),
        "dot_general",
        &["i32", "float"],
    );
    let c = f.arg(ty(ScalarType::F32, &[3, 4]));
    refused(
        f.dot_general(a, c, &dims, None, None),
        "dot_general",
        &["share one"],
    );
}

#[test]
fn reductions_check_init_dims_and_index_type() {
    let mut f = FunctionBuilder::new("t");
    let x = f.arg(ty(ScalarType::F32, &[2, 3]));
    let wrong_init = f.scalar(0i32);
    refused(
        f.reduce(x, wrong_init, [1], ReduceOp::Sum),
        "reduce",
        &["tensor<i32>", "tensor<f32>"],
    );
    refused(
        f.reduce_sum(x, [2]),
        "reduce",
        &["dimension 2", "rank is 2"],
    );
    refused(f.reduce_max(x, [0, 0]), "reduce", &["twice"]);
    refused(
        f.argmax(x, 1, ScalarType::F32),
        "reduce",
        &["index type f32"],
    );
    refused(f.argmax(x, 2, ScalarType::I32), "reduce", &["axis 2"]);
}

#[test]
fn constants_check_counts_and_representability() {
    let mut f = FunctionBuilder::new("t");
    refused(
        f.constant([2, 2], vec![1.0f32; 3]),
        "constant",
        &["4 elements", "3 values"],
    );
    refused(
        f.full(&ty(ScalarType::I32, &[2]), 0.5),
        "constant",
        &["0.5", "i32"],
    );
    refused(
        f.full(&ty(ScalarType::U8, &[2]), -1.0),
        "constant",
        &["ui8"],
    );
    refused(
        f.iota(ty(ScalarType::I32, &[4]), 1),
        "iota",
        &["iota_dimension 1"],
    );
    refused(f.iota(ty(ScalarType::Pred, &[4]), 0), "iota", &["i1"]);
}

#[test]
fn gather_checks_dimension_numbers() {
    let (mut f, table, ids) = two_args(ty(ScalarType::F32, &[5, 3]), ty(ScalarType::I32, &[4]));
    f.gather(table, ids, &embedding_spec())
        .expect("the embedding gather is valid");
    type Corrupt = fn(&mut GatherSpec);
    let cases: [(Corrupt, &[&str]); 5] = [
        (|s| s.slice_sizes = vec![1, 4], &["slice_sizes [1, 4]"]),
        (
            |s| s.slice_sizes = vec![2, 3],
            &["collapsed slice dim 0", "size 2"],
        ),
        (
            |s| s.start_index_map = vec![0, 1],
            &["start_index_map", "has 1"],
        ),
        (|s| s.offset_dims = vec![1, 2], &["offset_dims"]),
        (|s| s.index_vector_dim = 2, &["index_vector_dim 2"]),
    ];
    for (corrupt, needles) in cases {
        let mut spec = embedding_spec();
        corrupt(&mut spec);
        refused(f.gather(table, ids, &spec), "gather", needles);
    }
    let float_ids = f.arg(ty(ScalarType::F32, &[4]));
    refused(
        f.gather(table, float_ids, &embedding_spec()),
        "gather",
        &["integer"],
    );
}

fn kv_write_spec() -> ScatterSpec {
    ScatterSpec::leading_dim(vec![1], ScatterUpdate::Replace)
}

#[test]
fn scatter_checks_dimension_numbers() {
    let mut f = FunctionBuilder::new("t");
    let pool = f.arg(ty(ScalarType::F32, &[6, 3]));
    let slots = f.arg(ty(ScalarType::I32, &[4, 1]));
    let rows = f.arg(ty(ScalarType::F32, &[4, 3]));
    f.scatter(pool, slots, rows, &kv_write_spec())
        .expect("the KV write is valid");
    let updates: [(TensorType, &[&str]); 3] = [
        (ty(ScalarType::F32, &[4, 4]), &["window dim 1", "size 4"]),
        (ty(ScalarType::F32, &[5, 3]), &["[5]", "[4]"]),
        (ty(ScalarType::Bf16, &[4, 3]), &["element type"]),
    ];
    for (update, needles) in updates {
        let update = f.arg(update);
        refused(
            f.scatter(pool, slots, update, &kv_write_spec()),
            "scatter",
            needles,
        );
    }
    type Corrupt = fn(&mut ScatterSpec);
    let cases: [(Corrupt, &[&str]); 2] = [
        (|s| s.inserted_window_dims = vec![], &["rank 2"]),
        (
            |s| s.scatter_dims_to_operand_dims = vec![0, 1],
            &["scatter_dims_to_operand_dims"],
        ),
    ];
    for (corrupt, needles) in cases {
        let mut spec = kv_write_spec();
        corrupt(&mut spec);
        refused(f.scatter(pool, slots, rows, &spec), "scatter", needles);
    }
}

#[test]
fn dynamic_slices_check_start_indices_and_sizes() {
    let mut f = FunctionBuilder::new("t");
    let x = f.arg(ty(ScalarType::F32, &[4, 5]));
    let i = f.scalar(1i32);
    let j64 = f.scalar(1i64);
    let v = f.arg(ty(ScalarType::I32, &[1]));
    refused(
        f.dynamic_slice(x, &[i], [2, 2]),
        "dynamic_slice",
        &["1 start indices", "needs 2"],
    );
    refused(
        f.dynamic_slice(x, &[i, v], [2, 2]),
        "dynamic_slice",
        &["start index 1", "tensor<1xi32>"],
    );
    refused(
        f.dynamic_slice(x, &[i, j64], [2, 2]),
        "dynamic_slice",
        &["one type"],
    );
    refused(
        f.dynamic_slice(x, &[i, i], [2, 6]),
        "dynamic_slice",
        &["slice_sizes [2, 6]"],
    );
    let big = f.arg(ty(ScalarType::F32, &[5, 5]));
    refused(
        f.dynamic_update_slice(x, big, &[i, i]),
        "dynamic_update_slice",
        &["tensor<5x5xf32>"],
    );
}

#[test]
fn values_of_another_builder_are_refused() {
    let mut a = FunctionBuilder::new("a");
    let mut b = FunctionBuilder::new("b");
    let x = a.arg(ty(ScalarType::F32, &[2]));
    let y = b.arg(ty(ScalarType::F32, &[2]));
    refused(b.add(x, y), "add", &["not made by this function builder"]);
}

#[test]
fn signatures_check_donation_names_and_results() {
    let mut f = FunctionBuilder::new("t");
    let x = f.arg(ty(ScalarType::F32, &[2]));
    let y = f.exp(x).unwrap();
    signature_refused(f.donate(y, 0), &["only arguments"]);
    f.donate(x, 0).unwrap();
    signature_refused(f.donate(x, 0), &["already donated"]);
    signature_refused(
        f.arg_named("has space", ty(ScalarType::F32, &[2])),
        &["\"has space\""],
    );
    f.arg_named("tokenIds", ty(ScalarType::I32, &[2])).unwrap();
    signature_refused(
        f.arg_named("tokenIds", ty(ScalarType::I32, &[2])),
        &["twice"],
    );
    let s = f.reduce_sum(y, [0]).unwrap();
    signature_refused(
        FunctionBuilder::new("t").finish(&[]),
        &["at least one result"],
    );

    let mut g = FunctionBuilder::new("t");
    let p = g.arg(ty(ScalarType::F32, &[2]));
    g.donate(p, 1).unwrap();
    let q = g.exp(p).unwrap();
    signature_refused(g.finish(&[q]), &["result 1", "only 1 results"]);

    // `x` is donated to result 0, which is a scalar here.
    signature_refused(f.finish(&[s]), &["argument 0", "tensor<f32>"]);

    let mut h = FunctionBuilder::new("1bad name");
    let z = h.arg(ty(ScalarType::F32, &[2]));
    signature_refused(h.finish(&[z]), &["module name"]);
}

#[test]
fn custom_call_refuses_a_malformed_target_or_attribute() {
    let mut f = FunctionBuilder::new("m");
    let x = f.arg(ty(ScalarType::F32, &[2]));
    let out = ty(ScalarType::F32, &[2]);
    refused(
        f.custom_call("", &[x], out.clone(), &[]),
        "custom_call",
        &["target \"\""],
    );
    refused(
        f.custom_call("tlaloc cpu", &[x], out.clone(), &[]),
        "custom_call",
        &["\"tlaloc cpu\""],
    );
    refused(
        f.custom_call(
            "tlaloc.cpu.k",
            &[x],
            out.clone(),
            &[("bad-name", tlaloc_hlo::CustomCallAttr::I32(1))],
        ),
        "custom_call",
        &["\"bad-name\""],
    );
    refused(
        f.custom_call(
            "tlaloc.cpu.k",
            &[x],
            out,
            &[
                ("rows", tlaloc_hlo::CustomCallAttr::I32(1)),
                ("rows", tlaloc_hlo::CustomCallAttr::I32(2)),
            ],
        ),
        "custom_call",
        &["\"rows\" given twice"],
    );
}

#[test]
fn bitcast_convert_checks_widths() {
    let mut f = FunctionBuilder::new("t");
    let bytes = f.arg(ty(ScalarType::U8, &[3, 4]));
    refused(
        f.bitcast_convert(bytes, ScalarType::F16),
        "bitcast_convert",
        &["tensor<3x4xui8>", "last dim must be 2"],
    );
    let p = f.arg(ty(ScalarType::Pred, &[2]));
    refused(
        f.bitcast_convert(p, ScalarType::I8),
        "bitcast_convert",
        &["i1"],
    );
    let ok = f.bitcast_convert(bytes, ScalarType::F32).unwrap();
    assert_eq!(f.ty(ok).unwrap(), &ty(ScalarType::F32, &[3]));
}

#[test]
fn shifts_refuse_floats_and_mismatched_types() {
    let (mut f, x, y) = two_args(ty(ScalarType::F32, &[2]), ty(ScalarType::U8, &[2]));
    refused(
        f.shift_right_logical(x, x),
        "shift_right_logical",
        &["f32", "integer"],
    );
    refused(
        f.shift_left(x, y),
        "shift_left",
        &["tensor<2xf32>", "tensor<2xui8>"],
    );
}
