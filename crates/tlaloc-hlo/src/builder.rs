//! The function builder: an arena of typed values, the ops that define them, and the
//! signature of `@main` (arguments with names and donation, results).
//!
//! A `Value` is an index into its builder's arena, tagged with the builder's id so that a value
//! carried over from another builder is refused instead of silently meaning something else.

use std::sync::atomic::{AtomicU32, Ordering};

use crate::error::HloError;
use crate::module::{Argument, Module};
use crate::ops::OpKind;
use crate::sharding::Sharding;
use crate::types::TensorType;

static NEXT_BUILDER_ID: AtomicU32 = AtomicU32::new(0);

/// A typed SSA value of one `FunctionBuilder`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Value {
    builder: u32,
    index: u32,
}

impl Value {
    pub(crate) fn index(self) -> usize {
        self.index as usize
    }
}

#[derive(Debug, Clone)]
pub(crate) enum Def {
    Argument(usize),
    OpResult { op: usize, result: usize },
}

#[derive(Debug, Clone)]
pub(crate) struct ValueInfo {
    pub(crate) ty: TensorType,
    pub(crate) def: Def,
}

#[derive(Debug, Clone)]
pub(crate) struct Op {
    pub(crate) kind: OpKind,
    pub(crate) operands: Vec<Value>,
    pub(crate) results: Vec<Value>,
}

/// Builds one `@main` function; every op checks its operands when it is added.
#[derive(Debug)]
pub struct FunctionBuilder {
    id: u32,
    module_name: String,
    pub(crate) arguments: Vec<Argument>,
    pub(crate) values: Vec<ValueInfo>,
    pub(crate) ops: Vec<Op>,
    /// `mhlo.num_partitions`, for an SPMD program.
    partitions: Option<usize>,
    /// Shardings of results, by result index; checked against the results in `finish`.
    result_shardings: Vec<(usize, Sharding)>,
}

fn is_symbol_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
}

fn is_argument_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | '/' | '[' | ']'))
}

impl FunctionBuilder {
    /// A builder for `module @<module_name> { func.func public @main(...) }`.
    pub fn new(module_name: &str) -> Self {
        FunctionBuilder {
            id: NEXT_BUILDER_ID.fetch_add(1, Ordering::Relaxed),
            module_name: module_name.to_owned(),
            arguments: Vec::new(),
            values: Vec::new(),
            ops: Vec::new(),
            partitions: None,
            result_shardings: Vec::new(),
        }
    }

    /// Appends an argument of `@main`.
    pub fn arg(&mut self, ty: TensorType) -> Value {
        self.push_argument(None, ty)
    }

    /// Appends an argument with a name, printed as its MLIR location (`loc("name")`) so the
    /// text says which input is which; names are letters, digits and `_ . - / [ ]`.
    pub fn arg_named(&mut self, name: &str, ty: TensorType) -> Result<Value, HloError> {
        if !is_argument_name(name) {
            return Err(HloError::Signature {
                function: self.module_name.clone(),
                detail: format!(
                    "argument name {name:?} refused: use letters, digits and `_ . - / [ ]`"
                ),
            });
        }
        if self
            .arguments
            .iter()
            .any(|a| a.name.as_deref() == Some(name))
        {
            return Err(HloError::Signature {
                function: self.module_name.clone(),
                detail: format!("argument name {name:?} is used twice; names must be unique"),
            });
        }
        Ok(self.push_argument(Some(name.to_owned()), ty))
    }

    fn push_argument(&mut self, name: Option<String>, ty: TensorType) -> Value {
        let position = self.arguments.len();
        let value = self.push_value(ty.clone(), Def::Argument(position));
        self.arguments.push(Argument {
            name,
            ty,
            aliasing_output: None,
            sharding: None,
        });
        value
    }

    /// Donates argument `arg` to result `output` (`tf.aliasing_output`): the result reuses the
    /// argument's buffer. Checked against the results in `finish`.
    pub fn donate(&mut self, arg: Value, output: usize) -> Result<(), HloError> {
        self.check_value("func.func", arg)?;
        let Def::Argument(position) = self.values[arg.index()].def else {
            return Err(HloError::Signature {
                function: self.module_name.clone(),
                detail: format!(
                    "only arguments can be donated; value #{} is an op result",
                    arg.index
                ),
            });
        };
        if let Some(other) = self
            .arguments
            .iter()
            .position(|a| a.aliasing_output == Some(output))
        {
            return Err(HloError::Signature {
                function: self.module_name.clone(),
                detail: format!(
                    "result {output} is already donated by argument {other}; \
                     each result takes at most one donated argument"
                ),
            });
        }
        self.arguments[position].aliasing_output = Some(output);
        Ok(())
    }

    /// Makes this an SPMD program over `partitions` devices: the module says
    /// `mhlo.num_partitions = N` and `mhlo.num_replicas = 1`, and then every argument and
    /// result must state its sharding ([`Self::shard_argument`], [`Self::shard_result`]), each
    /// split over exactly N partitions. Checked in `finish`.
    pub fn set_partitions(&mut self, partitions: usize) -> Result<(), HloError> {
        if partitions == 0 {
            return Err(HloError::Signature {
                function: self.module_name.clone(),
                detail: "a program runs on at least 1 partition, not 0".to_owned(),
            });
        }
        self.partitions = Some(partitions);
        Ok(())
    }

    /// Lays argument `arg` out over the partitions as `sharding` (`mhlo.sharding`).
    pub fn shard_argument(&mut self, arg: Value, sharding: Sharding) -> Result<(), HloError> {
        let ty = self.check_value("func.func", arg)?.clone();
        let Def::Argument(position) = self.values[arg.index()].def else {
            return Err(HloError::Signature {
                function: self.module_name.clone(),
                detail: format!(
                    "only arguments and results take a sharding; value #{} is an op result",
                    arg.index
                ),
            });
        };
        sharding.check(&ty).map_err(|reason| HloError::Signature {
            function: self.module_name.clone(),
            detail: format!("argument {position}: {reason}"),
        })?;
        self.arguments[position].sharding = Some(sharding);
        Ok(())
    }

    /// Lays result `output` out over the partitions as `sharding` (`mhlo.sharding` on the
    /// result). Checked against the results in `finish`.
    pub fn shard_result(&mut self, output: usize, sharding: Sharding) -> Result<(), HloError> {
        if self.result_shardings.iter().any(|(o, _)| *o == output) {
            return Err(HloError::Signature {
                function: self.module_name.clone(),
                detail: format!("result {output} is given a sharding twice"),
            });
        }
        self.result_shardings.push((output, sharding));
        Ok(())
    }

    /// The type of `v`.
    pub fn ty(&self, v: Value) -> Result<&TensorType, HloError> {
        self.check_value("type_of", v)
    }

    pub(crate) fn check_value(&self, op: &'static str, v: Value) -> Result<&TensorType, HloError> {
        match self.values.get(v.index()) {
            Some(info) if v.builder == self.id => Ok(&info.ty),
            _ => Err(HloError::ForeignValue {
                op,
                index: v.index(),
            }),
        }
    }

    fn push_value(&mut self, ty: TensorType, def: Def) -> Value {
        let index = u32::try_from(self.values.len()).expect("more than 2^32 values in a function");
        self.values.push(ValueInfo { ty, def });
        Value {
            builder: self.id,
            index,
        }
    }

    /// Records an op whose operands and attributes the caller has checked.
    pub(crate) fn push_op(
        &mut self,
        kind: OpKind,
        operands: Vec<Value>,
        result_types: Vec<TensorType>,
    ) -> Vec<Value> {
        let op = self.ops.len();
        let results: Vec<Value> = result_types
            .into_iter()
            .enumerate()
            .map(|(result, ty)| self.push_value(ty, Def::OpResult { op, result }))
            .collect();
        self.ops.push(Op {
            kind,
            operands,
            results: results.clone(),
        });
        results
    }

    pub(crate) fn push_op1(
        &mut self,
        kind: OpKind,
        operands: Vec<Value>,
        result_type: TensorType,
    ) -> Value {
        self.push_op(kind, operands, vec![result_type])[0]
    }

    /// Ends the function returning `results`, and checks the signature: at least one result,
    /// every donated argument points at a result of its own type.
    pub fn finish(self, results: &[Value]) -> Result<Module, HloError> {
        let signature_error = |detail: String| HloError::Signature {
            function: self.module_name.clone(),
            detail,
        };
        if !is_symbol_name(&self.module_name) {
            return Err(signature_error(format!(
                "module name {:?} refused: use a letter or `_` then letters, digits, `_` or `.`",
                self.module_name
            )));
        }
        if results.is_empty() {
            return Err(signature_error(
                "a function needs at least one result".to_owned(),
            ));
        }
        let mut result_types = Vec::with_capacity(results.len());
        for &r in results {
            result_types.push(self.check_value("func.return", r)?.clone());
        }
        for (position, a) in self.arguments.iter().enumerate() {
            let Some(output) = a.aliasing_output else {
                continue;
            };
            match result_types.get(output) {
                None => {
                    return Err(signature_error(format!(
                        "argument {position} is donated to result {output}, but there are only {} results",
                        result_types.len()
                    )));
                }
                Some(t) if *t != a.ty => {
                    return Err(signature_error(format!(
                        "argument {position} ({}) is donated to result {output} of another type ({t}); \
                         a donated buffer must have the result's type",
                        a.ty
                    )));
                }
                Some(_) => {}
            }
        }
        let result_shardings = self.checked_shardings(&result_types)?;
        Ok(Module {
            name: self.module_name,
            arguments: self.arguments,
            values: self.values,
            ops: self.ops,
            results: results.to_vec(),
            result_types,
            partitions: self.partitions,
            result_shardings,
        })
    }

    /// The results' shardings by index, after checking every sharding of the signature: none
    /// without a partition count; with one, every argument and result sharded, each split over
    /// that many partitions, and a donated argument laid out as its result (the result reuses
    /// the argument's buffer on every device).
    fn checked_shardings(
        &self,
        result_types: &[TensorType],
    ) -> Result<Vec<Option<Sharding>>, HloError> {
        let signature_error = |detail: String| HloError::Signature {
            function: self.module_name.clone(),
            detail,
        };
        let mut shardings = vec![None; result_types.len()];
        for &(output, sharding) in &self.result_shardings {
            let ty = result_types.get(output).ok_or_else(|| {
                signature_error(format!(
                    "result {output} is given a sharding, but there are only {} results",
                    result_types.len()
                ))
            })?;
            sharding
                .check(ty)
                .map_err(|reason| signature_error(format!("result {output}: {reason}")))?;
            shardings[output] = Some(sharding);
        }
        let Some(partitions) = self.partitions else {
            let sharded = self.arguments.iter().any(|a| a.sharding.is_some())
                || !self.result_shardings.is_empty();
            if sharded {
                return Err(signature_error(
                    "shardings are given but no partition count; call set_partitions".to_owned(),
                ));
            }
            return Ok(shardings);
        };
        let operands = self
            .arguments
            .iter()
            .enumerate()
            .map(|(i, a)| (format!("argument {i}"), a.sharding))
            .chain(
                shardings
                    .iter()
                    .enumerate()
                    .map(|(i, s)| (format!("result {i}"), *s)),
            );
        for (what, sharding) in operands {
            match sharding {
                None => {
                    return Err(signature_error(format!(
                        "{what} has no sharding; in a program over {partitions} partitions every \
                         argument and result states one"
                    )));
                }
                Some(s) if s.parts().is_some_and(|p| p != partitions) => {
                    return Err(signature_error(format!(
                        "{what} is split over {} partitions, but the program runs on {partitions}",
                        s.parts().unwrap_or(1)
                    )));
                }
                Some(_) => {}
            }
        }
        for (position, a) in self.arguments.iter().enumerate() {
            if let Some(output) = a.aliasing_output
                && a.sharding != shardings[output]
            {
                return Err(signature_error(format!(
                    "argument {position} is donated to result {output} but laid out differently \
                     ({:?} and {:?}); a donated buffer keeps its layout",
                    a.sharding, shardings[output]
                )));
            }
        }
        Ok(shardings)
    }
}
