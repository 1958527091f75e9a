//! A loaded PJRT plugin: the library, its checked function table, and its attributes.
//!
//! Plugins are loaded once per path and never unloaded: XLA plugins start thread pools and
//! register process-wide state at load time, and `dlclose` under them is not safe. A second
//! `Plugin::load` of the same file returns the same handle.

use std::mem::offset_of;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::api::{Api, copy_string, pjrt_call};
use crate::error::{Error, Result};
use crate::ffi::{self, ArgsStruct};

/// A loaded PJRT plugin. Cheap to clone; everything made from it keeps it alive.
#[derive(Debug, Clone)]
pub struct Plugin {
    api: Arc<Api>,
}

/// One value of a plugin or device attribute (`PJRT_NamedValue`).
#[derive(Debug, Clone, PartialEq)]
pub enum AttributeValue {
    String(String),
    Int64(i64),
    Int64List(Vec<i64>),
    Float(f32),
    Bool(bool),
}

static LOADED: Mutex<Vec<(PathBuf, Plugin)>> = Mutex::new(Vec::new());

impl Plugin {
    /// Opens the plugin at `path`, checks its table size and major version before reading any
    /// function pointer, and calls `PJRT_Plugin_Initialize` when the plugin has it.
    pub fn load(path: impl AsRef<Path>) -> Result<Plugin> {
        let path = path.as_ref();
        let key = path.canonicalize().map_err(|e| Error::Load {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        let mut loaded = LOADED
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some((_, plugin)) = loaded.iter().find(|(p, _)| *p == key) {
            return Ok(plugin.clone());
        }
        let api = Api::load(path)?;
        if api.covers(offset_of!(ffi::PJRT_Api, PJRT_Plugin_Initialize)) {
            let mut args = ffi::PJRT_Plugin_Initialize_Args::new();
            // SAFETY: the args hold no pointers.
            match unsafe { pjrt_call!(&api, PJRT_Plugin_Initialize, &mut args) } {
                Ok(()) | Err(Error::MissingEntry { .. }) => {}
                Err(error) => return Err(error),
            }
        }
        let plugin = Plugin { api: Arc::new(api) };
        loaded.push((key, plugin.clone()));
        Ok(plugin)
    }

    pub(crate) fn api(&self) -> &Api {
        &self.api
    }

    /// The path the plugin was loaded from.
    pub fn path(&self) -> &Path {
        self.api.path()
    }

    /// The PJRT C API version the plugin was built against, `(major, minor)`.
    pub fn api_version(&self) -> (u32, u32) {
        let (major, minor) = self.api.version();
        (major.max(0) as u32, minor.max(0) as u32)
    }

    /// `PJRT_Plugin_Attributes`: `xla_version`, `stablehlo_current_version`, ... Empty when the
    /// plugin does not provide the entry.
    pub fn attributes(&self) -> Result<Vec<(String, AttributeValue)>> {
        let mut args = ffi::PJRT_Plugin_Attributes_Args::new();
        // SAFETY: the args hold only out-pointers the plugin fills.
        match unsafe { pjrt_call!(self.api(), PJRT_Plugin_Attributes, &mut args) } {
            Ok(()) => {}
            Err(Error::MissingEntry { .. }) => return Ok(Vec::new()),
            Err(error) => return Err(error),
        }
        // SAFETY: the plugin returned `num_attributes` named values that live as long as the
        // process (PJRT_Plugin_Attributes' contract).
        Ok(unsafe { named_values(args.attributes, args.num_attributes) })
    }

    fn attribute(&self, name: &str) -> Option<AttributeValue> {
        self.attributes()
            .ok()?
            .into_iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v)
    }

    /// The `xla_version` attribute, when present.
    pub fn xla_version(&self) -> Option<i64> {
        match self.attribute("xla_version")? {
            AttributeValue::Int64(v) => Some(v),
            _ => None,
        }
    }

    /// The `stablehlo_current_version` attribute (e.g. `[1, 9, 5]`), when present.
    pub fn stablehlo_current_version(&self) -> Option<Vec<i64>> {
        match self.attribute("stablehlo_current_version")? {
            AttributeValue::Int64List(v) => Some(v),
            _ => None,
        }
    }

    /// Whether the plugin can register custom-call handlers (its PJRT FFI extension with
    /// `register_handler`, see [`crate::register_host_kernel`]); the error names what is missing.
    pub fn ffi_handlers_supported(&self) -> Result<()> {
        crate::xla_ffi::register_handler_entry(self.api())
            .map(|_| ())
            .map_err(|reason| Error::FfiUnsupported {
                path: self.path().to_path_buf(),
                reason,
            })
    }

    /// The `stablehlo_minimum_version` attribute, when present.
    pub fn stablehlo_minimum_version(&self) -> Option<Vec<i64>> {
        match self.attribute("stablehlo_minimum_version")? {
            AttributeValue::Int64List(v) => Some(v),
            _ => None,
        }
    }
}

/// Copies `count` named values out of the plugin.
///
/// # Safety
/// `values` must be null or point to `count` valid `PJRT_NamedValue`s whose strings and arrays
/// are readable for the duration of the call.
pub(crate) unsafe fn named_values(
    values: *const ffi::PJRT_NamedValue,
    count: usize,
) -> Vec<(String, AttributeValue)> {
    if values.is_null() || count == 0 {
        return Vec::new();
    }
    // SAFETY: guaranteed by this function's contract.
    let values = unsafe { std::slice::from_raw_parts(values, count) };
    let mut out = Vec::with_capacity(count);
    for value in values {
        // SAFETY: each field read is the one `type_` says is active; strings and lists come with
        // their lengths.
        let (name, decoded) = unsafe {
            let name = copy_string(value.name, value.name_size);
            let decoded = match value.type_ {
                ffi::PJRT_NamedValue_kString => Some(AttributeValue::String(copy_string(
                    value.value.string_value,
                    value.value_size,
                ))),
                ffi::PJRT_NamedValue_kInt64 => Some(AttributeValue::Int64(value.value.int64_value)),
                ffi::PJRT_NamedValue_kInt64List => {
                    let list = value.value.int64_array_value;
                    Some(AttributeValue::Int64List(
                        if list.is_null() || value.value_size == 0 {
                            Vec::new()
                        } else {
                            std::slice::from_raw_parts(list, value.value_size).to_vec()
                        },
                    ))
                }
                ffi::PJRT_NamedValue_kFloat => Some(AttributeValue::Float(value.value.float_value)),
                ffi::PJRT_NamedValue_kBool => Some(AttributeValue::Bool(value.value.bool_value)),
                _ => None,
            };
            (name, decoded)
        };
        match decoded {
            Some(decoded) => out.push((name, decoded)),
            None => {
                tracing::warn!(attribute = %name, kind = value.type_, "skipping an attribute of unknown type")
            }
        }
    }
    out
}
