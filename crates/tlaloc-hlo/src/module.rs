//! A finished function and its printer: StableHLO text in MLIR's generic op form inside a
//! pretty `func.func @main`.
//!
//! The generic form (`%0 = "stablehlo.add"(%a, %b) : (...) -> ...`) is the one spelling every
//! StableHLO parser reads without per-op custom syntax, so one small printer covers all ops.
//! Names are stable: `%argN` for arguments, `%N` for the N-th op (`%N#k` for its k-th result),
//! `%rN_*` inside op N's region; the same graph always prints the same bytes.

use std::fmt::{self, Write};

use crate::Value;
use crate::builder::{Def, Op, ValueInfo};
use crate::literal::{ConstData, Scalar};
use crate::ops::{CustomCallAttr, OpKind, ReduceBody, ReduceOp, ScatterUpdate};
use crate::sharding::Sharding;
use crate::types::{ScalarType, TensorType};

/// One argument of `@main`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Argument {
    /// Printed as the argument's location; for readers of the text.
    pub name: Option<String>,
    pub ty: TensorType,
    /// The result this argument's buffer is donated to (`tf.aliasing_output`).
    pub aliasing_output: Option<usize>,
    /// How the argument is laid out over the partitions of an SPMD program (`mhlo.sharding`).
    pub sharding: Option<Sharding>,
}

/// A finished, checked `module { func.func @main }`.
#[derive(Debug, Clone)]
pub struct Module {
    pub(crate) name: String,
    pub(crate) arguments: Vec<Argument>,
    pub(crate) values: Vec<ValueInfo>,
    pub(crate) ops: Vec<Op>,
    pub(crate) results: Vec<Value>,
    pub(crate) result_types: Vec<TensorType>,
    pub(crate) partitions: Option<usize>,
    pub(crate) result_shardings: Vec<Option<Sharding>>,
}

impl Module {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn arguments(&self) -> &[Argument] {
        &self.arguments
    }

    pub fn result_types(&self) -> &[TensorType] {
        &self.result_types
    }

    /// The partition count of an SPMD program (`mhlo.num_partitions`); `None` for a program of
    /// one device, whose text carries no partition attributes.
    pub fn partitions(&self) -> Option<usize> {
        self.partitions
    }

    /// Each result's sharding, index-aligned with [`Self::result_types`].
    pub fn result_shardings(&self) -> &[Option<Sharding>] {
        &self.result_shardings
    }

    /// Writes the StableHLO text of the module to `w`.
    pub fn write_to<W: Write>(&self, w: &mut W) -> fmt::Result {
        Printer { module: self, w }.module()
    }

    /// The StableHLO text of the module.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        // Writing to a String cannot fail.
        let _ = self.write_to(&mut s);
        s
    }
}

impl fmt::Display for Module {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write_to(f)
    }
}

struct Printer<'m, W> {
    module: &'m Module,
    w: &'m mut W,
}

/// `mhlo.sharding = "<HloSharding>"` for a tensor of rank `rank`.
fn sharding_attr(sharding: Sharding, rank: usize) -> String {
    format!("mhlo.sharding = {}", mlir_string(&sharding.hlo_text(rank)))
}

/// `array<i64: 1, 2>` (or `array<i64>` when empty).
fn i64_array(dims: &[usize]) -> String {
    if dims.is_empty() {
        return "array<i64>".to_owned();
    }
    let parts: Vec<String> = dims.iter().map(|d| d.to_string()).collect();
    format!("array<i64: {}>", parts.join(", "))
}

fn list(dims: &[usize]) -> String {
    let parts: Vec<String> = dims.iter().map(|d| d.to_string()).collect();
    format!("[{}]", parts.join(", "))
}

/// `name = [..]` fields of a StableHLO struct attribute, empty lists left out as its own
/// printer does.
fn struct_fields(fields: &[(&str, &[usize])]) -> Vec<String> {
    fields
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| format!("{k} = {}", list(v)))
        .collect()
}

fn type_list(types: &[&TensorType]) -> String {
    let parts: Vec<String> = types.iter().map(|t| t.to_string()).collect();
    parts.join(", ")
}

impl<W: Write> Printer<'_, W> {
    fn value_name(&self, v: Value) -> String {
        match self.module.values[v.index()].def {
            Def::Argument(i) => format!("%arg{i}"),
            Def::OpResult { op, result } => {
                if self.module.ops[op].results.len() == 1 {
                    format!("%{op}")
                } else {
                    format!("%{op}#{result}")
                }
            }
        }
    }

    fn ty(&self, v: Value) -> &TensorType {
        &self.module.values[v.index()].ty
    }

    fn module(&mut self) -> fmt::Result {
        let m = self.module;
        match m.partitions {
            None => writeln!(self.w, "module @{} {{", m.name)?,
            Some(n) => writeln!(
                self.w,
                "module @{} attributes {{mhlo.num_partitions = {n} : i32, mhlo.num_replicas = 1 : i32}} {{",
                m.name
            )?,
        }
        write!(self.w, "  func.func public @main(")?;
        for (i, a) in m.arguments.iter().enumerate() {
            if i > 0 {
                write!(self.w, ", ")?;
            }
            write!(self.w, "%arg{i}: {}", a.ty)?;
            // Attributes in MLIR's own (alphabetical) order.
            let mut attrs = Vec::new();
            if let Some(s) = a.sharding {
                attrs.push(sharding_attr(s, a.ty.rank()));
            }
            if let Some(out) = a.aliasing_output {
                attrs.push(format!("tf.aliasing_output = {out} : i32"));
            }
            if !attrs.is_empty() {
                write!(self.w, " {{{}}}", attrs.join(", "))?;
            }
            if let Some(name) = &a.name {
                write!(self.w, " loc(\"{name}\")")?;
            }
        }
        let results: Vec<String> = m
            .result_types
            .iter()
            .zip(&m.result_shardings)
            .map(|(ty, sharding)| match sharding {
                None => ty.to_string(),
                Some(s) => format!("{ty} {{{}}}", sharding_attr(*s, ty.rank())),
            })
            .collect();
        writeln!(self.w, ") -> ({}) {{", results.join(", "))?;
        let result_types: Vec<&TensorType> = m.result_types.iter().collect();
        for (n, op) in m.ops.iter().enumerate() {
            self.op(n, op)?;
        }
        let results: Vec<String> = m.results.iter().map(|&v| self.value_name(v)).collect();
        writeln!(
            self.w,
            "    \"func.return\"({}) : ({}) -> ()",
            results.join(", "),
            type_list(&result_types)
        )?;
        writeln!(self.w, "  }}")?;
        writeln!(self.w, "}}")
    }

    fn op(&mut self, n: usize, op: &Op) -> fmt::Result {
        let (name, attrs) = attributes(&op.kind, self.ty(op.results[0]));
        let result = if op.results.len() == 1 {
            format!("%{n}")
        } else {
            format!("%{n}:{}", op.results.len())
        };
        let operands: Vec<String> = op.operands.iter().map(|&v| self.value_name(v)).collect();
        write!(
            self.w,
            "    {result} = \"stablehlo.{name}\"({})",
            operands.join(", ")
        )?;
        match &op.kind {
            OpKind::Reduce { body, .. } => {
                let dtype = self.ty(op.operands[0]).dtype;
                match body {
                    ReduceBody::Single(combiner) => self.reduce_region(n, dtype, *combiner)?,
                    ReduceBody::ArgMax => {
                        let index_dtype = self.ty(op.operands[1]).dtype;
                        self.argmax_region(n, dtype, index_dtype)?
                    }
                }
            }
            OpKind::Scatter(spec) => {
                let dtype = self.ty(op.operands[0]).dtype;
                self.scatter_region(n, dtype, spec.update)?
            }
            _ => {}
        }
        if !attrs.is_empty() {
            write!(self.w, " {{{}}}", attrs.join(", "))?;
        }
        let operand_types: Vec<&TensorType> = op.operands.iter().map(|&v| self.ty(v)).collect();
        let result_types: Vec<&TensorType> = op.results.iter().map(|&v| self.ty(v)).collect();
        let results = if result_types.len() == 1 {
            result_types[0].to_string()
        } else {
            format!("({})", type_list(&result_types))
        };
        writeln!(self.w, " : ({}) -> {results}", type_list(&operand_types))
    }

    /// One scalar op inside a region: `%rN_out = "stablehlo.op"(args) {attrs} : (...) -> ...`.
    fn region_op(
        &mut self,
        out: &str,
        name: &str,
        args: &[(&str, ScalarType)],
        attrs: &str,
        result: ScalarType,
    ) -> fmt::Result {
        let names: Vec<&str> = args.iter().map(|(a, _)| *a).collect();
        let types: Vec<String> = args
            .iter()
            .map(|(_, t)| TensorType::scalar(*t).to_string())
            .collect();
        writeln!(
            self.w,
            "      {out} = \"stablehlo.{name}\"({}){attrs} : ({}) -> {}",
            names.join(", "),
            types.join(", "),
            TensorType::scalar(result)
        )
    }

    fn region_return(&mut self, values: &[(&str, ScalarType)]) -> fmt::Result {
        let names: Vec<&str> = values.iter().map(|(a, _)| *a).collect();
        let types: Vec<String> = values
            .iter()
            .map(|(_, t)| TensorType::scalar(*t).to_string())
            .collect();
        writeln!(
            self.w,
            "      \"stablehlo.return\"({}) : ({}) -> ()",
            names.join(", "),
            types.join(", ")
        )?;
        write!(self.w, "    }})")
    }

    fn region_header(&mut self, args: &[(&str, ScalarType)]) -> fmt::Result {
        let params: Vec<String> = args
            .iter()
            .map(|(a, t)| format!("{a}: {}", TensorType::scalar(*t)))
            .collect();
        writeln!(self.w, " ({{")?;
        writeln!(self.w, "    ^bb0({}):", params.join(", "))
    }

    fn reduce_region(&mut self, n: usize, t: ScalarType, combiner: ReduceOp) -> fmt::Result {
        let (a, b, out) = (format!("%r{n}_a"), format!("%r{n}_b"), format!("%r{n}_out"));
        let name = match combiner {
            ReduceOp::Sum => "add",
            ReduceOp::Max => "maximum",
            ReduceOp::Min => "minimum",
        };
        self.region_header(&[(&a, t), (&b, t)])?;
        self.region_op(&out, name, &[(&a, t), (&b, t)], "", t)?;
        self.region_return(&[(&out, t)])
    }

    fn scatter_region(&mut self, n: usize, t: ScalarType, update: ScatterUpdate) -> fmt::Result {
        let (old, new, sum) = (
            format!("%r{n}_old"),
            format!("%r{n}_new"),
            format!("%r{n}_sum"),
        );
        self.region_header(&[(&old, t), (&new, t)])?;
        match update {
            ScatterUpdate::Replace => self.region_return(&[(&new, t)]),
            ScatterUpdate::Add => {
                self.region_op(&sum, "add", &[(&old, t), (&new, t)], "", t)?;
                self.region_return(&[(&sum, t)])
            }
        }
    }

    /// The (value, index) combiner: `a` wins when it is greater, or NaN against a number, or
    /// tied (equal, or both NaN) with a lower index. It is associative and commutative, so
    /// any reduction order XLA picks yields the first index of the maximum.
    fn argmax_region(&mut self, n: usize, t: ScalarType, it: ScalarType) -> fmt::Result {
        let v = |s: &str| format!("%r{n}_{s}");
        let (av, ai, bv, bi) = (v("av"), v("ai"), v("bv"), v("bi"));
        let p = ScalarType::Pred;
        let cmp = |dir: &str, ty: ScalarType| {
            let ct = crate::ops::CompareType::for_dtype(ty).mlir_name();
            format!(
                " {{compare_type = #stablehlo<comparison_type {ct}>, comparison_direction = #stablehlo<comparison_direction {dir}>}}"
            )
        };
        self.region_header(&[(&av, t), (&ai, it), (&bv, t), (&bi, it)])?;
        let (gt, eq, lower) = (v("gt"), v("eq"), v("lower"));
        self.region_op(&gt, "compare", &[(&av, t), (&bv, t)], &cmp("GT", t), p)?;
        self.region_op(&eq, "compare", &[(&av, t), (&bv, t)], &cmp("EQ", t), p)?;
        self.region_op(
            &lower,
            "compare",
            &[(&ai, it), (&bi, it)],
            &cmp("LT", it),
            p,
        )?;
        let (better, tie) = if t.is_float() {
            let (anan, bnan, bnum) = (v("anan"), v("bnan"), v("bnum"));
            let (nanwin, better, bothnan, tie) = (v("nanwin"), v("better"), v("bothnan"), v("tie"));
            self.region_op(&anan, "compare", &[(&av, t), (&av, t)], &cmp("NE", t), p)?;
            self.region_op(&bnan, "compare", &[(&bv, t), (&bv, t)], &cmp("NE", t), p)?;
            self.region_op(&bnum, "not", &[(&bnan, p)], "", p)?;
            self.region_op(&nanwin, "and", &[(&anan, p), (&bnum, p)], "", p)?;
            self.region_op(&better, "or", &[(&gt, p), (&nanwin, p)], "", p)?;
            self.region_op(&bothnan, "and", &[(&anan, p), (&bnan, p)], "", p)?;
            self.region_op(&tie, "or", &[(&eq, p), (&bothnan, p)], "", p)?;
            (better, tie)
        } else {
            (gt, eq)
        };
        let (tiewin, pick, value, index) = (v("tiewin"), v("pick"), v("value"), v("index"));
        self.region_op(&tiewin, "and", &[(&tie, p), (&lower, p)], "", p)?;
        self.region_op(&pick, "or", &[(&better, p), (&tiewin, p)], "", p)?;
        self.region_op(&value, "select", &[(&pick, p), (&av, t), (&bv, t)], "", t)?;
        self.region_op(
            &index,
            "select",
            &[(&pick, p), (&ai, it), (&bi, it)],
            "",
            it,
        )?;
        self.region_return(&[(&value, t), (&index, it)])
    }
}

/// Writes `data` as a dense literal nested by `dims` (MLIR requires the nesting to match).
fn write_dense(out: &mut String, data: &ConstData, dims: &[usize], offset: &mut usize) {
    match dims.split_first() {
        None => {
            if let Some(s) = data.get(*offset) {
                let _ = write!(out, "{s}");
            }
            *offset += 1;
        }
        Some((&n, rest)) => {
            out.push('[');
            for i in 0..n {
                if i > 0 {
                    out.push_str(", ");
                }
                write_dense(out, data, rest, offset);
            }
            out.push(']');
        }
    }
}

/// The op's name and its attributes, in a fixed order.
fn attributes(kind: &OpKind, result: &TensorType) -> (&'static str, Vec<String>) {
    match kind {
        OpKind::Constant { data, splat } => {
            let mut literal = String::new();
            if result.element_count() == Some(0) {
                // MLIR infers `[]` as shape [0] whatever the type says; an empty tensor is
                // written as a splat, which has no elements to disagree about.
                let _ = write!(literal, "{}", Scalar::zero(result.dtype));
            } else if *splat {
                write_dense(&mut literal, data, &[], &mut 0);
            } else {
                write_dense(&mut literal, data, &result.dims, &mut 0);
            }
            (
                "constant",
                vec![format!("value = dense<{literal}> : {result}")],
            )
        }
        OpKind::Iota { dimension } => ("iota", vec![format!("iota_dimension = {dimension} : i64")]),
        OpKind::Unary(op) => (op.name(), vec![]),
        OpKind::Binary(op) => (op.name(), vec![]),
        OpKind::Compare {
            direction,
            compare_type,
        } => (
            "compare",
            vec![
                format!(
                    "compare_type = #stablehlo<comparison_type {}>",
                    compare_type.mlir_name()
                ),
                format!(
                    "comparison_direction = #stablehlo<comparison_direction {}>",
                    direction.mlir_name()
                ),
            ],
        ),
        OpKind::Select => ("select", vec![]),
        OpKind::Clamp => ("clamp", vec![]),
        OpKind::Convert => ("convert", vec![]),
        OpKind::BitcastConvert => ("bitcast_convert", vec![]),
        OpKind::OptimizationBarrier => ("optimization_barrier", vec![]),
        OpKind::BroadcastInDim { dimensions } => (
            "broadcast_in_dim",
            vec![format!("broadcast_dimensions = {}", i64_array(dimensions))],
        ),
        OpKind::Reshape => ("reshape", vec![]),
        OpKind::Transpose { permutation } => (
            "transpose",
            vec![format!("permutation = {}", i64_array(permutation))],
        ),
        OpKind::DotGeneral { dims, precision } => {
            let fields = struct_fields(&[
                ("lhs_batching_dimensions", &dims.lhs_batch),
                ("rhs_batching_dimensions", &dims.rhs_batch),
                ("lhs_contracting_dimensions", &dims.lhs_contract),
                ("rhs_contracting_dimensions", &dims.rhs_contract),
            ]);
            let mut attrs = vec![format!(
                "dot_dimension_numbers = #stablehlo.dot<{}>",
                fields.join(", ")
            )];
            if let Some(p) = precision {
                let p = format!("#stablehlo<precision {}>", p.mlir_name());
                attrs.push(format!("precision_config = [{p}, {p}]"));
            }
            ("dot_general", attrs)
        }
        OpKind::Reduce { dimensions, .. } => (
            "reduce",
            vec![format!("dimensions = {}", i64_array(dimensions))],
        ),
        OpKind::Gather(spec) => {
            let mut fields = struct_fields(&[
                ("offset_dims", &spec.offset_dims),
                ("collapsed_slice_dims", &spec.collapsed_slice_dims),
                ("start_index_map", &spec.start_index_map),
            ]);
            fields.push(format!("index_vector_dim = {}", spec.index_vector_dim));
            (
                "gather",
                vec![
                    format!(
                        "dimension_numbers = #stablehlo.gather<{}>",
                        fields.join(", ")
                    ),
                    format!("indices_are_sorted = {}", spec.indices_are_sorted),
                    format!("slice_sizes = {}", i64_array(&spec.slice_sizes)),
                ],
            )
        }
        OpKind::Scatter(spec) => {
            let mut fields = struct_fields(&[
                ("update_window_dims", &spec.update_window_dims),
                ("inserted_window_dims", &spec.inserted_window_dims),
                (
                    "scatter_dims_to_operand_dims",
                    &spec.scatter_dims_to_operand_dims,
                ),
            ]);
            fields.push(format!("index_vector_dim = {}", spec.index_vector_dim));
            (
                "scatter",
                vec![
                    format!("indices_are_sorted = {}", spec.indices_are_sorted),
                    format!(
                        "scatter_dimension_numbers = #stablehlo.scatter<{}>",
                        fields.join(", ")
                    ),
                    format!("unique_indices = {}", spec.unique_indices),
                ],
            )
        }
        OpKind::DynamicSlice { slice_sizes } => (
            "dynamic_slice",
            vec![format!("slice_sizes = {}", i64_array(slice_sizes))],
        ),
        OpKind::DynamicUpdateSlice => ("dynamic_update_slice", vec![]),
        OpKind::Concatenate { dimension } => (
            "concatenate",
            vec![format!("dimension = {dimension} : i64")],
        ),
        OpKind::Slice {
            start,
            limit,
            strides,
        } => (
            "slice",
            vec![
                format!("start_indices = {}", i64_array(start)),
                format!("limit_indices = {}", i64_array(limit)),
                format!("strides = {}", i64_array(strides)),
            ],
        ),
        OpKind::CustomCall { target, attributes } => {
            let config: Vec<String> = attributes
                .iter()
                .map(|(name, value)| format!("{name} = {}", custom_call_attr(value)))
                .collect();
            (
                "custom_call",
                vec![
                    "api_version = 4 : i32".to_owned(),
                    format!("backend_config = {{{}}}", config.join(", ")),
                    format!("call_target_name = {}", mlir_string(target)),
                ],
            )
        }
    }
}

/// A typed-FFI attribute as MLIR attribute text.
fn custom_call_attr(value: &CustomCallAttr) -> String {
    match value {
        CustomCallAttr::I32(v) => format!("{v} : i32"),
        CustomCallAttr::I64(v) => format!("{v} : i64"),
        CustomCallAttr::F32(v) => format!("{} : f32", Scalar::F32(*v)),
        CustomCallAttr::Bool(v) => v.to_string(),
        CustomCallAttr::Str(v) => mlir_string(v),
    }
}

/// `s` as an MLIR string literal: `"` and `\` escaped, bytes outside printable ASCII as `\XX`.
fn mlir_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for b in s.bytes() {
        match b {
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            0x20..=0x7e => out.push(b as char),
            _ => {
                let _ = write!(out, "\\{b:02X}");
            }
        }
    }
    out.push('"');
    out
}
