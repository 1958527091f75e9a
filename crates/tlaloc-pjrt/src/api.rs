//! The thin layer: the loaded `PJRT_Api` table and the one path every C call takes.
//!
//! [`pjrt_call!`] reads an entry only after checking that the plugin's table (`struct_size`)
//! reaches past that field, refuses a null entry by name, calls it, and turns a returned
//! `PJRT_Error*` into [`Error::Pjrt`] (message and code copied, the C error destroyed). Nothing
//! else in the crate touches the table.

use std::ffi::c_char;
use std::mem::{offset_of, size_of};
use std::path::{Path, PathBuf};

use crate::error::{Error, ErrorCode, Result};
use crate::ffi::{self, ArgsStruct};

/// Calls one `PJRT_Api` entry: `unsafe { pjrt_call!(api, PJRT_Entry_Name, &mut args) }`.
///
/// The expansion contains an `unsafe fn` call, so the call site must be inside `unsafe` and say
/// why every pointer inside `args` is valid for the call.
macro_rules! pjrt_call {
    ($api:expr, $entry:ident, $args:expr) => {{
        let api: &$crate::api::Api = $api;
        // The closure is never called: it ties the type read at the offset to the field's type.
        let entry = api.entry(
            ::std::mem::offset_of!($crate::ffi::PJRT_Api, $entry),
            stringify!($entry),
            |table| &table.$entry,
        );
        match entry {
            Ok(function) => api.invoke(function, $args, stringify!($entry)),
            Err(error) => Err(error),
        }
    }};
}
pub(crate) use pjrt_call;

/// Entries this binding cannot work without; `Plugin::load` refuses a table too short for them.
/// The optional ones (`PJRT_Plugin_Initialize`, `PJRT_Device_MemoryStats`, the device-pointer
/// queries...) are checked at each call.
const REQUIRED_ENTRIES: &[(&str, usize)] = &[
    (
        "PJRT_Error_Destroy",
        offset_of!(ffi::PJRT_Api, PJRT_Error_Destroy),
    ),
    (
        "PJRT_Error_Message",
        offset_of!(ffi::PJRT_Api, PJRT_Error_Message),
    ),
    (
        "PJRT_Error_GetCode",
        offset_of!(ffi::PJRT_Api, PJRT_Error_GetCode),
    ),
    (
        "PJRT_Event_Await",
        offset_of!(ffi::PJRT_Api, PJRT_Event_Await),
    ),
    (
        "PJRT_Client_Create",
        offset_of!(ffi::PJRT_Api, PJRT_Client_Create),
    ),
    (
        "PJRT_Client_Compile",
        offset_of!(ffi::PJRT_Api, PJRT_Client_Compile),
    ),
    (
        "PJRT_Client_BufferFromHostBuffer",
        offset_of!(ffi::PJRT_Api, PJRT_Client_BufferFromHostBuffer),
    ),
    (
        "PJRT_LoadedExecutable_Execute",
        offset_of!(ffi::PJRT_Api, PJRT_LoadedExecutable_Execute),
    ),
    (
        "PJRT_Executable_DeserializeAndLoad",
        offset_of!(ffi::PJRT_Api, PJRT_Executable_DeserializeAndLoad),
    ),
    (
        "PJRT_Buffer_ToHostBuffer",
        offset_of!(ffi::PJRT_Api, PJRT_Buffer_ToHostBuffer),
    ),
];

/// A loaded plugin library and its function table.
pub(crate) struct Api {
    table: *const ffi::PJRT_Api,
    table_size: usize,
    version: (i32, i32),
    path: PathBuf,
    // Declared last so that it is dropped after everything above; `table` points into it.
    _library: libloading::Library,
}

// SAFETY: the table is immutable data inside the loaded library, which `Api` keeps loaded; PJRT
// requires its entries to be callable from any thread.
unsafe impl Send for Api {}
// SAFETY: as above; `Api` has no interior mutability.
unsafe impl Sync for Api {}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Api")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("table_size", &self.table_size)
            .finish_non_exhaustive()
    }
}

impl Api {
    /// Opens the library, fetches `GetPjrtApi()`, and checks `struct_size` and the major version
    /// before any function pointer is read.
    pub(crate) fn load(path: &Path) -> Result<Api> {
        let load_error = |reason: String| Error::Load {
            path: path.to_path_buf(),
            reason,
        };
        // SAFETY: opening a library runs its initialisers; a PJRT plugin is built to be opened
        // this way by its host (JAX does exactly this). Nothing else is assumed of it yet.
        let library =
            unsafe { libloading::Library::new(path) }.map_err(|e| load_error(e.to_string()))?;
        // SAFETY: `GetPjrtApi` is declared by the PJRT C API as `const PJRT_Api* GetPjrtApi()`;
        // the symbol's type here is exactly that.
        let get_api = unsafe {
            library.get::<unsafe extern "C" fn() -> *const ffi::PJRT_Api>(b"GetPjrtApi\0")
        }
        .map_err(|e| load_error(format!("no `GetPjrtApi` symbol ({e})")))?;
        // SAFETY: `GetPjrtApi` takes no arguments and returns a pointer to a static table.
        let table = unsafe { get_api() };
        if table.is_null() {
            return Err(load_error("`GetPjrtApi` returned a null table".to_string()));
        }
        // SAFETY: every PJRT version's table begins with `size_t struct_size`.
        let table_size = unsafe { (&raw const (*table).struct_size).read() };
        let version_end =
            offset_of!(ffi::PJRT_Api, pjrt_api_version) + size_of::<ffi::PJRT_Api_Version>();
        if table_size < version_end {
            return Err(Error::TableTooShort {
                path: path.to_path_buf(),
                found: table_size,
                needed: version_end,
                entry: "pjrt_api_version",
            });
        }
        // SAFETY: the table is at least `version_end` bytes long, checked just above.
        let version = unsafe { (&raw const (*table).pjrt_api_version).read() };
        if version.major_version != 0 {
            return Err(Error::UnsupportedVersion {
                path: path.to_path_buf(),
                major: version.major_version,
                minor: version.minor_version,
            });
        }
        if let Some(&(entry, offset)) = REQUIRED_ENTRIES.iter().max_by_key(|(_, offset)| *offset) {
            let needed = offset + size_of::<usize>();
            if table_size < needed {
                return Err(Error::TableTooShort {
                    path: path.to_path_buf(),
                    found: table_size,
                    needed,
                    entry,
                });
            }
        }
        let api = Api {
            table,
            table_size,
            version: (version.major_version, version.minor_version),
            path: path.to_path_buf(),
            _library: library,
        };
        for &(entry, offset) in REQUIRED_ENTRIES {
            // SAFETY: the table reaches past every required entry, checked above.
            let pointer = unsafe { table.cast::<u8>().add(offset).cast::<*const ()>().read() };
            if pointer.is_null() {
                return Err(Error::MissingEntry {
                    path: path.to_path_buf(),
                    entry,
                });
            }
        }
        Ok(api)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn version(&self) -> (i32, i32) {
        self.version
    }

    /// The head of the plugin's extension chain (`PJRT_Api.extension_start`); null when the
    /// plugin has no extensions.
    pub(crate) fn extension_start(&self) -> *const ffi::PJRT_Extension_Base {
        // SAFETY: `load` checked that the table reaches past `pjrt_api_version`, which follows
        // `extension_start`; the table is static data of the library `self` keeps loaded.
        unsafe { (&raw const (*self.table).extension_start).read() }
    }

    /// Whether the table reaches past the entry at `offset` (an optional entry may be absent).
    pub(crate) fn covers(&self, offset: usize) -> bool {
        offset + size_of::<usize>() <= self.table_size
    }

    /// Reads the entry at `offset` (the offset of the field `field` names), only once the table
    /// is known to reach past it.
    pub(crate) fn entry<F: Copy>(
        &self,
        offset: usize,
        name: &'static str,
        _field: fn(&ffi::PJRT_Api) -> &Option<F>,
    ) -> Result<F> {
        if !self.covers(offset) {
            return Err(Error::MissingEntry {
                path: self.path.clone(),
                entry: name,
            });
        }
        // SAFETY: the plugin's table (static data of the loaded library, kept loaded by `self`)
        // extends past `offset + size_of::<usize>()`, checked just above, and `offset` is the
        // offset of a field of type `Option<F>`, a nullable function pointer of that size.
        let function = unsafe {
            self.table
                .cast::<u8>()
                .add(offset)
                .cast::<Option<F>>()
                .read()
        };
        function.ok_or_else(|| Error::MissingEntry {
            path: self.path.clone(),
            entry: name,
        })
    }

    /// Calls `function` with `args` and converts its returned error.
    ///
    /// # Safety
    /// `function` must be the plugin's entry for `A`, and every pointer inside `args` must be
    /// valid for what that entry does with it for the duration of the call.
    pub(crate) unsafe fn invoke<A: ArgsStruct>(
        &self,
        function: unsafe extern "C" fn(*mut A) -> *mut ffi::PJRT_Error,
        args: &mut A,
        name: &'static str,
    ) -> Result<()> {
        // SAFETY: guaranteed by this function's contract.
        let error = unsafe { function(args) };
        self.take_error(error, name)
    }

    /// Converts (and destroys) a `PJRT_Error*` the plugin handed over; null means success.
    pub(crate) fn take_error(&self, error: *mut ffi::PJRT_Error, call: &'static str) -> Result<()> {
        if error.is_null() {
            return Ok(());
        }
        let message = self.error_message(error);
        let code = self.error_code(error);
        self.destroy_error(error);
        Err(Error::Pjrt {
            call,
            code,
            message,
        })
    }

    fn error_message(&self, error: *mut ffi::PJRT_Error) -> String {
        let Ok(function) = self.entry(
            offset_of!(ffi::PJRT_Api, PJRT_Error_Message),
            "PJRT_Error_Message",
            |t| &t.PJRT_Error_Message,
        ) else {
            return "(the plugin gave no message)".to_string();
        };
        let mut args = ffi::PJRT_Error_Message_Args::new();
        args.error = error;
        // SAFETY: `error` is a live error the plugin just returned; the message it writes back
        // lives as long as `error`, which is destroyed only after the copy below.
        unsafe {
            function(&mut args);
            copy_string(args.message, args.message_size)
        }
    }

    fn error_code(&self, error: *mut ffi::PJRT_Error) -> ErrorCode {
        let Ok(function) = self.entry(
            offset_of!(ffi::PJRT_Api, PJRT_Error_GetCode),
            "PJRT_Error_GetCode",
            |t| &t.PJRT_Error_GetCode,
        ) else {
            return ErrorCode::Unknown;
        };
        let mut args = ffi::PJRT_Error_GetCode_Args::new();
        args.error = error;
        // SAFETY: `error` is a live error the plugin just returned.
        let nested = unsafe { function(&mut args) };
        if nested.is_null() {
            ErrorCode::from_raw(args.code)
        } else {
            self.destroy_error(nested);
            ErrorCode::Unknown
        }
    }

    fn destroy_error(&self, error: *mut ffi::PJRT_Error) {
        let Ok(function) = self.entry(
            offset_of!(ffi::PJRT_Api, PJRT_Error_Destroy),
            "PJRT_Error_Destroy",
            |t| &t.PJRT_Error_Destroy,
        ) else {
            tracing::warn!(plugin = %self.path.display(), "plugin has no PJRT_Error_Destroy; an error object leaks");
            return;
        };
        let mut args = ffi::PJRT_Error_Destroy_Args::new();
        args.error = error;
        // SAFETY: `error` is live and owned by us; it is not used after this call.
        unsafe { function(&mut args) };
    }
}

/// Copies a `(pointer, length)` string from the plugin, replacing invalid UTF-8.
///
/// # Safety
/// `data` must be null or point to `len` readable bytes.
pub(crate) unsafe fn copy_string(data: *const c_char, len: usize) -> String {
    if data.is_null() || len == 0 {
        return String::new();
    }
    // SAFETY: guaranteed by this function's contract.
    let bytes = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) };
    String::from_utf8_lossy(bytes).into_owned()
}

/// Logs (never panics on) a failure inside `Drop`.
pub(crate) fn warn_in_drop(what: &str, result: Result<()>) {
    if let Err(error) = result {
        tracing::warn!("{what} failed while dropping: {error}");
    }
}
