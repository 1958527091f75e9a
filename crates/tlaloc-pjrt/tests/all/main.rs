//! Integration tests of the PJRT binding, linked into one binary. Every test that needs a plugin
//! runs on each plugin of the test convention (`tlaloc_pjrt::testing`).

mod common;
mod execute;
mod host_kernel;
mod layout;
mod pinned;
mod plugin;
mod spmd;
mod xla_ffi_layout;
mod xla_options;
