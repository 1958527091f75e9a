//! The ops of the builder, each checking its operands' dtypes and dims when it is added and
//! computing its result type, so that a malformed graph is a Rust error naming the op.

use crate::builder::{FunctionBuilder, Value};
use crate::error::{HloError, invalid};
use crate::literal::{ConstData, Scalar};
use crate::types::{ScalarType, TensorType};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnaryOp {
    Neg,
    Abs,
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Tanh,
    Logistic,
    Not,
    /// Rounds to the nearest integer, ties to even (the rounding of `convert` to an integer
    /// type is toward zero, so quantization rounds first).
    RoundNearestEven,
}

impl UnaryOp {
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "negate",
            UnaryOp::Abs => "abs",
            UnaryOp::Exp => "exponential",
            UnaryOp::Log => "log",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Rsqrt => "rsqrt",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Logistic => "logistic",
            UnaryOp::Not => "not",
            UnaryOp::RoundNearestEven => "round_nearest_even",
        }
    }

    fn accepts(self, t: ScalarType) -> (bool, &'static str) {
        match self {
            UnaryOp::Neg => (t.is_numeric(), "a float or integer type"),
            UnaryOp::Abs => (
                t.is_float() || t.is_signed_int(),
                "a float or signed integer type",
            ),
            UnaryOp::Not => (t.is_int() || t == ScalarType::Pred, "an integer type or i1"),
            _ => (t.is_float(), "a float type (f32, bf16, f16)"),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Max,
    Min,
    Pow,
    And,
    Or,
    /// Shift right, filling with zeros (`x >> n` on unsigned bits; a count of the bit width
    /// or more gives 0).
    ShiftRightLogical,
    /// Shift left, filling with zeros (a count of the bit width or more gives 0).
    ShiftLeft,
}

impl BinaryOp {
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "subtract",
            BinaryOp::Mul => "multiply",
            BinaryOp::Div => "divide",
            BinaryOp::Max => "maximum",
            BinaryOp::Min => "minimum",
            BinaryOp::Pow => "power",
            BinaryOp::And => "and",
            BinaryOp::Or => "or",
            BinaryOp::ShiftRightLogical => "shift_right_logical",
            BinaryOp::ShiftLeft => "shift_left",
        }
    }

    fn accepts(self, t: ScalarType) -> (bool, &'static str) {
        match self {
            BinaryOp::And | BinaryOp::Or => {
                (t.is_int() || t == ScalarType::Pred, "an integer type or i1")
            }
            BinaryOp::ShiftRightLogical | BinaryOp::ShiftLeft => (t.is_int(), "an integer type"),
            _ => (t.is_numeric(), "a float or integer type"),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompareDirection {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl CompareDirection {
    pub fn mlir_name(self) -> &'static str {
        match self {
            CompareDirection::Eq => "EQ",
            CompareDirection::Ne => "NE",
            CompareDirection::Lt => "LT",
            CompareDirection::Le => "LE",
            CompareDirection::Gt => "GT",
            CompareDirection::Ge => "GE",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompareType {
    Float,
    Signed,
    Unsigned,
}

impl CompareType {
    pub fn mlir_name(self) -> &'static str {
        match self {
            CompareType::Float => "FLOAT",
            CompareType::Signed => "SIGNED",
            CompareType::Unsigned => "UNSIGNED",
        }
    }

    /// The comparison type StableHLO requires for `dtype`.
    pub fn for_dtype(dtype: ScalarType) -> CompareType {
        if dtype.is_float() {
            CompareType::Float
        } else if dtype.is_signed_int() {
            CompareType::Signed
        } else {
            CompareType::Unsigned
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    Default,
    High,
    Highest,
}

impl Precision {
    pub fn mlir_name(self) -> &'static str {
        match self {
            Precision::Default => "DEFAULT",
            Precision::High => "HIGH",
            Precision::Highest => "HIGHEST",
        }
    }
}

/// Dimension numbers of `dot_general`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DotDims {
    pub lhs_batch: Vec<usize>,
    pub rhs_batch: Vec<usize>,
    pub lhs_contract: Vec<usize>,
    pub rhs_contract: Vec<usize>,
}

impl DotDims {
    /// One lhs dimension contracted against one rhs dimension, with no batch dimensions.
    pub fn contracting(lhs: usize, rhs: usize) -> DotDims {
        DotDims {
            lhs_contract: vec![lhs],
            rhs_contract: vec![rhs],
            ..DotDims::default()
        }
    }
}

/// The combiner of a single-operand `reduce`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    Max,
    Min,
}

/// The update computation of `scatter`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScatterUpdate {
    /// The update replaces the operand element.
    Replace,
    /// The update is added to the operand element.
    Add,
}

/// Dimension numbers and flags of `gather`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GatherSpec {
    pub offset_dims: Vec<usize>,
    pub collapsed_slice_dims: Vec<usize>,
    pub start_index_map: Vec<usize>,
    pub index_vector_dim: usize,
    pub slice_sizes: Vec<usize>,
    pub indices_are_sorted: bool,
}

/// Dimension numbers, update computation and flags of `scatter`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScatterSpec {
    pub update_window_dims: Vec<usize>,
    pub inserted_window_dims: Vec<usize>,
    pub scatter_dims_to_operand_dims: Vec<usize>,
    pub index_vector_dim: usize,
    pub update: ScatterUpdate,
    pub indices_are_sorted: bool,
    pub unique_indices: bool,
}

impl ScatterSpec {
    /// Updates written at indices into the operand's leading dimension, one index per update
    /// (`index_vector_dim` 1): `update_window_dims` are the update's dimensions that span the
    /// rest of the operand. The indices are declared neither sorted nor unique.
    pub fn leading_dim(update_window_dims: Vec<usize>, update: ScatterUpdate) -> ScatterSpec {
        ScatterSpec {
            update_window_dims,
            inserted_window_dims: vec![0],
            scatter_dims_to_operand_dims: vec![0],
            index_vector_dim: 1,
            update,
            indices_are_sorted: false,
            unique_indices: false,
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) enum ReduceBody {
    Single(ReduceOp),
    /// (value, index) pairs: the larger value wins, NaN above every number, and among equal
    /// values the lower index wins.
    ArgMax,
}

#[derive(Debug, Clone)]
pub(crate) enum OpKind {
    Constant {
        data: ConstData,
        splat: bool,
    },
    Iota {
        dimension: usize,
    },
    Unary(UnaryOp),
    Binary(BinaryOp),
    Compare {
        direction: CompareDirection,
        compare_type: CompareType,
    },
    Select,
    Clamp,
    Convert,
    BitcastConvert,
    OptimizationBarrier,
    BroadcastInDim {
        dimensions: Vec<usize>,
    },
    Reshape,
    Transpose {
        permutation: Vec<usize>,
    },
    DotGeneral {
        dims: DotDims,
        precision: Option<Precision>,
    },
    Reduce {
        body: ReduceBody,
        dimensions: Vec<usize>,
    },
    Gather(GatherSpec),
    Scatter(ScatterSpec),
    DynamicSlice {
        slice_sizes: Vec<usize>,
    },
    DynamicUpdateSlice,
    Concatenate {
        dimension: usize,
    },
    Slice {
        start: Vec<usize>,
        limit: Vec<usize>,
        strides: Vec<usize>,
    },
    CustomCall {
        target: String,
        attributes: Vec<(String, CustomCallAttr)>,
    },
}

/// One attribute of a typed-FFI custom call (`backend_config` dictionary entry): what the
/// handler reads from its call frame's attributes.
#[derive(Debug, Clone, PartialEq)]
pub enum CustomCallAttr {
    I32(i32),
    I64(i64),
    F32(f32),
    Bool(bool),
    Str(String),
}

fn dims_list(d: &[usize]) -> String {
    let parts: Vec<String> = d.iter().map(|x| x.to_string()).collect();
    format!("[{}]", parts.join(", "))
}

/// Checks that `dims` are distinct and below `rank`.
fn check_dims(op: &'static str, what: &str, dims: &[usize], rank: usize) -> Result<(), HloError> {
    for (i, &d) in dims.iter().enumerate() {
        if d >= rank {
            return Err(invalid(
                op,
                format!(
                    "{what} {} has dimension {d}, but the rank is {rank}",
                    dims_list(dims)
                ),
            ));
        }
        if dims[..i].contains(&d) {
            return Err(invalid(
                op,
                format!("{what} {} lists dimension {d} twice", dims_list(dims)),
            ));
        }
    }
    Ok(())
}

fn check_sorted(op: &'static str, what: &str, dims: &[usize]) -> Result<(), HloError> {
    if dims.windows(2).any(|w| w[0] >= w[1]) {
        return Err(invalid(
            op,
            format!("{what} {} must be strictly increasing", dims_list(dims)),
        ));
    }
    Ok(())
}

fn check_index_dtype(op: &'static str, what: &str, ty: &TensorType) -> Result<(), HloError> {
    if !ty.dtype.is_int() {
        return Err(invalid(
            op,
            format!("{what} have type {ty}; indices must be an integer type"),
        ));
    }
    Ok(())
}

/// Size of the index vector of gather/scatter indices and the batch dims around it.
fn split_indices(
    op: &'static str,
    indices: &TensorType,
    index_vector_dim: usize,
) -> Result<(usize, Vec<usize>), HloError> {
    if index_vector_dim > indices.rank() {
        return Err(invalid(
            op,
            format!(
                "index_vector_dim {index_vector_dim} is past the indices' rank {} (at most the rank)",
                indices.rank()
            ),
        ));
    }
    let mut batch = indices.dims.clone();
    let vector_size = if index_vector_dim < indices.rank() {
        batch.remove(index_vector_dim)
    } else {
        1
    };
    Ok((vector_size, batch))
}

impl FunctionBuilder {
    fn same_type(&self, op: &'static str, a: Value, b: Value) -> Result<TensorType, HloError> {
        let ta = self.check_value(op, a)?;
        let tb = self.check_value(op, b)?;
        if ta != tb {
            return Err(invalid(
                op,
                format!("operands must have one type, got {ta} and {tb}"),
            ));
        }
        Ok(ta.clone())
    }

    // ---- constants -----------------------------------------------------------------------

    /// A dense constant of shape `dims` holding `data` in row-major order.
    pub fn constant(
        &mut self,
        dims: impl Into<Vec<usize>>,
        data: impl Into<ConstData>,
    ) -> Result<Value, HloError> {
        let data = data.into();
        let ty = TensorType::new(data.dtype(), dims);
        match ty.element_count() {
            Some(n) if n == data.len() => {}
            n => {
                return Err(invalid(
                    "constant",
                    format!(
                        "{ty} holds {} elements, but {} values were given",
                        n.map_or("too many".to_owned(), |n| n.to_string()),
                        data.len()
                    ),
                ));
            }
        }
        Ok(self.push_op1(OpKind::Constant { data, splat: false }, vec![], ty))
    }

    /// A scalar constant (`tensor<dtype>`).
    pub fn scalar(&mut self, value: impl Into<Scalar>) -> Value {
        let value = value.into();
        let ty = TensorType::scalar(value.dtype());
        self.push_op1(
            OpKind::Constant {
                data: splat_data(value),
                splat: true,
            },
            vec![],
            ty,
        )
    }

    /// A constant of shape `dims` with every element `value`.
    pub fn splat(
        &mut self,
        value: impl Into<Scalar>,
        dims: impl Into<Vec<usize>>,
    ) -> Result<Value, HloError> {
        let value = value.into();
        let ty = TensorType::new(value.dtype(), dims);
        if ty.element_count().is_none() {
            return Err(invalid(
                "constant",
                format!("{ty} has more elements than fit in memory"),
            ));
        }
        Ok(self.push_op1(
            OpKind::Constant {
                data: splat_data(value),
                splat: true,
            },
            vec![],
            ty,
        ))
    }

    /// A constant of type `ty` with every element `value` converted to its dtype (floats round
    /// to nearest; integers must be exact).
    pub fn full(&mut self, ty: &TensorType, value: f64) -> Result<Value, HloError> {
        let scalar = Scalar::from_f64(ty.dtype, value).ok_or_else(|| {
            invalid(
                "constant",
                format!("{value} is not exactly representable as {}", ty.dtype),
            )
        })?;
        self.splat(scalar, ty.dims.clone())
    }

    /// `stablehlo.iota`: element = its index along `dimension`.
    pub fn iota(&mut self, ty: TensorType, dimension: usize) -> Result<Value, HloError> {
        if dimension >= ty.rank() {
            return Err(invalid(
                "iota",
                format!(
                    "iota_dimension {dimension} is out of range for {ty} (rank {})",
                    ty.rank()
                ),
            ));
        }
        if !ty.dtype.is_numeric() {
            return Err(invalid(
                "iota",
                format!("result type {ty} must have a float or integer element type"),
            ));
        }
        Ok(self.push_op1(OpKind::Iota { dimension }, vec![], ty))
    }

    // ---- element-wise --------------------------------------------------------------------

    pub fn unary(&mut self, op: UnaryOp, x: Value) -> Result<Value, HloError> {
        let t = self.check_value(op.name(), x)?.clone();
        let (ok, wanted) = op.accepts(t.dtype);
        if !ok {
            return Err(invalid(
                op.name(),
                format!("operand has type {t}; it needs {wanted}"),
            ));
        }
        Ok(self.push_op1(OpKind::Unary(op), vec![x], t))
    }

    pub fn binary(&mut self, op: BinaryOp, a: Value, b: Value) -> Result<Value, HloError> {
        let t = self.same_type(op.name(), a, b)?;
        let (ok, wanted) = op.accepts(t.dtype);
        if !ok {
            return Err(invalid(
                op.name(),
                format!("operands have type {t}; it needs {wanted}"),
            ));
        }
        Ok(self.push_op1(OpKind::Binary(op), vec![a, b], t))
    }

    pub fn add(&mut self, a: Value, b: Value) -> Result<Value, HloError> {
        self.binary(BinaryOp::Add, a, b)
    }
    pub fn sub(&mut self, a: Value, b: Value) -> Result<Value, HloError> {
        self.binary(BinaryOp::Sub, a, b)
    }
    pub fn mul(&mut self, a: Value, b: Value) -> Result<Value, HloError> {
        self.binary(BinaryOp::Mul, a, b)
    }
    pub fn div(&mut self, a: Value, b: Value) -> Result<Value, HloError> {
        self.binary(BinaryOp::Div, a, b)
    }
    pub fn max(&mut self, a: Value, b: Value) -> Result<Value, HloError> {
        self.binary(BinaryOp::Max, a, b)
    }
    pub fn min(&mut self, a: Value, b: Value) -> Result<Value, HloError> {
        self.binary(BinaryOp::Min, a, b)
    }
    pub fn pow(&mut self, a: Value, b: Value) -> Result<Value, HloError> {
        self.binary(BinaryOp::Pow, a, b)
    }
    pub fn and(&mut self, a: Value, b: Value) -> Result<Value, HloError> {
        self.binary(BinaryOp::And, a, b)
    }
    pub fn or(&mut self, a: Value, b: Value) -> Result<Value, HloError> {
        self.binary(BinaryOp::Or, a, b)
    }
    /// `a >> b` elementwise, zeros shifted in.
    pub fn shift_right_logical(&mut self, a: Value, b: Value) -> Result<Value, HloError> {
        self.binary(BinaryOp::ShiftRightLogical, a, b)
    }
    /// `a << b` elementwise, zeros shifted in.
    pub fn shift_left(&mut self, a: Value, b: Value) -> Result<Value, HloError> {
        self.binary(BinaryOp::ShiftLeft, a, b)
    }
    pub fn neg(&mut self, x: Value) -> Result<Value, HloError> {
        self.unary(UnaryOp::Neg, x)
    }
    pub fn abs(&mut self, x: Value) -> Result<Value, HloError> {
        self.unary(UnaryOp::Abs, x)
    }
    pub fn exp(&mut self, x: Value) -> Result<Value, HloError> {
        self.unary(UnaryOp::Exp, x)
    }
    pub fn log(&mut self, x: Value) -> Result<Value, HloError> {
        self.unary(UnaryOp::Log, x)
    }
    pub fn sqrt(&mut self, x: Value) -> Result<Value, HloError> {
        self.unary(UnaryOp::Sqrt, x)
    }
    pub fn rsqrt(&mut self, x: Value) -> Result<Value, HloError> {
        self.unary(UnaryOp::Rsqrt, x)
    }
    pub fn tanh(&mut self, x: Value) -> Result<Value, HloError> {
        self.unary(UnaryOp::Tanh, x)
    }
    pub fn logistic(&mut self, x: Value) -> Result<Value, HloError> {
        self.unary(UnaryOp::Logistic, x)
    }
    pub fn round_nearest_even(&mut self, x: Value) -> Result<Value, HloError> {
        self.unary(UnaryOp::RoundNearestEven, x)
    }
    pub fn not(&mut self, x: Value) -> Result<Value, HloError> {
        self.unary(UnaryOp::Not, x)
    }

    /// `stablehlo.compare` with the comparison type the operands' dtype calls for.
    pub fn compare(
        &mut self,
        a: Value,
        direction: CompareDirection,
        b: Value,
    ) -> Result<Value, HloError> {
        let t = self.same_type("compare", a, b)?;
        self.compare_as(a, direction, b, CompareType::for_dtype(t.dtype))
    }

    /// `stablehlo.compare` with an explicit comparison type, which must suit the dtype.
    pub fn compare_as(
        &mut self,
        a: Value,
        direction: CompareDirection,
        b: Value,
        compare_type: CompareType,
    ) -> Result<Value, HloError> {
        let t = self.same_type("compare", a, b)?;
        let wanted = CompareType::for_dtype(t.dtype);
        if compare_type != wanted {
            return Err(invalid(
                "compare",
                format!(
                    "compare_type {} does not suit operands of type {t}; use {}",
                    compare_type.mlir_name(),
                    wanted.mlir_name()
                ),
            ));
        }
        Ok(self.push_op1(
            OpKind::Compare {
                direction,
                compare_type,
            },
            vec![a, b],
            t.with_dtype(ScalarType::Pred),
        ))
    }

    /// `stablehlo.select`: `pred` is `i1` of the branches' dims, or a scalar `i1`.
    pub fn select(
        &mut self,
        pred: Value,
        on_true: Value,
        on_false: Value,
    ) -> Result<Value, HloError> {
        let tp = self.check_value("select", pred)?.clone();
        let t = self.same_type("select", on_true, on_false)?;
        if tp.dtype != ScalarType::Pred || !(tp.dims == t.dims || tp.rank() == 0) {
            return Err(invalid(
                "select",
                format!(
                    "predicate has type {tp}; it must be {} or tensor<i1> for branches of type {t}",
                    t.with_dtype(ScalarType::Pred)
                ),
            ));
        }
        Ok(self.push_op1(OpKind::Select, vec![pred, on_true, on_false], t))
    }

    /// `stablehlo.clamp(min, x, max)`; `min` and `max` are of `x`'s type or scalars of its dtype.
    pub fn clamp(&mut self, min: Value, x: Value, max: Value) -> Result<Value, HloError> {
        let t = self.check_value("clamp", x)?.clone();
        for (what, v) in [("min", min), ("max", max)] {
            let tv = self.check_value("clamp", v)?;
            if tv.dtype != t.dtype || !(tv.dims == t.dims || tv.rank() == 0) {
                return Err(invalid(
                    "clamp",
                    format!(
                        "{what} has type {tv}; it must be {t} or {}",
                        TensorType::scalar(t.dtype)
                    ),
                ));
            }
        }
        Ok(self.push_op1(OpKind::Clamp, vec![min, x, max], t))
    }

    /// `stablehlo.optimization_barrier` of one value: the same value, which XLA may not fuse
    /// or move computations across.
    pub fn optimization_barrier(&mut self, x: Value) -> Result<Value, HloError> {
        let t = self.check_value("optimization_barrier", x)?.clone();
        Ok(self.push_op1(OpKind::OptimizationBarrier, vec![x], t))
    }

    /// `stablehlo.convert` to another element type.
    pub fn convert(&mut self, x: Value, dtype: ScalarType) -> Result<Value, HloError> {
        let t = self.check_value("convert", x)?.with_dtype(dtype);
        Ok(self.push_op1(OpKind::Convert, vec![x], t))
    }

    /// `stablehlo.bitcast_convert`: the same bits read as another element type. Between
    /// types of one width the dims stay; to a type `k` times wider the operand's last dim
    /// must be `k` and is dropped (its elements are the result element's bytes, the lowest
    /// address first: little-endian); to a type `k` times narrower a last dim of `k` is
    /// added. `i1` has no bit layout to reinterpret and is refused.
    pub fn bitcast_convert(&mut self, x: Value, dtype: ScalarType) -> Result<Value, HloError> {
        const OP: &str = "bitcast_convert";
        let t = self.check_value(OP, x)?.clone();
        if t.dtype == ScalarType::Pred || dtype == ScalarType::Pred {
            return Err(invalid(
                OP,
                format!("{t} to {dtype}: i1 has no bit layout to reinterpret"),
            ));
        }
        let (from, to) = (t.dtype.byte_size(), dtype.byte_size());
        let mut dims = t.dims.clone();
        if to > from {
            let k = to / from;
            if dims.last() != Some(&k) {
                return Err(invalid(
                    OP,
                    format!(
                        "{t} to {dtype}: an element of {dtype} is {k} of {}, so the operand's last dim must be {k}",
                        t.dtype
                    ),
                ));
            }
            dims.pop();
        } else if to < from {
            dims.push(from / to);
        }
        Ok(self.push_op1(
            OpKind::BitcastConvert,
            vec![x],
            TensorType::new(dtype, dims),
        ))
    }

    // ---- shapes --------------------------------------------------------------------------

    /// `stablehlo.broadcast_in_dim`: operand dim `i` becomes result dim
    /// `broadcast_dimensions[i]`, whose size must equal it unless the operand's is 1.
    pub fn broadcast_in_dim(
        &mut self,
        x: Value,
        dims: impl Into<Vec<usize>>,
        broadcast_dimensions: impl Into<Vec<usize>>,
    ) -> Result<Value, HloError> {
        const OP: &str = "broadcast_in_dim";
        let t = self.check_value(OP, x)?.clone();
        let result = TensorType::new(t.dtype, dims);
        let bd = broadcast_dimensions.into();
        if bd.len() != t.rank() {
            return Err(invalid(
                OP,
                format!(
                    "broadcast_dimensions {} has {} entries; the operand {t} needs {}",
                    dims_list(&bd),
                    bd.len(),
                    t.rank()
                ),
            ));
        }
        check_dims(OP, "broadcast_dimensions", &bd, result.rank())?;
        for (i, &d) in bd.iter().enumerate() {
            if t.dims[i] != 1 && t.dims[i] != result.dims[d] {
                return Err(invalid(
                    OP,
                    format!(
                        "operand dim {i} (size {}) maps to result dim {d} (size {}); sizes must match or the operand's be 1",
                        t.dims[i], result.dims[d]
                    ),
                ));
            }
        }
        Ok(self.push_op1(OpKind::BroadcastInDim { dimensions: bd }, vec![x], result))
    }

    /// NumPy-style broadcast: trailing dims aligned, each equal or 1. Returns `x` itself when
    /// it already has `dims`.
    pub fn broadcast_to(
        &mut self,
        x: Value,
        dims: impl Into<Vec<usize>>,
    ) -> Result<Value, HloError> {
        let dims = dims.into();
        let t = self.check_value("broadcast_in_dim", x)?;
        if t.dims == dims {
            return Ok(x);
        }
        if t.rank() > dims.len() {
            return Err(invalid(
                "broadcast_in_dim",
                format!(
                    "cannot broadcast {t} to the lower rank {}",
                    dims_list(&dims)
                ),
            ));
        }
        let offset = dims.len() - t.rank();
        self.broadcast_in_dim(x, dims, (offset..offset + t.rank()).collect::<Vec<_>>())
    }

    /// `stablehlo.reshape` to `dims` with the same element count.
    pub fn reshape(&mut self, x: Value, dims: impl Into<Vec<usize>>) -> Result<Value, HloError> {
        let t = self.check_value("reshape", x)?.clone();
        let result = TensorType::new(t.dtype, dims);
        if t.element_count() != result.element_count() {
            return Err(invalid(
                "reshape",
                format!("cannot reshape {t} to {result}: element counts differ"),
            ));
        }
        Ok(self.push_op1(OpKind::Reshape, vec![x], result))
    }

    /// `stablehlo.transpose`: result dim `i` is operand dim `permutation[i]`.
    pub fn transpose(
        &mut self,
        x: Value,
        permutation: impl Into<Vec<usize>>,
    ) -> Result<Value, HloError> {
        let t = self.check_value("transpose", x)?.clone();
        let permutation = permutation.into();
        if permutation.len() != t.rank() {
            return Err(invalid(
                "transpose",
                format!(
                    "permutation {} has {} entries; the operand {t} needs {}",
                    dims_list(&permutation),
                    permutation.len(),
                    t.rank()
                ),
            ));
        }
        check_dims("transpose", "permutation", &permutation, t.rank())?;
        let dims: Vec<usize> = permutation.iter().map(|&p| t.dims[p]).collect();
        Ok(self.push_op1(
            OpKind::Transpose { permutation },
            vec![x],
            TensorType::new(t.dtype, dims),
        ))
    }

    /// `stablehlo.concatenate` along `dimension`; all other dims must agree.
    pub fn concatenate(&mut self, inputs: &[Value], dimension: usize) -> Result<Value, HloError> {
        const OP: &str = "concatenate";
        let Some(&first) = inputs.first() else {
            return Err(invalid(OP, "needs at least one operand"));
        };
        let t0 = self.check_value(OP, first)?.clone();
        if dimension >= t0.rank() {
            return Err(invalid(
                OP,
                format!(
                    "dimension {dimension} is out of range for {t0} (rank {})",
                    t0.rank()
                ),
            ));
        }
        let mut dims = t0.dims.clone();
        dims[dimension] = 0;
        for (k, &v) in inputs.iter().enumerate() {
            let t = self.check_value(OP, v)?;
            let agrees = t.dtype == t0.dtype
                && t.rank() == t0.rank()
                && (0..t.rank()).all(|d| d == dimension || t.dims[d] == t0.dims[d]);
            if !agrees {
                return Err(invalid(
                    OP,
                    format!(
                        "operand {k} has type {t}, which does not match operand 0 ({t0}) outside dimension {dimension}"
                    ),
                ));
            }
            dims[dimension] = dims[dimension]
                .checked_add(t.dims[dimension])
                .ok_or_else(|| invalid(OP, format!("dimension {dimension} overflows")))?;
        }
        Ok(self.push_op1(
            OpKind::Concatenate { dimension },
            inputs.to_vec(),
            TensorType::new(t0.dtype, dims),
        ))
    }

    /// `stablehlo.custom_call @target(operands)` with the typed-FFI calling convention
    /// (`api_version = 4`), `attributes` as its `backend_config` dictionary (what the handler
    /// reads from its call frame) and one result of type `result`. The builder cannot know
    /// what the target computes: the caller states the result type, and the plugin refuses
    /// at compile time a target nobody registered.
    pub fn custom_call(
        &mut self,
        target: &str,
        operands: &[Value],
        result: TensorType,
        attributes: &[(&str, CustomCallAttr)],
    ) -> Result<Value, HloError> {
        const OP: &str = "custom_call";
        let target_ok = target
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && target
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '$'));
        if !target_ok {
            return Err(invalid(
                OP,
                format!(
                    "target {target:?} refused: use a letter or `_` then letters, digits, `_`, `.` or `$`"
                ),
            ));
        }
        for &v in operands {
            self.check_value(OP, v)?;
        }
        let mut names: Vec<&str> = Vec::with_capacity(attributes.len());
        for (name, _) in attributes {
            let name_ok = name
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !name_ok {
                return Err(invalid(
                    OP,
                    format!(
                        "attribute name {name:?} refused: use a letter or `_` then letters, digits or `_`"
                    ),
                ));
            }
            if names.contains(name) {
                return Err(invalid(OP, format!("attribute {name:?} given twice")));
            }
            names.push(name);
        }
        // MLIR prints a dictionary's entries sorted by name; sorting here keeps the text
        // byte-identical to what a round trip through MLIR would print.
        let mut attributes: Vec<(String, CustomCallAttr)> = attributes
            .iter()
            .map(|(n, a)| ((*n).to_owned(), a.clone()))
            .collect();
        attributes.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(self.push_op1(
            OpKind::CustomCall {
                target: target.to_owned(),
                attributes,
            },
            operands.to_vec(),
            result,
        ))
    }

    /// `stablehlo.slice` of `[start, limit)` with `strides` along each dim.
    pub fn slice(
        &mut self,
        x: Value,
        start: impl Into<Vec<usize>>,
        limit: impl Into<Vec<usize>>,
        strides: impl Into<Vec<usize>>,
    ) -> Result<Value, HloError> {
        let t = self.check_value("slice", x)?.clone();
        let (start, limit, strides) = (start.into(), limit.into(), strides.into());
        if start.len() != t.rank() || limit.len() != t.rank() || strides.len() != t.rank() {
            return Err(invalid(
                "slice",
                format!(
                    "start {}, limit {} and strides {} must each have one entry per dim of {t}",
                    dims_list(&start),
                    dims_list(&limit),
                    dims_list(&strides)
                ),
            ));
        }
        let mut dims = Vec::with_capacity(t.rank());
        for d in 0..t.rank() {
            if !(start[d] <= limit[d] && limit[d] <= t.dims[d] && strides[d] >= 1) {
                return Err(invalid(
                    "slice",
                    format!(
                        "dim {d}: start {}, limit {}, stride {} on size {}; need start <= limit <= size and stride >= 1",
                        start[d], limit[d], strides[d], t.dims[d]
                    ),
                ));
            }
            dims.push((limit[d] - start[d]).div_ceil(strides[d]));
        }
        Ok(self.push_op1(
            OpKind::Slice {
                start,
                limit,
                strides,
            },
            vec![x],
            TensorType::new(t.dtype, dims),
        ))
    }

    fn check_start_indices(
        &self,
        op: &'static str,
        operand: &TensorType,
        starts: &[Value],
    ) -> Result<(), HloError> {
        if starts.len() != operand.rank() {
            return Err(invalid(
                op,
                format!(
                    "{} start indices given; the operand {operand} needs {}",
                    starts.len(),
                    operand.rank()
                ),
            ));
        }
        let mut first_dtype = None;
        for (k, &s) in starts.iter().enumerate() {
            let ts = self.check_value(op, s)?;
            if ts.rank() != 0 || !ts.dtype.is_int() || first_dtype.is_some_and(|d| d != ts.dtype) {
                return Err(invalid(
                    op,
                    format!(
                        "start index {k} has type {ts}; start indices are integer scalars of one type"
                    ),
                ));
            }
            first_dtype = Some(ts.dtype);
        }
        Ok(())
    }

    /// `stablehlo.dynamic_slice`: a `slice_sizes` window at run-time start indices (one integer
    /// scalar per dim; XLA clamps them so the window stays inside).
    pub fn dynamic_slice(
        &mut self,
        x: Value,
        starts: &[Value],
        slice_sizes: impl Into<Vec<usize>>,
    ) -> Result<Value, HloError> {
        const OP: &str = "dynamic_slice";
        let t = self.check_value(OP, x)?.clone();
        self.check_start_indices(OP, &t, starts)?;
        let slice_sizes = slice_sizes.into();
        if slice_sizes.len() != t.rank() || slice_sizes.iter().zip(&t.dims).any(|(s, d)| s > d) {
            return Err(invalid(
                OP,
                format!(
                    "slice_sizes {} must have one entry per dim of {t}, each at most that dim",
                    dims_list(&slice_sizes)
                ),
            ));
        }
        let mut operands = vec![x];
        operands.extend_from_slice(starts);
        let result = TensorType::new(t.dtype, slice_sizes.clone());
        Ok(self.push_op1(OpKind::DynamicSlice { slice_sizes }, operands, result))
    }

    /// `stablehlo.dynamic_update_slice`: writes `update` into `x` at run-time start indices.
    pub fn dynamic_update_slice(
        &mut self,
        x: Value,
        update: Value,
        starts: &[Value],
    ) -> Result<Value, HloError> {
        const OP: &str = "dynamic_update_slice";
        let t = self.check_value(OP, x)?.clone();
        let tu = self.check_value(OP, update)?;
        if tu.dtype != t.dtype
            || tu.rank() != t.rank()
            || tu.dims.iter().zip(&t.dims).any(|(u, d)| u > d)
        {
            return Err(invalid(
                OP,
                format!("update has type {tu}; it must be of {t}'s dtype and rank, no dim larger"),
            ));
        }
        self.check_start_indices(OP, &t, starts)?;
        let mut operands = vec![x, update];
        operands.extend_from_slice(starts);
        Ok(self.push_op1(OpKind::DynamicUpdateSlice, operands, t))
    }

    // ---- contractions and reductions -----------------------------------------------------

    /// `stablehlo.dot_general`. The result dims are the batch dims, then the free dims of `lhs`,
    /// then those of `rhs`. `result_dtype` (the preferred element type) may differ from the
    /// operands' (e.g. bf16 x bf16 -> f32) within floats or within integers.
    pub fn dot_general(
        &mut self,
        lhs: Value,
        rhs: Value,
        dims: &DotDims,
        precision: Option<Precision>,
        result_dtype: Option<ScalarType>,
    ) -> Result<Value, HloError> {
        const OP: &str = "dot_general";
        let tl = self.check_value(OP, lhs)?.clone();
        let tr = self.check_value(OP, rhs)?.clone();
        if tl.dtype != tr.dtype || !tl.dtype.is_numeric() {
            return Err(invalid(
                OP,
                format!("operands {tl} and {tr} must share one float or integer element type"),
            ));
        }
        let out_dtype = result_dtype.unwrap_or(tl.dtype);
        if !(out_dtype.is_float() && tl.dtype.is_float() || out_dtype.is_int() && tl.dtype.is_int())
        {
            return Err(invalid(
                OP,
                format!(
                    "result element type {out_dtype} cannot accumulate {} operands; pick a {} type",
                    tl.dtype,
                    if tl.dtype.is_float() {
                        "float"
                    } else {
                        "integer"
                    }
                ),
            ));
        }
        if dims.lhs_batch.len() != dims.rhs_batch.len() {
            return Err(invalid(
                OP,
                format!(
                    "lhs_batching_dimensions {} and rhs_batching_dimensions {} differ in length",
                    dims_list(&dims.lhs_batch),
                    dims_list(&dims.rhs_batch)
                ),
            ));
        }
        if dims.lhs_contract.len() != dims.rhs_contract.len() {
            return Err(invalid(
                OP,
                format!(
                    "lhs_contracting_dimensions {} and rhs_contracting_dimensions {} differ in length",
                    dims_list(&dims.lhs_contract),
                    dims_list(&dims.rhs_contract)
                ),
            ));
        }
        let lhs_used: Vec<usize> = dims
            .lhs_batch
            .iter()
            .chain(&dims.lhs_contract)
            .copied()
            .collect();
        let rhs_used: Vec<usize> = dims
            .rhs_batch
            .iter()
            .chain(&dims.rhs_contract)
            .copied()
            .collect();
        check_dims(
            OP,
            "lhs batching+contracting dimensions",
            &lhs_used,
            tl.rank(),
        )?;
        check_dims(
            OP,
            "rhs batching+contracting dimensions",
            &rhs_used,
            tr.rank(),
        )?;
        for (what, l, r) in [
            ("batching", &dims.lhs_batch, &dims.rhs_batch),
            ("contracting", &dims.lhs_contract, &dims.rhs_contract),
        ] {
            for (&a, &b) in l.iter().zip(r) {
                if tl.dims[a] != tr.dims[b] {
                    return Err(invalid(
                        OP,
                        format!(
                            "{what} dims differ in size: lhs dim {a} of {tl} is {}, rhs dim {b} of {tr} is {}",
                            tl.dims[a], tr.dims[b]
                        ),
                    ));
                }
            }
        }
        let mut out: Vec<usize> = dims.lhs_batch.iter().map(|&d| tl.dims[d]).collect();
        out.extend(
            (0..tl.rank())
                .filter(|d| !lhs_used.contains(d))
                .map(|d| tl.dims[d]),
        );
        out.extend(
            (0..tr.rank())
                .filter(|d| !rhs_used.contains(d))
                .map(|d| tr.dims[d]),
        );
        Ok(self.push_op1(
            OpKind::DotGeneral {
                dims: dims.clone(),
                precision,
            },
            vec![lhs, rhs],
            TensorType::new(out_dtype, out),
        ))
    }

    fn reduced_type(
        &self,
        op: &'static str,
        t: &TensorType,
        dimensions: &[usize],
    ) -> Result<TensorType, HloError> {
        check_dims(op, "dimensions", dimensions, t.rank())?;
        let dims = (0..t.rank())
            .filter(|d| !dimensions.contains(d))
            .map(|d| t.dims[d])
            .collect::<Vec<_>>();
        Ok(TensorType::new(t.dtype, dims))
    }

    /// `stablehlo.reduce` of `x` over `dimensions` starting from the scalar `init`.
    pub fn reduce(
        &mut self,
        x: Value,
        init: Value,
        dimensions: impl Into<Vec<usize>>,
        combiner: ReduceOp,
    ) -> Result<Value, HloError> {
        const OP: &str = "reduce";
        let t = self.check_value(OP, x)?.clone();
        let ti = self.check_value(OP, init)?;
        if !t.dtype.is_numeric() {
            return Err(invalid(
                OP,
                format!("operand {t} must be a float or integer tensor"),
            ));
        }
        if *ti != TensorType::scalar(t.dtype) {
            return Err(invalid(
                OP,
                format!(
                    "init value has type {ti}; it must be {}",
                    TensorType::scalar(t.dtype)
                ),
            ));
        }
        let dimensions = dimensions.into();
        let result = self.reduced_type(OP, &t, &dimensions)?;
        Ok(self.push_op1(
            OpKind::Reduce {
                body: ReduceBody::Single(combiner),
                dimensions,
            },
            vec![x, init],
            result,
        ))
    }

    /// Sum over `dimensions` (init 0).
    pub fn reduce_sum(
        &mut self,
        x: Value,
        dimensions: impl Into<Vec<usize>>,
    ) -> Result<Value, HloError> {
        let dtype = self.check_value("reduce", x)?.dtype;
        let init = self.scalar(Scalar::zero(dtype));
        self.reduce(x, init, dimensions, ReduceOp::Sum)
    }

    /// Maximum over `dimensions` (init: the type's lowest value, `-inf` for floats).
    pub fn reduce_max(
        &mut self,
        x: Value,
        dimensions: impl Into<Vec<usize>>,
    ) -> Result<Value, HloError> {
        let dtype = self.check_value("reduce", x)?.dtype;
        let init = self.scalar(Scalar::lowest(dtype));
        self.reduce(x, init, dimensions, ReduceOp::Max)
    }

    /// Minimum over `dimensions` (init: the type's highest value, `+inf` for floats).
    pub fn reduce_min(
        &mut self,
        x: Value,
        dimensions: impl Into<Vec<usize>>,
    ) -> Result<Value, HloError> {
        let dtype = self.check_value("reduce", x)?.dtype;
        let init = self.scalar(Scalar::highest(dtype));
        self.reduce(x, init, dimensions, ReduceOp::Min)
    }

    /// Maximum and its index along `axis`, as one two-operand `stablehlo.reduce` over
    /// (`x`, iota). Ties go to the lowest index and NaN counts above every number, as
    /// `torch.argmax` and `numpy.argmax` do. Returns (max values, indices of `index_dtype`).
    pub fn argmax(
        &mut self,
        x: Value,
        axis: usize,
        index_dtype: ScalarType,
    ) -> Result<(Value, Value), HloError> {
        const OP: &str = "reduce";
        let t = self.check_value(OP, x)?.clone();
        if !t.dtype.is_numeric() {
            return Err(invalid(
                OP,
                format!("argmax operand {t} must be a float or integer tensor"),
            ));
        }
        if !matches!(index_dtype, ScalarType::I32 | ScalarType::I64) {
            return Err(invalid(
                OP,
                format!("argmax index type {index_dtype} refused; use i32 or i64"),
            ));
        }
        if axis >= t.rank() || Scalar::from_f64(index_dtype, t.dims[axis] as f64).is_none() {
            return Err(invalid(
                OP,
                format!("argmax axis {axis} must be a dim of {t} whose indices fit {index_dtype}"),
            ));
        }
        let values_type = self.reduced_type(OP, &t, &[axis])?;
        let iota = self.iota(t.with_dtype(index_dtype), axis)?;
        let init_value = self.scalar(Scalar::lowest(t.dtype));
        let init_index = self.scalar(Scalar::zero(index_dtype));
        let results = self.push_op(
            OpKind::Reduce {
                body: ReduceBody::ArgMax,
                dimensions: vec![axis],
            },
            vec![x, iota, init_value, init_index],
            vec![values_type.clone(), values_type.with_dtype(index_dtype)],
        );
        Ok((results[0], results[1]))
    }

    // ---- gather and scatter --------------------------------------------------------------

    /// `stablehlo.gather` with general dimension numbers (no operand batching dims).
    pub fn gather(
        &mut self,
        operand: Value,
        indices: Value,
        spec: &GatherSpec,
    ) -> Result<Value, HloError> {
        const OP: &str = "gather";
        let to = self.check_value(OP, operand)?.clone();
        let ti = self.check_value(OP, indices)?.clone();
        check_index_dtype(OP, "indices", &ti)?;
        let (vector_size, batch) = split_indices(OP, &ti, spec.index_vector_dim)?;
        if spec.slice_sizes.len() != to.rank()
            || spec.slice_sizes.iter().zip(&to.dims).any(|(s, d)| s > d)
        {
            return Err(invalid(
                OP,
                format!(
                    "slice_sizes {} must have one entry per dim of the operand {to}, each at most that dim",
                    dims_list(&spec.slice_sizes)
                ),
            ));
        }
        check_dims(
            OP,
            "collapsed_slice_dims",
            &spec.collapsed_slice_dims,
            to.rank(),
        )?;
        check_sorted(OP, "collapsed_slice_dims", &spec.collapsed_slice_dims)?;
        for &d in &spec.collapsed_slice_dims {
            if spec.slice_sizes[d] > 1 {
                return Err(invalid(
                    OP,
                    format!(
                        "collapsed slice dim {d} has slice size {}; collapsed dims take size 1",
                        spec.slice_sizes[d]
                    ),
                ));
            }
        }
        if spec.start_index_map.len() != vector_size {
            return Err(invalid(
                OP,
                format!(
                    "start_index_map {} has {} entries, but the index vector of {ti} (index_vector_dim {}) has {vector_size}",
                    dims_list(&spec.start_index_map),
                    spec.start_index_map.len(),
                    spec.index_vector_dim
                ),
            ));
        }
        check_dims(OP, "start_index_map", &spec.start_index_map, to.rank())?;
        let offset_sizes: Vec<usize> = (0..to.rank())
            .filter(|d| !spec.collapsed_slice_dims.contains(d))
            .map(|d| spec.slice_sizes[d])
            .collect();
        let rank = batch.len() + offset_sizes.len();
        if spec.offset_dims.len() != offset_sizes.len() {
            return Err(invalid(
                OP,
                format!(
                    "offset_dims {} has {} entries; the uncollapsed slice dims number {}",
                    dims_list(&spec.offset_dims),
                    spec.offset_dims.len(),
                    offset_sizes.len()
                ),
            ));
        }
        check_dims(OP, "offset_dims", &spec.offset_dims, rank)?;
        check_sorted(OP, "offset_dims", &spec.offset_dims)?;
        let (mut offsets, mut batches) = (offset_sizes.into_iter(), batch.into_iter());
        let dims: Vec<usize> = (0..rank)
            .map(|d| {
                if spec.offset_dims.contains(&d) {
                    offsets.next()
                } else {
                    batches.next()
                }
                .unwrap_or(0)
            })
            .collect();
        Ok(self.push_op1(
            OpKind::Gather(spec.clone()),
            vec![operand, indices],
            TensorType::new(to.dtype, dims),
        ))
    }

    /// `stablehlo.scatter` with general dimension numbers; updates whose window falls outside
    /// the operand are dropped (which is how a `-1` slot writes nothing).
    pub fn scatter(
        &mut self,
        operand: Value,
        indices: Value,
        updates: Value,
        spec: &ScatterSpec,
    ) -> Result<Value, HloError> {
        const OP: &str = "scatter";
        let to = self.check_value(OP, operand)?.clone();
        let ti = self.check_value(OP, indices)?.clone();
        let tu = self.check_value(OP, updates)?.clone();
        check_index_dtype(OP, "indices", &ti)?;
        if tu.dtype != to.dtype {
            return Err(invalid(
                OP,
                format!("updates {tu} must have the operand's element type ({to})"),
            ));
        }
        if spec.update == ScatterUpdate::Add && !to.dtype.is_numeric() {
            return Err(invalid(
                OP,
                format!("an adding scatter needs a numeric operand, not {to}"),
            ));
        }
        let (vector_size, batch) = split_indices(OP, &ti, spec.index_vector_dim)?;
        check_dims(
            OP,
            "update_window_dims",
            &spec.update_window_dims,
            tu.rank(),
        )?;
        check_sorted(OP, "update_window_dims", &spec.update_window_dims)?;
        check_dims(
            OP,
            "inserted_window_dims",
            &spec.inserted_window_dims,
            to.rank(),
        )?;
        check_sorted(OP, "inserted_window_dims", &spec.inserted_window_dims)?;
        if spec.update_window_dims.len() + spec.inserted_window_dims.len() != to.rank() {
            return Err(invalid(
                OP,
                format!(
                    "update_window_dims {} and inserted_window_dims {} must together number the operand's rank {}",
                    dims_list(&spec.update_window_dims),
                    dims_list(&spec.inserted_window_dims),
                    to.rank()
                ),
            ));
        }
        let scatter_sizes: Vec<usize> = (0..tu.rank())
            .filter(|d| !spec.update_window_dims.contains(d))
            .map(|d| tu.dims[d])
            .collect();
        if scatter_sizes != batch {
            return Err(invalid(
                OP,
                format!(
                    "the updates' scatter dims {} must equal the indices' batch dims {} ({ti} without index_vector_dim {})",
                    dims_list(&scatter_sizes),
                    dims_list(&batch),
                    spec.index_vector_dim
                ),
            ));
        }
        let window_operand_dims = (0..to.rank()).filter(|d| !spec.inserted_window_dims.contains(d));
        for (&u, o) in spec.update_window_dims.iter().zip(window_operand_dims) {
            if tu.dims[u] > to.dims[o] {
                return Err(invalid(
                    OP,
                    format!(
                        "update window dim {u} (size {}) is larger than operand dim {o} (size {})",
                        tu.dims[u], to.dims[o]
                    ),
                ));
            }
        }
        if spec.scatter_dims_to_operand_dims.len() != vector_size {
            return Err(invalid(
                OP,
                format!(
                    "scatter_dims_to_operand_dims {} has {} entries, but the index vector of {ti} has {vector_size}",
                    dims_list(&spec.scatter_dims_to_operand_dims),
                    spec.scatter_dims_to_operand_dims.len()
                ),
            ));
        }
        check_dims(
            OP,
            "scatter_dims_to_operand_dims",
            &spec.scatter_dims_to_operand_dims,
            to.rank(),
        )?;
        Ok(self.push_op1(
            OpKind::Scatter(spec.clone()),
            vec![operand, indices, updates],
            to,
        ))
    }
}

fn splat_data(value: Scalar) -> ConstData {
    match value {
        Scalar::F32(v) => ConstData::F32(vec![v]),
        Scalar::Bf16(v) => ConstData::Bf16(vec![v]),
        Scalar::F16(v) => ConstData::F16(vec![v]),
        Scalar::I32(v) => ConstData::I32(vec![v]),
        Scalar::I64(v) => ConstData::I64(vec![v]),
        Scalar::I8(v) => ConstData::I8(vec![v]),
        Scalar::U8(v) => ConstData::U8(vec![v]),
        Scalar::F8E4M3FN(v) => ConstData::F8E4M3FN(vec![v]),
        Scalar::Pred(v) => ConstData::Pred(vec![v]),
    }
}
