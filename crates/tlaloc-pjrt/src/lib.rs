//! Safe Rust binding of the PJRT C API, loaded at run time.
//!
//! Every `unsafe` block of the project lives in this crate, in three layers: [`ffi`] (hand-written
//! `#[repr(C)]` mirrors, checked against the plugin's header by a test), `api` (the loaded function
//! table and the single path every C call takes, which checks the entry is present and turns a
//! `PJRT_Error*` into [`Error`]), and the safe owning types ([`Plugin`], [`Client`], [`Device`],
//! [`Buffer`], [`LoadedExecutable`], [`Event`]), each destroying its PJRT object on drop.
//! [`host_kernel`] registers Rust kernels as XLA custom calls; its C side is [`xla_ffi`].

mod api;
mod buffer;
mod client;
mod compile_options;
pub mod discovery;
mod error;
mod event;
mod executable;
pub mod ffi;
pub mod host_kernel;
mod pinned;
mod plugin;
#[cfg(feature = "testing")]
pub mod testing;
pub mod xla_ffi;

pub use buffer::{Buffer, Element, ElementType, PendingHostCopy};
pub use client::{Client, ClientOptions, Device, GpuAllocator, GpuOptions, MemoryStats};
pub use compile_options::{CompileOptions, DeviceAssignment, XlaOptionValue};
pub use error::{Error, ErrorCode, Result};
pub use event::Event;
pub use executable::{ExecuteArg, LoadedExecutable};
pub use host_kernel::{
    ElementType as HostElementType, HOST_PLATFORM, HostBuffer, HostBufferMut, HostKernel,
    MAX_HOST_KERNELS, register_host_kernel,
};
pub use pinned::PinnedHostMemory;
pub use plugin::{AttributeValue, Plugin};
