//! Clients and devices: typed create options, the GPU-options rule, device queries.

use std::ffi::c_char;
use std::sync::Arc;

use crate::api::{copy_string, pjrt_call, warn_in_drop};
use crate::error::{Error, ErrorCode, Result};
use crate::ffi::{self, ArgsStruct};
use crate::plugin::Plugin;

/// Which device allocator the XLA GPU plugin uses (its `allocator` create option).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuAllocator {
    Default,
    Platform,
    Bfc,
    CudaAsync,
}

impl GpuAllocator {
    fn name(self) -> &'static str {
        match self {
            GpuAllocator::Default => "default",
            GpuAllocator::Platform => "platform",
            GpuAllocator::Bfc => "bfc",
            GpuAllocator::CudaAsync => "cuda_async",
        }
    }
}

/// Create options of the XLA GPU plugin (`preallocate`, `memory_fraction`, `allocator`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct GpuOptions {
    /// Whether to reserve `memory_fraction` of the device at start. Default `false`.
    pub preallocate: bool,
    /// Fraction of device memory the allocator may use; plugin default when `None`.
    pub memory_fraction: Option<f32>,
    /// Allocator kind; plugin default when `None`.
    pub allocator: Option<GpuAllocator>,
}

#[derive(Debug, Clone, PartialEq)]
enum OptionsKind {
    PluginDefaults,
    Cpu { device_count: i64 },
    Gpu(GpuOptions),
}

/// Typed create options for [`Client::new`].
#[derive(Debug, Clone, PartialEq)]
pub struct ClientOptions {
    kind: OptionsKind,
}

impl ClientOptions {
    /// A CPU client with one device (`cpu_device_count = 1`).
    pub fn cpu() -> ClientOptions {
        ClientOptions {
            kind: OptionsKind::Cpu { device_count: 1 },
        }
    }

    /// A CPU client with `count` devices (`cpu_device_count = count`; 0 is taken as 1), for
    /// programs partitioned or replicated across devices of one client.
    pub fn cpu_with_devices(count: u32) -> ClientOptions {
        ClientOptions {
            kind: OptionsKind::Cpu {
                device_count: i64::from(count.max(1)),
            },
        }
    }

    /// No create options at all: whatever the plugin does by default. Refused for GPU plugins
    /// (whose default preallocates most of the device memory).
    pub fn plugin_defaults() -> ClientOptions {
        ClientOptions {
            kind: OptionsKind::PluginDefaults,
        }
    }

    /// A GPU client with the given options.
    pub fn gpu(options: GpuOptions) -> ClientOptions {
        ClientOptions {
            kind: OptionsKind::Gpu(options),
        }
    }

    /// GPU options (defaults) when `hint` (a plugin path or platform name) mentions cuda, rocm
    /// or gpu; CPU options otherwise.
    pub fn for_platform_hint(hint: &str) -> ClientOptions {
        let hint = hint.to_ascii_lowercase();
        if ["cuda", "rocm", "gpu"]
            .iter()
            .any(|word| hint.contains(word))
        {
            ClientOptions::gpu(GpuOptions::default())
        } else {
            ClientOptions::cpu()
        }
    }

    fn is_gpu(&self) -> bool {
        matches!(self.kind, OptionsKind::Gpu(_))
    }
}

/// Owned storage behind a `PJRT_NamedValue` list (the strings must outlive the call).
struct NamedValues {
    values: Vec<ffi::PJRT_NamedValue>,
    _strings: Vec<String>,
}

impl NamedValues {
    fn from_options(options: &ClientOptions) -> NamedValues {
        fn value(name: &'static str, kind: ffi::PJRT_NamedValue_Type) -> ffi::PJRT_NamedValue {
            let mut v = ffi::PJRT_NamedValue::new();
            v.name = name.as_ptr().cast::<c_char>();
            v.name_size = name.len();
            v.type_ = kind;
            v.value_size = 1;
            v
        }
        let mut values = Vec::new();
        let mut strings = Vec::new();
        match &options.kind {
            OptionsKind::PluginDefaults => {}
            OptionsKind::Cpu { device_count } => {
                let mut v = value("cpu_device_count", ffi::PJRT_NamedValue_kInt64);
                v.value.int64_value = *device_count;
                values.push(v);
            }
            OptionsKind::Gpu(gpu) => {
                let mut v = value("preallocate", ffi::PJRT_NamedValue_kBool);
                v.value.bool_value = gpu.preallocate;
                values.push(v);
                if let Some(fraction) = gpu.memory_fraction {
                    let mut v = value("memory_fraction", ffi::PJRT_NamedValue_kFloat);
                    v.value.float_value = fraction;
                    values.push(v);
                }
                if let Some(allocator) = gpu.allocator {
                    let name = allocator.name().to_string();
                    let mut v = value("allocator", ffi::PJRT_NamedValue_kString);
                    v.value.string_value = name.as_ptr().cast::<c_char>();
                    v.value_size = name.len();
                    values.push(v);
                    // Moving the String into the Vec keeps its heap buffer where it is.
                    strings.push(name);
                }
            }
        }
        NamedValues {
            values,
            _strings: strings,
        }
    }
}

pub(crate) struct ClientInner {
    pub(crate) plugin: Plugin,
    pub(crate) raw: *mut ffi::PJRT_Client,
}

// SAFETY: a PJRT client is thread-safe (PjRtClient's methods may be called concurrently); the
// handle is destroyed once, in Drop.
unsafe impl Send for ClientInner {}
// SAFETY: as above.
unsafe impl Sync for ClientInner {}

impl Drop for ClientInner {
    fn drop(&mut self) {
        let mut args = ffi::PJRT_Client_Destroy_Args::new();
        args.client = self.raw;
        // SAFETY: `raw` is the live client this value owns; every buffer, executable and device
        // made from it holds an `Arc` of this value, so none outlives it.
        let result = unsafe { pjrt_call!(self.plugin.api(), PJRT_Client_Destroy, &mut args) };
        warn_in_drop("PJRT_Client_Destroy", result);
    }
}

/// A PJRT client. Cheap to clone, `Send + Sync`.
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<ClientInner>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("plugin", &self.inner.plugin.path())
            .field("platform", &self.platform_name().unwrap_or_default())
            .finish()
    }
}

impl Client {
    /// Creates a client with typed options. Refuses (and destroys) a GPU client created without
    /// GPU options.
    pub fn new(plugin: &Plugin, options: ClientOptions) -> Result<Client> {
        let named = NamedValues::from_options(&options);
        let mut args = ffi::PJRT_Client_Create_Args::new();
        args.create_options = named.values.as_ptr();
        args.num_options = named.values.len();
        // SAFETY: `named` (values and the strings they point to) lives until after the call; no
        // key-value callbacks are passed.
        unsafe { pjrt_call!(plugin.api(), PJRT_Client_Create, &mut args) }?;
        drop(named);
        if args.client.is_null() {
            return Err(Error::Pjrt {
                call: "PJRT_Client_Create",
                code: ErrorCode::Internal,
                message: "the plugin returned no client".to_string(),
            });
        }
        let client = Client {
            inner: Arc::new(ClientInner {
                plugin: plugin.clone(),
                raw: args.client,
            }),
        };
        let platform = client.platform_name()?;
        let lower = platform.to_ascii_lowercase();
        if !options.is_gpu()
            && ["cuda", "rocm", "gpu"]
                .iter()
                .any(|word| lower.contains(word))
        {
            return Err(Error::GpuWithoutOptions { platform });
        }
        Ok(client)
    }

    /// The plugin this client was made from.
    pub fn plugin(&self) -> &Plugin {
        &self.inner.plugin
    }

    pub(crate) fn raw(&self) -> *mut ffi::PJRT_Client {
        self.inner.raw
    }

    /// `"cpu"`, `"cuda"`, ...
    pub fn platform_name(&self) -> Result<String> {
        let mut args = ffi::PJRT_Client_PlatformName_Args::new();
        args.client = self.raw();
        // SAFETY: the client is live; the name returned lives as long as the client.
        unsafe {
            pjrt_call!(self.plugin().api(), PJRT_Client_PlatformName, &mut args)?;
            Ok(copy_string(args.platform_name, args.platform_name_size))
        }
    }

    /// The platform's version string.
    pub fn platform_version(&self) -> Result<String> {
        let mut args = ffi::PJRT_Client_PlatformVersion_Args::new();
        args.client = self.raw();
        // SAFETY: the client is live; the string returned lives as long as the client.
        unsafe {
            pjrt_call!(self.plugin().api(), PJRT_Client_PlatformVersion, &mut args)?;
            Ok(copy_string(
                args.platform_version,
                args.platform_version_size,
            ))
        }
    }

    /// The devices this process can use.
    pub fn addressable_devices(&self) -> Result<Vec<Device>> {
        let mut args = ffi::PJRT_Client_AddressableDevices_Args::new();
        args.client = self.raw();
        // SAFETY: the client is live; the returned array is owned by the client.
        unsafe {
            pjrt_call!(
                self.plugin().api(),
                PJRT_Client_AddressableDevices,
                &mut args
            )
        }?;
        self.devices_from_raw(args.addressable_devices, args.num_addressable_devices)
    }

    /// The devices of a `(pointer, count)` device array the plugin returned, owned by this
    /// client (a client's or one of its executables' device list).
    pub(crate) fn devices_from_raw(
        &self,
        raws: *const *mut ffi::PJRT_Device,
        count: usize,
    ) -> Result<Vec<Device>> {
        if raws.is_null() || count == 0 {
            return Ok(Vec::new());
        }
        // SAFETY: the plugin returned `count` device pointers in an array it keeps alive as long
        // as the client (or the executable, which holds the client) lives.
        let raws = unsafe { std::slice::from_raw_parts(raws, count) };
        raws.iter()
            .map(|&raw| Device::new(self.clone(), raw))
            .collect()
    }

    /// The first addressable device.
    pub fn first_device(&self) -> Result<Device> {
        self.addressable_devices()?
            .into_iter()
            .next()
            .ok_or_else(|| {
                Error::InvalidArgument("the client has no addressable device".to_string())
            })
    }
}

/// One addressable device of a client.
#[derive(Clone)]
pub struct Device {
    client: Client,
    raw: *mut ffi::PJRT_Device,
    id: i32,
    kind: String,
}

// SAFETY: a device handle is owned by its client (kept alive by `client`) and PJRT device
// queries are thread-safe.
unsafe impl Send for Device {}
// SAFETY: as above.
unsafe impl Sync for Device {}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("id", &self.id)
            .field("kind", &self.kind)
            .finish()
    }
}

/// Device memory statistics; a field is `None` when the plugin does not report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryStats {
    pub bytes_in_use: i64,
    pub peak_bytes_in_use: Option<i64>,
    pub num_allocs: Option<i64>,
    pub largest_alloc_size: Option<i64>,
    pub bytes_limit: Option<i64>,
    pub bytes_reserved: Option<i64>,
    pub peak_bytes_reserved: Option<i64>,
    pub bytes_reservable_limit: Option<i64>,
    pub largest_free_block_bytes: Option<i64>,
    pub pool_bytes: Option<i64>,
    pub peak_pool_bytes: Option<i64>,
}

impl Device {
    pub(crate) fn new(client: Client, raw: *mut ffi::PJRT_Device) -> Result<Device> {
        let api = client.plugin().api();
        let mut description = ffi::PJRT_Device_GetDescription_Args::new();
        description.device = raw;
        // SAFETY: `raw` is a device of the live client.
        unsafe { pjrt_call!(api, PJRT_Device_GetDescription, &mut description) }?;
        let mut id = ffi::PJRT_DeviceDescription_Id_Args::new();
        id.device_description = description.device_description;
        // SAFETY: the description belongs to the device, which the client owns.
        unsafe { pjrt_call!(api, PJRT_DeviceDescription_Id, &mut id) }?;
        let mut kind = ffi::PJRT_DeviceDescription_Kind_Args::new();
        kind.device_description = description.device_description;
        // SAFETY: as above; the kind string lives as long as the description.
        let kind = unsafe {
            pjrt_call!(api, PJRT_DeviceDescription_Kind, &mut kind)?;
            copy_string(kind.device_kind, kind.device_kind_size)
        };
        Ok(Device {
            client,
            raw,
            id: id.id,
            kind,
        })
    }

    pub(crate) fn raw(&self) -> *mut ffi::PJRT_Device {
        self.raw
    }

    /// The client this device belongs to.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The device id (`PJRT_DeviceDescription_Id`).
    pub fn id(&self) -> i32 {
        self.id
    }

    /// The device kind, e.g. `"cpu"` or `"NVIDIA H200"`.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// `PJRT_Device_MemoryStats`; `None` when the plugin does not implement it.
    pub fn memory_stats(&self) -> Result<Option<MemoryStats>> {
        let mut args = ffi::PJRT_Device_MemoryStats_Args::new();
        args.device = self.raw;
        // SAFETY: the device is live (its client is held by `self`).
        match unsafe {
            pjrt_call!(
                self.client.plugin().api(),
                PJRT_Device_MemoryStats,
                &mut args
            )
        } {
            Ok(()) => {}
            Err(Error::MissingEntry { .. }) => return Ok(None),
            Err(error) if error.code() == Some(ErrorCode::Unimplemented) => return Ok(None),
            Err(error) => return Err(error),
        }
        let set = |value: i64, is_set: bool| is_set.then_some(value);
        Ok(Some(MemoryStats {
            bytes_in_use: args.bytes_in_use,
            peak_bytes_in_use: set(args.peak_bytes_in_use, args.peak_bytes_in_use_is_set),
            num_allocs: set(args.num_allocs, args.num_allocs_is_set),
            largest_alloc_size: set(args.largest_alloc_size, args.largest_alloc_size_is_set),
            bytes_limit: set(args.bytes_limit, args.bytes_limit_is_set),
            bytes_reserved: set(args.bytes_reserved, args.bytes_reserved_is_set),
            peak_bytes_reserved: set(args.peak_bytes_reserved, args.peak_bytes_reserved_is_set),
            bytes_reservable_limit: set(
                args.bytes_reservable_limit,
                args.bytes_reservable_limit_is_set,
            ),
            largest_free_block_bytes: set(
                args.largest_free_block_bytes,
                args.largest_free_block_bytes_is_set,
            ),
            pool_bytes: set(args.pool_bytes, args.pool_bytes_is_set),
            peak_pool_bytes: set(args.peak_pool_bytes, args.peak_pool_bytes_is_set),
        }))
    }
}
