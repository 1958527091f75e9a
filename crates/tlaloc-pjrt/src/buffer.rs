//! Device buffers: upload from host memory, element types, synchronous and asynchronous readback.

use std::ffi::c_void;
use std::sync::Arc;

use crate::api::{pjrt_call, warn_in_drop};
use crate::client::{Client, Device};
use crate::error::{Error, ErrorCode, Result};
use crate::event::Event;
use crate::ffi::{self, ArgsStruct};

/// Element types this binding moves between host and device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ElementType {
    Pred,
    S8,
    S16,
    S32,
    S64,
    U8,
    U16,
    U32,
    U64,
    F16,
    BF16,
    F32,
    F64,
    /// fp8 e4m3 without infinities.
    F8E4M3FN,
}

impl ElementType {
    /// Bytes per element.
    pub fn byte_size(self) -> usize {
        match self {
            ElementType::Pred | ElementType::S8 | ElementType::U8 | ElementType::F8E4M3FN => 1,
            ElementType::S16 | ElementType::U16 | ElementType::F16 | ElementType::BF16 => 2,
            ElementType::S32 | ElementType::U32 | ElementType::F32 => 4,
            ElementType::S64 | ElementType::U64 | ElementType::F64 => 8,
        }
    }

    pub(crate) fn to_raw(self) -> ffi::PJRT_Buffer_Type {
        match self {
            ElementType::Pred => ffi::PJRT_Buffer_Type_PRED,
            ElementType::S8 => ffi::PJRT_Buffer_Type_S8,
            ElementType::S16 => ffi::PJRT_Buffer_Type_S16,
            ElementType::S32 => ffi::PJRT_Buffer_Type_S32,
            ElementType::S64 => ffi::PJRT_Buffer_Type_S64,
            ElementType::U8 => ffi::PJRT_Buffer_Type_U8,
            ElementType::U16 => ffi::PJRT_Buffer_Type_U16,
            ElementType::U32 => ffi::PJRT_Buffer_Type_U32,
            ElementType::U64 => ffi::PJRT_Buffer_Type_U64,
            ElementType::F16 => ffi::PJRT_Buffer_Type_F16,
            ElementType::BF16 => ffi::PJRT_Buffer_Type_BF16,
            ElementType::F32 => ffi::PJRT_Buffer_Type_F32,
            ElementType::F64 => ffi::PJRT_Buffer_Type_F64,
            ElementType::F8E4M3FN => ffi::PJRT_Buffer_Type_F8E4M3FN,
        }
    }

    pub(crate) fn from_raw(raw: ffi::PJRT_Buffer_Type) -> Result<ElementType> {
        Ok(match raw {
            ffi::PJRT_Buffer_Type_PRED => ElementType::Pred,
            ffi::PJRT_Buffer_Type_S8 => ElementType::S8,
            ffi::PJRT_Buffer_Type_S16 => ElementType::S16,
            ffi::PJRT_Buffer_Type_S32 => ElementType::S32,
            ffi::PJRT_Buffer_Type_S64 => ElementType::S64,
            ffi::PJRT_Buffer_Type_U8 => ElementType::U8,
            ffi::PJRT_Buffer_Type_U16 => ElementType::U16,
            ffi::PJRT_Buffer_Type_U32 => ElementType::U32,
            ffi::PJRT_Buffer_Type_U64 => ElementType::U64,
            ffi::PJRT_Buffer_Type_F16 => ElementType::F16,
            ffi::PJRT_Buffer_Type_BF16 => ElementType::BF16,
            ffi::PJRT_Buffer_Type_F32 => ElementType::F32,
            ffi::PJRT_Buffer_Type_F64 => ElementType::F64,
            ffi::PJRT_Buffer_Type_F8E4M3FN => ElementType::F8E4M3FN,
            other => return Err(Error::UnsupportedElementType(other)),
        })
    }
}

/// A Rust type whose values are laid out like one PJRT element.
pub trait Element: bytemuck::Pod + Send + Sync + 'static {
    /// The matching PJRT element type.
    const TYPE: ElementType;
}

macro_rules! element {
    ($($ty:ty => $variant:ident),* $(,)?) => {
        $( impl Element for $ty { const TYPE: ElementType = ElementType::$variant; } )*
    };
}

element!(
    f32 => F32,
    f64 => F64,
    half::bf16 => BF16,
    half::f16 => F16,
    i8 => S8,
    i16 => S16,
    i32 => S32,
    i64 => S64,
    u8 => U8,
    u16 => U16,
    u32 => U32,
    u64 => U64,
);

/// Number of elements of `dims`, refusing negative dimensions and overflow.
pub(crate) fn element_count(dims: &[i64]) -> Result<usize> {
    dims.iter().try_fold(1usize, |acc, &d| {
        let d = usize::try_from(d).map_err(|_| {
            Error::InvalidArgument(format!("dimension {d} in {dims:?} is negative"))
        })?;
        acc.checked_mul(d)
            .ok_or_else(|| Error::InvalidArgument(format!("dimensions {dims:?} overflow")))
    })
}

pub(crate) struct BufferInner {
    client: Client,
    raw: *mut ffi::PJRT_Buffer,
}

// SAFETY: PJRT buffers are thread-safe (PjRtBuffer's methods may be called concurrently); the
// handle is destroyed once, in Drop.
unsafe impl Send for BufferInner {}
// SAFETY: as above.
unsafe impl Sync for BufferInner {}

impl Drop for BufferInner {
    fn drop(&mut self) {
        let mut args = ffi::PJRT_Buffer_Destroy_Args::new();
        args.buffer = self.raw;
        // SAFETY: `raw` is live and owned by this value; it is not used after this call. PJRT
        // keeps the memory alive for work still using it.
        let result =
            unsafe { pjrt_call!(self.client.plugin().api(), PJRT_Buffer_Destroy, &mut args) };
        warn_in_drop("PJRT_Buffer_Destroy", result);
    }
}

/// A device buffer. `Send + Sync`; destroyed on drop.
pub struct Buffer {
    inner: Arc<BufferInner>,
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buffer")
            .field("element_type", &self.element_type().ok())
            .field("dims", &self.dims().ok())
            .finish()
    }
}

impl Client {
    /// Uploads `data` (row-major, `dims`) to `device`. Returns once the plugin no longer reads
    /// `data`, so the slice may be dropped right after.
    pub fn buffer_from_host<T: Element>(
        &self,
        data: &[T],
        dims: &[i64],
        device: &Device,
    ) -> Result<Buffer> {
        self.buffer_from_host_bytes(bytemuck::cast_slice(data), T::TYPE, dims, device)
    }

    /// Uploads raw little-endian bytes of `element_type` with `dims` to `device`.
    pub fn buffer_from_host_bytes(
        &self,
        bytes: &[u8],
        element_type: ElementType,
        dims: &[i64],
        device: &Device,
    ) -> Result<Buffer> {
        let expected = element_count(dims)?
            .checked_mul(element_type.byte_size())
            .ok_or_else(|| Error::InvalidArgument(format!("dimensions {dims:?} overflow")))?;
        if bytes.len() != expected {
            return Err(Error::InvalidArgument(format!(
                "{} bytes given for {element_type:?}{dims:?}, which needs {expected} bytes",
                bytes.len()
            )));
        }
        if !Arc::ptr_eq(&device.client().inner, &self.inner) {
            return Err(Error::InvalidArgument(
                "the device belongs to another client".to_string(),
            ));
        }
        let mut args = ffi::PJRT_Client_BufferFromHostBuffer_Args::new();
        args.client = self.raw();
        args.data = bytes.as_ptr().cast::<c_void>();
        args.type_ = element_type.to_raw();
        args.dims = dims.as_ptr();
        args.num_dims = dims.len();
        args.host_buffer_semantics = ffi::PJRT_HostBufferSemantics_kImmutableUntilTransferCompletes;
        args.device = device.raw();
        // SAFETY: `bytes` and `dims` are live for the call, `bytes` holds exactly the elements
        // `dims` describes (checked above), and `bytes` stays borrowed until the
        // done-with-host-buffer event below has fired.
        unsafe {
            pjrt_call!(
                self.plugin().api(),
                PJRT_Client_BufferFromHostBuffer,
                &mut args
            )
        }?;
        // Own the buffer first so that it is destroyed even if waiting fails, and wait before
        // anything else can return: until then the plugin may still read `bytes`.
        let buffer = Buffer::from_raw(self, args.buffer);
        if let Some(done) = Event::from_raw(self.plugin(), args.done_with_host_buffer) {
            done.wait()?;
        }
        buffer
    }
}

impl Buffer {
    pub(crate) fn from_raw(client: &Client, raw: *mut ffi::PJRT_Buffer) -> Result<Buffer> {
        if raw.is_null() {
            return Err(Error::Pjrt {
                call: "PJRT buffer creation",
                code: ErrorCode::Internal,
                message: "the plugin returned a null buffer".to_string(),
            });
        }
        Ok(Buffer {
            inner: Arc::new(BufferInner {
                client: client.clone(),
                raw,
            }),
        })
    }

    pub(crate) fn raw(&self) -> *mut ffi::PJRT_Buffer {
        self.inner.raw
    }

    /// The client that owns this buffer.
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    fn api(&self) -> &crate::api::Api {
        self.inner.client.plugin().api()
    }

    /// The buffer's dimensions.
    pub fn dims(&self) -> Result<Vec<i64>> {
        let mut args = ffi::PJRT_Buffer_Dimensions_Args::new();
        args.buffer = self.raw();
        // SAFETY: the buffer is live; the returned array is owned by it and copied right away.
        unsafe {
            pjrt_call!(self.api(), PJRT_Buffer_Dimensions, &mut args)?;
            if args.dims.is_null() || args.num_dims == 0 {
                return Ok(Vec::new());
            }
            Ok(std::slice::from_raw_parts(args.dims, args.num_dims).to_vec())
        }
    }

    /// The buffer's element type.
    pub fn element_type(&self) -> Result<ElementType> {
        let mut args = ffi::PJRT_Buffer_ElementType_Args::new();
        args.buffer = self.raw();
        // SAFETY: the buffer is live.
        unsafe { pjrt_call!(self.api(), PJRT_Buffer_ElementType, &mut args) }?;
        ElementType::from_raw(args.type_)
    }

    /// Bytes the buffer occupies on the device.
    pub fn on_device_size(&self) -> Result<usize> {
        let mut args = ffi::PJRT_Buffer_OnDeviceSizeInBytes_Args::new();
        args.buffer = self.raw();
        // SAFETY: the buffer is live.
        unsafe { pjrt_call!(self.api(), PJRT_Buffer_OnDeviceSizeInBytes, &mut args) }?;
        Ok(args.on_device_size_in_bytes)
    }

    /// The device that stores the buffer (`PJRT_Buffer_Device`).
    pub fn device(&self) -> Result<Device> {
        Device::new(self.client().clone(), self.device_raw()?)
    }

    /// The raw handle of the buffer's device, owned by the client.
    pub(crate) fn device_raw(&self) -> Result<*mut ffi::PJRT_Device> {
        let mut args = ffi::PJRT_Buffer_Device_Args::new();
        args.buffer = self.raw();
        // SAFETY: the buffer is live; the device returned is owned by its client, which the
        // buffer holds.
        unsafe { pjrt_call!(self.api(), PJRT_Buffer_Device, &mut args) }?;
        if args.device.is_null() {
            return Err(Error::Pjrt {
                call: "PJRT_Buffer_Device",
                code: ErrorCode::Internal,
                message: "the plugin returned no device".to_string(),
            });
        }
        Ok(args.device)
    }

    /// Whether PJRT has deleted the buffer's memory (after donation, for example).
    pub fn is_deleted(&self) -> Result<bool> {
        let mut args = ffi::PJRT_Buffer_IsDeleted_Args::new();
        args.buffer = self.raw();
        // SAFETY: the buffer handle is live.
        unsafe { pjrt_call!(self.api(), PJRT_Buffer_IsDeleted, &mut args) }?;
        Ok(args.is_deleted)
    }

    /// A new, independent buffer on `device` holding a copy of this one
    /// (`PJRT_Buffer_CopyToDevice`). Returns once the copy has landed. Some plugins refuse a
    /// copy to the device the buffer is already on; that refusal is returned as the error.
    pub fn copy_to_device(&self, device: &Device) -> Result<Buffer> {
        if !Arc::ptr_eq(&device.client().inner, &self.client().inner) {
            return Err(Error::InvalidArgument(
                "the device belongs to another client".to_string(),
            ));
        }
        let mut args = ffi::PJRT_Buffer_CopyToDevice_Args::new();
        args.buffer = self.raw();
        args.dst_device = device.raw();
        // SAFETY: the buffer is live and `device` belongs to the same live client (checked
        // above); the returned buffer becomes ours and is owned right below.
        unsafe { pjrt_call!(self.api(), PJRT_Buffer_CopyToDevice, &mut args) }?;
        let copy = Buffer::from_raw(self.client(), args.dst_buffer)?;
        if let Some(ready) = copy.ready_event()? {
            ready.wait()?;
        }
        Ok(copy)
    }

    /// An event that fires when the buffer's contents are computed.
    pub fn ready_event(&self) -> Result<Option<Event>> {
        let mut args = ffi::PJRT_Buffer_ReadyEvent_Args::new();
        args.buffer = self.raw();
        // SAFETY: the buffer is live; the returned event becomes ours.
        unsafe { pjrt_call!(self.api(), PJRT_Buffer_ReadyEvent, &mut args) }?;
        Ok(Event::from_raw(self.client().plugin(), args.event))
    }

    /// The address of the buffer's device memory (for identity checks such as donation; never
    /// dereferenced here). Uses `PJRT_Buffer_UnsafePointer`, or
    /// `PJRT_Buffer_OpaqueDeviceMemoryDataPointer` when the first is unavailable.
    pub fn unsafe_device_pointer(&self) -> Result<usize> {
        let mut args = ffi::PJRT_Buffer_UnsafePointer_Args::new();
        args.buffer = self.raw();
        // SAFETY: the buffer is live; the call only reports an address.
        let first = unsafe { pjrt_call!(self.api(), PJRT_Buffer_UnsafePointer, &mut args) };
        match first {
            Ok(()) => Ok(args.buffer_pointer),
            Err(error) => {
                let mut opaque = ffi::PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args::new();
                opaque.buffer = self.raw();
                // SAFETY: as above.
                match unsafe {
                    pjrt_call!(
                        self.api(),
                        PJRT_Buffer_OpaqueDeviceMemoryDataPointer,
                        &mut opaque
                    )
                } {
                    Ok(()) => Ok(opaque.device_memory_ptr as usize),
                    Err(_) => Err(error),
                }
            }
        }
    }

    fn host_size(&self) -> Result<usize> {
        let mut args = ffi::PJRT_Buffer_ToHostBuffer_Args::new();
        args.src = self.raw();
        // SAFETY: with a null `dst` the call only reports the size a host copy needs.
        unsafe { pjrt_call!(self.api(), PJRT_Buffer_ToHostBuffer, &mut args) }?;
        Ok(args.dst_size)
    }

    /// Starts copying the buffer (dense, row-major) into `dst`.
    ///
    /// # Safety
    /// `dst` must stay valid and untouched until the returned event has fired.
    unsafe fn start_copy(&self, dst: *mut u8, len: usize) -> Result<Option<Event>> {
        let mut args = ffi::PJRT_Buffer_ToHostBuffer_Args::new();
        args.src = self.raw();
        args.dst = dst.cast::<c_void>();
        args.dst_size = len;
        // SAFETY: `dst` has `len` writable bytes and outlives the copy (this fn's contract).
        unsafe { pjrt_call!(self.api(), PJRT_Buffer_ToHostBuffer, &mut args) }?;
        Ok(Event::from_raw(self.client().plugin(), args.event))
    }

    /// Copies the buffer into `dst`, which must be exactly the buffer's host size.
    pub fn copy_to_host_bytes(&self, dst: &mut [u8]) -> Result<()> {
        let needed = self.host_size()?;
        if dst.len() != needed {
            return Err(Error::InvalidArgument(format!(
                "destination has {} bytes, the buffer needs {needed}",
                dst.len()
            )));
        }
        // SAFETY: `dst` is exclusively borrowed until the event has been awaited below; if the
        // await fails the copy is over too (the event is ready either way).
        let event = unsafe { self.start_copy(dst.as_mut_ptr(), dst.len()) }?;
        match event {
            Some(event) => event.wait(),
            None => Ok(()),
        }
    }

    /// Reads the buffer back as `T`s; refuses a `T` of another element type.
    pub fn to_host_vec<T: Element>(&self) -> Result<Vec<T>> {
        let element_type = self.element_type()?;
        if element_type != T::TYPE {
            return Err(Error::InvalidArgument(format!(
                "buffer holds {element_type:?}, asked for {:?}",
                T::TYPE
            )));
        }
        let count = element_count(&self.dims()?)?;
        let mut out = vec![T::zeroed(); count];
        self.copy_to_host_bytes(bytemuck::cast_slice_mut(&mut out))?;
        Ok(out)
    }

    /// Starts a readback and returns at once; [`PendingHostCopy::wait`] yields the bytes. Lets a
    /// caller launch the next step before the copy lands.
    pub fn to_host_async(&self) -> Result<PendingHostCopy> {
        let len = self.host_size()?;
        let mut data = vec![0u8; len];
        // SAFETY: `data`'s heap block does not move when the Vec is moved into the
        // `PendingHostCopy`, which waits for the event before releasing it (in `wait` or Drop).
        let event = unsafe { self.start_copy(data.as_mut_ptr(), len) }?;
        Ok(PendingHostCopy {
            _source: Arc::clone(&self.inner),
            data,
            event,
        })
    }
}

/// A readback in flight. Waiting (or dropping) blocks until the copy has landed.
pub struct PendingHostCopy {
    _source: Arc<BufferInner>,
    data: Vec<u8>,
    event: Option<Event>,
}

impl std::fmt::Debug for PendingHostCopy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingHostCopy")
            .field("bytes", &self.data.len())
            .finish()
    }
}

impl PendingHostCopy {
    /// Whether the copy has landed.
    pub fn is_ready(&self) -> Result<bool> {
        match &self.event {
            Some(event) => event.is_ready(),
            None => Ok(true),
        }
    }

    /// Waits for the copy and returns the bytes (dense, row-major, little-endian).
    pub fn wait(mut self) -> Result<Vec<u8>> {
        if let Some(event) = self.event.take() {
            event.wait()?;
        }
        Ok(std::mem::take(&mut self.data))
    }
}

impl Drop for PendingHostCopy {
    fn drop(&mut self) {
        if let Some(event) = self.event.take() {
            // The plugin may still be writing into `data`; it must not be freed before this.
            warn_in_drop("waiting for an abandoned host copy", event.wait());
        }
    }
}
