//! Rust host kernels as XLA custom calls: the safe surface ([`HostKernel`], [`HostBuffer`],
//! [`HostBufferMut`], [`register_host_kernel`]) and the process-wide bookkeeping of what is
//! registered where.
//!
//! A kernel registered under a target answers `stablehlo.custom_call @target(...)
//! {api_version = 4 : i32}` (typed FFI) in programs compiled afterwards by that plugin. XLA keeps
//! one handler registry per plugin library and never forgets a handler, so registration is
//! permanent for the process: registering the same kernel again is a no-op, a different kernel
//! under a used target is refused. The C side (trampolines, call-frame decoding) lives in
//! `xla_ffi`; nothing here is `unsafe`.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};
use crate::plugin::Plugin;
use crate::xla_ffi;

/// The platform name host kernels are registered on: XLA's CPU platform ("cpu" is canonicalized
/// to it).
pub const HOST_PLATFORM: &str = "Host";

/// How many distinct `(target, kernel)` pairs one process can register.
pub const MAX_HOST_KERNELS: usize = xla_ffi::SLOT_COUNT;

/// Element type of a custom-call operand (from `XLA_FFI_DataType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ElementType {
    F32,
    Bf16,
    F16,
    I32,
    I8,
    U8,
    /// Any other `XLA_FFI_DataType` code (its bytes are still readable).
    Other(i32),
}

impl ElementType {
    // The XLA constant names are kept as the C header spells them.
    #[allow(non_upper_case_globals)]
    pub(crate) fn from_raw(code: i32) -> ElementType {
        match code {
            xla_ffi::XLA_FFI_DataType_F32 => ElementType::F32,
            xla_ffi::XLA_FFI_DataType_BF16 => ElementType::Bf16,
            xla_ffi::XLA_FFI_DataType_F16 => ElementType::F16,
            xla_ffi::XLA_FFI_DataType_S32 => ElementType::I32,
            xla_ffi::XLA_FFI_DataType_S8 => ElementType::I8,
            xla_ffi::XLA_FFI_DataType_U8 => ElementType::U8,
            other => ElementType::Other(other),
        }
    }

    /// Bytes per element of an `XLA_FFI_DataType` code; `None` for codes without a whole-byte
    /// dense layout known here (tokens, sub-byte integers, codes this crate does not know).
    #[allow(non_upper_case_globals)]
    pub(crate) fn byte_size_of_raw(code: i32) -> Option<usize> {
        use xla_ffi::*;
        match code {
            XLA_FFI_DataType_PRED
            | XLA_FFI_DataType_S8
            | XLA_FFI_DataType_U8
            | XLA_FFI_DataType_F8E5M2
            | XLA_FFI_DataType_F8E4M3FN => Some(1),
            XLA_FFI_DataType_S16
            | XLA_FFI_DataType_U16
            | XLA_FFI_DataType_F16
            | XLA_FFI_DataType_BF16 => Some(2),
            XLA_FFI_DataType_S32 | XLA_FFI_DataType_U32 | XLA_FFI_DataType_F32 => Some(4),
            XLA_FFI_DataType_S64 | XLA_FFI_DataType_U64 | XLA_FFI_DataType_F64
            | XLA_FFI_DataType_C64 => Some(8),
            XLA_FFI_DataType_C128 => Some(16),
            _ => None,
        }
    }
}

fn element_count(dims: &[i64]) -> usize {
    dims.iter()
        .map(|&d| usize::try_from(d).unwrap_or(0))
        .product()
}

/// A read-only custom-call operand: element type, dims, and its bytes (dense, row-major;
/// `bytes().len()` is the product of `dims` times the element size, checked before the kernel
/// runs).
#[derive(Debug, Clone, Copy)]
pub struct HostBuffer<'a> {
    dtype: ElementType,
    dims: &'a [i64],
    bytes: &'a [u8],
}

impl<'a> HostBuffer<'a> {
    pub(crate) fn new(dtype: ElementType, dims: &'a [i64], bytes: &'a [u8]) -> Self {
        HostBuffer { dtype, dims, bytes }
    }

    /// The element type.
    pub fn dtype(&self) -> ElementType {
        self.dtype
    }

    /// The dimensions, outermost first.
    pub fn dims(&self) -> &'a [i64] {
        self.dims
    }

    /// The number of elements (product of the dims).
    pub fn element_count(&self) -> usize {
        element_count(self.dims)
    }

    /// The raw bytes.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// The elements as `f32`; `None` unless the type is F32 and the data is 4-byte aligned.
    pub fn as_f32(&self) -> Option<&'a [f32]> {
        (self.dtype == ElementType::F32)
            .then(|| bytemuck::try_cast_slice(self.bytes).ok())
            .flatten()
    }

    /// The elements as `i32`; `None` unless the type is I32 and the data is 4-byte aligned.
    pub fn as_i32(&self) -> Option<&'a [i32]> {
        (self.dtype == ElementType::I32)
            .then(|| bytemuck::try_cast_slice(self.bytes).ok())
            .flatten()
    }

    /// The raw 16-bit patterns of a BF16 or F16 operand; `None` for other types or unaligned data.
    pub fn as_u16(&self) -> Option<&'a [u16]> {
        matches!(self.dtype, ElementType::Bf16 | ElementType::F16)
            .then(|| bytemuck::try_cast_slice(self.bytes).ok())
            .flatten()
    }
}

/// A custom-call result the kernel writes: the same accessors as [`HostBuffer`], plus mutable
/// ones. XLA does not initialise it; the kernel must write every element.
#[derive(Debug)]
pub struct HostBufferMut<'a> {
    dtype: ElementType,
    dims: &'a [i64],
    bytes: &'a mut [u8],
}

impl<'a> HostBufferMut<'a> {
    pub(crate) fn new(dtype: ElementType, dims: &'a [i64], bytes: &'a mut [u8]) -> Self {
        HostBufferMut { dtype, dims, bytes }
    }

    /// The element type.
    pub fn dtype(&self) -> ElementType {
        self.dtype
    }

    /// The dimensions, outermost first.
    pub fn dims(&self) -> &'a [i64] {
        self.dims
    }

    /// The number of elements (product of the dims).
    pub fn element_count(&self) -> usize {
        element_count(self.dims)
    }

    /// The raw bytes.
    pub fn bytes(&self) -> &[u8] {
        self.bytes
    }

    /// The raw bytes, writable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        self.bytes
    }

    /// The elements as `f32`; `None` unless the type is F32 and the data is 4-byte aligned.
    pub fn as_f32(&self) -> Option<&[f32]> {
        (self.dtype == ElementType::F32)
            .then(|| bytemuck::try_cast_slice(self.bytes).ok())
            .flatten()
    }

    /// The elements as writable `f32`; `None` unless the type is F32 and the data is aligned.
    pub fn as_f32_mut(&mut self) -> Option<&mut [f32]> {
        if self.dtype != ElementType::F32 {
            return None;
        }
        bytemuck::try_cast_slice_mut(self.bytes).ok()
    }

    /// The elements as writable `i32`; `None` unless the type is I32 and the data is aligned.
    pub fn as_i32_mut(&mut self) -> Option<&mut [i32]> {
        if self.dtype != ElementType::I32 {
            return None;
        }
        bytemuck::try_cast_slice_mut(self.bytes).ok()
    }

    /// The raw 16-bit patterns of a BF16 or F16 result; `None` for other types or unaligned data.
    pub fn as_u16(&self) -> Option<&[u16]> {
        matches!(self.dtype, ElementType::Bf16 | ElementType::F16)
            .then(|| bytemuck::try_cast_slice(self.bytes).ok())
            .flatten()
    }

    /// The raw 16-bit patterns of a BF16 or F16 result, writable.
    pub fn as_u16_mut(&mut self) -> Option<&mut [u16]> {
        if !matches!(self.dtype, ElementType::Bf16 | ElementType::F16) {
            return None;
        }
        bytemuck::try_cast_slice_mut(self.bytes).ok()
    }
}

/// A Rust kernel run by XLA for a custom call. `args` are the call's operands, `results` its
/// results, in order. An `Err` fails the execution with its message; a panic is caught and
/// reported the same way, it never unwinds into C. XLA may call a kernel from several threads at
/// once.
pub trait HostKernel: Send + Sync + 'static {
    /// Computes `results` from `args`.
    fn execute(
        &self,
        args: &[HostBuffer<'_>],
        results: &mut [HostBufferMut<'_>],
    ) -> std::result::Result<(), String>;
}

struct Registration {
    plugin: PathBuf,
    target: String,
    slot: usize,
}

struct Registry {
    /// `(target, kernel)` of each used trampoline slot, by slot index.
    slots: Vec<(String, Arc<dyn HostKernel>)>,
    registrations: Vec<Registration>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    slots: Vec::new(),
    registrations: Vec::new(),
});

fn same_kernel(a: &Arc<dyn HostKernel>, b: &Arc<dyn HostKernel>) -> bool {
    std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b))
}

/// Registers `kernel` as the typed FFI handler of custom-call `target` on [`HOST_PLATFORM`] in
/// `plugin`. Call it before compiling or deserializing any executable that uses `target`.
///
/// Idempotent per `(plugin, target)`: registering the same kernel (the same `Arc`) again returns
/// `Ok`; a different kernel under a target already registered in this plugin is refused
/// ([`Error::HostKernelConflict`]), as is a registration past [`MAX_HOST_KERNELS`].
pub fn register_host_kernel(
    plugin: &Plugin,
    target: &str,
    kernel: Arc<dyn HostKernel>,
) -> Result<()> {
    if target.is_empty() {
        return Err(Error::InvalidArgument(
            "a host kernel needs a non-empty custom-call target name".to_string(),
        ));
    }
    let register =
        xla_ffi::register_handler_entry(plugin.api()).map_err(|reason| Error::FfiUnsupported {
            path: plugin.path().to_path_buf(),
            reason,
        })?;
    let mut registry = REGISTRY
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(existing) = registry
        .registrations
        .iter()
        .find(|r| r.plugin == plugin.path() && r.target == target)
    {
        return if same_kernel(&registry.slots[existing.slot].1, &kernel) {
            Ok(())
        } else {
            Err(Error::HostKernelConflict {
                path: plugin.path().to_path_buf(),
                target: target.to_string(),
            })
        };
    }
    let reused = registry
        .slots
        .iter()
        .position(|(t, k)| t == target && same_kernel(k, &kernel));
    let slot = match reused {
        Some(slot) => slot,
        None if registry.slots.len() < MAX_HOST_KERNELS => registry.slots.len(),
        None => {
            return Err(Error::HostKernelSlotsExhausted {
                target: target.to_string(),
                slots: MAX_HOST_KERNELS,
            });
        }
    };
    if reused.is_none() && !xla_ffi::install(slot, target, Arc::clone(&kernel)) {
        return Err(Error::InvalidArgument(format!(
            "host kernel slot {slot} is already in use"
        )));
    }
    // The kernel is installed before the plugin learns of the trampoline, so the first call can
    // find it. A failed registration keeps the slot: its trampoline stays unknown to every
    // plugin, and the slot is reused when the same kernel is registered under `target` again.
    if reused.is_none() {
        registry.slots.push((target.to_string(), kernel));
    }
    xla_ffi::register_trampoline(plugin.api(), register, target, HOST_PLATFORM, slot)?;
    tracing::debug!(plugin = %plugin.path().display(), target, slot, "registered a host kernel");
    registry.registrations.push(Registration {
        plugin: plugin.path().to_path_buf(),
        target: target.to_string(),
        slot,
    });
    Ok(())
}
