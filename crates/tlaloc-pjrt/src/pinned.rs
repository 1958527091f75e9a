//! Host memory registered with the plugin for DMA (`PJRT_Client_DmaMap`).
//!
//! A host-to-device transfer from ordinary, pageable memory either goes through the plugin's own
//! copy into a pinned staging buffer (on one of its threads) or runs at the pageable rate of the
//! link; from memory the plugin has mapped, the copy engine reads it directly. [`PinnedHostMemory`]
//! owns one page-aligned, zero-filled allocation that stays mapped for its whole life and is
//! unmapped before it is freed. The allocation is written by hand (not a `Vec`) because the
//! mapping needs a stable, page-aligned address that nothing may reallocate or free while the
//! plugin holds it.

use std::alloc::Layout;
use std::ffi::c_void;
use std::ptr::NonNull;

use crate::api::{pjrt_call, warn_in_drop};
use crate::client::Client;
use crate::error::{Error, ErrorCode, Result};
use crate::ffi::{self, ArgsStruct};

/// The alignment of a mapped region: a page, which `cudaHostRegister` and similar drivers pin
/// whole.
const PAGE: usize = 4096;

/// Zero-filled host memory mapped for DMA with one client, unmapped and freed on drop.
///
/// Dereferences to its bytes. A transfer that reads it (an upload with
/// `kImmutableUntilTransferCompletes` semantics) must have finished before it is written again
/// or dropped; [`Client::buffer_from_host_bytes`] waits for that before it returns.
pub struct PinnedHostMemory {
    client: Client,
    data: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the allocation is owned uniquely by this value (like a `Vec<u8>`), and the client is
// `Send + Sync`; unmapping through the client may happen on any thread.
unsafe impl Send for PinnedHostMemory {}
// SAFETY: shared access only reads the bytes (`Deref`); writing needs `&mut self`.
unsafe impl Sync for PinnedHostMemory {}

impl std::fmt::Debug for PinnedHostMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedHostMemory")
            .field("len", &self.layout.size())
            .finish()
    }
}

impl Client {
    /// `len` zero-filled bytes of host memory mapped for DMA with this client.
    ///
    /// `Ok(None)` when the plugin does not map host memory: its table has no
    /// `PJRT_Client_DmaMap`, or the call answers `UNIMPLEMENTED` (the CPU plugins, which have no
    /// link to cross). Any other failure (e.g. the driver refusing to pin that much) is an
    /// error; the memory is freed either way.
    pub fn pinned_host_memory(&self, len: usize) -> Result<Option<PinnedHostMemory>> {
        if len == 0 {
            return Err(Error::InvalidArgument(
                "pinned host memory of 0 bytes requested; give at least one byte".to_string(),
            ));
        }
        let layout = Layout::from_size_align(len.next_multiple_of(PAGE), PAGE)
            .map_err(|e| Error::InvalidArgument(format!("{len} bytes of host memory: {e}")))?;
        // SAFETY: the layout's size is non-zero (checked above).
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let Some(data) = NonNull::new(raw) else {
            std::alloc::handle_alloc_error(layout);
        };
        let mut args = ffi::PJRT_Client_DmaMap_Args::new();
        args.client = self.raw();
        args.data = data.as_ptr().cast::<c_void>();
        args.size = layout.size();
        // SAFETY: `data` points to `layout.size()` bytes this function allocated, which stay
        // allocated (and at this address) until `PinnedHostMemory::drop` has unmapped them.
        let mapped = unsafe { pjrt_call!(self.plugin().api(), PJRT_Client_DmaMap, &mut args) };
        if let Err(error) = mapped {
            // SAFETY: `data` was allocated above with `layout`, and the plugin did not map it.
            unsafe { std::alloc::dealloc(data.as_ptr(), layout) };
            return match error {
                Error::MissingEntry { .. } => Ok(None),
                error if error.code() == Some(ErrorCode::Unimplemented) => Ok(None),
                error => Err(error),
            };
        }
        Ok(Some(PinnedHostMemory {
            client: self.clone(),
            data,
            layout,
        }))
    }
}

impl PinnedHostMemory {
    /// The length in bytes (the requested length rounded up to a whole page).
    pub fn len(&self) -> usize {
        self.layout.size()
    }

    /// Always false: a zero-length region is refused at creation.
    pub fn is_empty(&self) -> bool {
        false
    }
}

impl std::ops::Deref for PinnedHostMemory {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `data` is a live, initialised (zero-filled) allocation of `layout.size()` bytes
        // owned by `self`.
        unsafe { std::slice::from_raw_parts(self.data.as_ptr(), self.layout.size()) }
    }
}

impl std::ops::DerefMut for PinnedHostMemory {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`; `&mut self` makes this the only access.
        unsafe { std::slice::from_raw_parts_mut(self.data.as_ptr(), self.layout.size()) }
    }
}

impl Drop for PinnedHostMemory {
    fn drop(&mut self) {
        // `PinnedHostMemory` only exists once mapped (see `Client::pinned_host_memory`).
        let mut args = ffi::PJRT_Client_DmaUnmap_Args::new();
        args.client = self.client.raw();
        args.data = self.data.as_ptr().cast::<c_void>();
        // SAFETY: `data` is the start of a region this client mapped; the client is live (held
        // by `self`), and no transfer reads it any more (see the type's contract).
        let result =
            unsafe { pjrt_call!(self.client.plugin().api(), PJRT_Client_DmaUnmap, &mut args) };
        if result.is_err() {
            // The driver may still hold the pages: leak them rather than hand them back to the
            // allocator while mapped.
            warn_in_drop("PJRT_Client_DmaUnmap", result);
            return;
        }
        // SAFETY: allocated in `Client::pinned_host_memory` with `layout`; unmapped just above,
        // so the plugin no longer refers to it.
        unsafe { std::alloc::dealloc(self.data.as_ptr(), self.layout) };
    }
}
