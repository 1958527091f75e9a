//! The custom-call FFI layer: `#[repr(C)]` mirrors of the PJRT FFI extension
//! (`pjrt_c_api_ffi_extension.h`) and of the XLA FFI C API (`xla/ffi/api/c_api.h`), the
//! extension lookup and handler registration, and the fixed table of `extern "C"` trampolines
//! XLA calls for a registered host kernel.
//!
//! A typed FFI handler is a bare C function pointer with no user data, so every handler this crate
//! registers is one of [`SLOT_COUNT`] monomorphised trampolines; the trampoline's const parameter
//! is the index of the [`OnceLock`] holding its kernel. A trampoline answers XLA's metadata query
//! (the call frame registration makes, carrying an `XLA_FFI_Metadata_Extension`), does nothing in
//! the stages before execute, and at execute turns the call frame's buffers into
//! [`HostBuffer`]s / [`HostBufferMut`]s and runs the kernel inside `catch_unwind`: a kernel's
//! error or panic becomes an `XLA_FFI_Error`, nothing unwinds into C.
//!
//! Only the leading fields this crate reads or writes are mirrored (XLA appends fields to these
//! structs over time and checks `struct_size`); [`LAYOUTS`] records every mirrored field and the
//! layout test compares them with the C headers.
//!
//! `PJRT_FFI_Register_Handler_Args` has had two layouts under the same extension version: one
//! with an `int api_version` after `target_name_size`, and the one both CPU plugins are built
//! with (read off their code: `handler` at offset 24, `PJRT_FFI_Register_Handler_Args_STRUCT_SIZE`
//! 52), which registers typed handlers only. The mirror is the latter; the two cannot be told
//! apart at run time. A C++ exception thrown inside a plugin call (a malformed argument) cannot
//! be caught by Rust and aborts the process.
#![allow(
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals,
    missing_docs
)]

use std::ffi::{CString, c_char, c_int, c_void};
use std::mem::{offset_of, size_of};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, OnceLock};

use crate::api::Api;
use crate::error::{Error, Result};
use crate::ffi::{PJRT_Error, PJRT_Extension_Base, PJRT_Extension_Type_FFI, Unused};
use crate::host_kernel::{ElementType, HostBuffer, HostBufferMut, HostKernel};

/// Size and field offsets of one mirrored struct, as Rust lays it out.
#[derive(Debug, Clone, Copy)]
pub struct MirrorLayout {
    /// The C type name.
    pub name: &'static str,
    /// `sizeof` of the Rust mirror.
    pub size: usize,
    /// Whether the mirror is the whole C struct (`sizeof` must match), not a prefix of it.
    pub whole: bool,
    /// `(C field name, offsetof, sizeof field)`.
    pub fields: &'static [(&'static str, usize, usize)],
}

macro_rules! mirror_c_name {
    ($c:literal ; $f:ident) => {
        $c
    };
    (; $f:ident) => {
        stringify!($f)
    };
}

macro_rules! mirror_whole {
    (whole) => {
        true
    };
    (prefix) => {
        false
    };
}

macro_rules! c_mirrors {
    ($(
        #[$kind:ident]
        pub struct $name:ident {
            $( $(#[c_name = $cname:literal])? pub $field:ident : $ty:ty ),* $(,)?
        }
    )*) => {
        $(
            #[repr(C)]
            #[derive(Debug, Clone, Copy)]
            pub struct $name {
                $( pub $field: $ty ),*
            }
        )*

        /// Every mirrored struct, for the layout test.
        pub const LAYOUTS: &[MirrorLayout] = &[$(
            MirrorLayout {
                name: stringify!($name),
                size: size_of::<$name>(),
                whole: mirror_whole!($kind),
                fields: &[$(
                    (
                        mirror_c_name!($($cname)? ; $field),
                        offset_of!($name, $field),
                        size_of::<$ty>(),
                    )
                ),*],
            }
        ),*];
    };
}

macro_rules! c_consts {
    ($( $name:ident = $value:expr; )*) => {
        $( pub const $name: c_int = $value; )*

        /// Every mirrored enum value, for the layout test.
        pub const CONSTS: &[(&str, i64)] = &[$( (stringify!($name), $name as i64) ),*];
    };
}

/// Opaque XLA types only ever seen behind pointers.
#[repr(C)]
#[derive(Debug)]
pub struct XLA_FFI_Error {
    _private: [u8; 0],
}

#[repr(C)]
#[derive(Debug)]
pub struct XLA_FFI_ExecutionContext {
    _private: [u8; 0],
}

/// `XLA_FFI_Error* XLA_FFI_Handler(XLA_FFI_CallFrame*)`.
pub type XLA_FFI_Handler =
    unsafe extern "C" fn(frame: *mut XLA_FFI_CallFrame) -> *mut XLA_FFI_Error;
/// `PJRT_FFI_Register_Handler`.
pub type PJRT_FFI_Register_Handler =
    unsafe extern "C" fn(args: *mut PJRT_FFI_Register_Handler_Args) -> *mut PJRT_Error;
/// `XLA_FFI_Error_Create`.
pub type XLA_FFI_Error_Create =
    unsafe extern "C" fn(args: *mut XLA_FFI_Error_Create_Args) -> *mut XLA_FFI_Error;

c_consts! {
    XLA_FFI_Extension_Metadata = 1;

    XLA_FFI_Error_Code_INVALID_ARGUMENT = 3;
    XLA_FFI_Error_Code_INTERNAL = 13;

    XLA_FFI_DataType_INVALID = 0;
    XLA_FFI_DataType_PRED = 1;
    XLA_FFI_DataType_S8 = 2;
    XLA_FFI_DataType_S16 = 3;
    XLA_FFI_DataType_S32 = 4;
    XLA_FFI_DataType_S64 = 5;
    XLA_FFI_DataType_U8 = 6;
    XLA_FFI_DataType_U16 = 7;
    XLA_FFI_DataType_U32 = 8;
    XLA_FFI_DataType_U64 = 9;
    XLA_FFI_DataType_F16 = 10;
    XLA_FFI_DataType_F32 = 11;
    XLA_FFI_DataType_F64 = 12;
    XLA_FFI_DataType_C64 = 15;
    XLA_FFI_DataType_BF16 = 16;
    XLA_FFI_DataType_TOKEN = 17;
    XLA_FFI_DataType_C128 = 18;
    XLA_FFI_DataType_F8E5M2 = 19;
    XLA_FFI_DataType_F8E4M3FN = 20;

    XLA_FFI_ArgType_BUFFER = 1;
    XLA_FFI_RetType_BUFFER = 1;

    XLA_FFI_ExecutionStage_INSTANTIATE = 0;
    XLA_FFI_ExecutionStage_PREPARE = 1;
    XLA_FFI_ExecutionStage_INITIALIZE = 2;
    XLA_FFI_ExecutionStage_EXECUTE = 3;
}

c_mirrors! {
    #[whole]
    pub struct PJRT_FFI_Register_Handler_Args {
        pub struct_size: usize,
        pub target_name: *const c_char,
        pub target_name_size: usize,
        pub handler: *mut c_void,
        pub platform_name: *const c_char,
        pub platform_name_size: usize,
        pub traits: c_int,
    }

    #[whole]
    pub struct PJRT_FFI_Extension {
        pub base: PJRT_Extension_Base,
        pub type_id_register: Unused,
        pub user_data_add: Unused,
        pub register_handler: Option<PJRT_FFI_Register_Handler>,
    }

    #[whole]
    pub struct XLA_FFI_Extension_Base {
        pub struct_size: usize,
        #[c_name = "type"]
        pub type_: c_int,
        pub next: *mut XLA_FFI_Extension_Base,
    }

    #[whole]
    pub struct XLA_FFI_Api_Version {
        pub struct_size: usize,
        pub extension_start: *mut XLA_FFI_Extension_Base,
        pub major_version: c_int,
        pub minor_version: c_int,
    }

    #[whole]
    pub struct XLA_FFI_Error_Create_Args {
        pub struct_size: usize,
        pub extension_start: *mut XLA_FFI_Extension_Base,
        pub message: *const c_char,
        pub errc: c_int,
    }

    #[whole]
    pub struct XLA_FFI_Buffer {
        pub struct_size: usize,
        pub extension_start: *mut XLA_FFI_Extension_Base,
        pub dtype: c_int,
        pub data: *mut c_void,
        pub rank: i64,
        pub dims: *mut i64,
    }

    #[whole]
    pub struct XLA_FFI_Args {
        pub struct_size: usize,
        pub extension_start: *mut XLA_FFI_Extension_Base,
        pub size: i64,
        pub types: *mut c_int,
        pub args: *mut *mut c_void,
    }

    #[whole]
    pub struct XLA_FFI_Rets {
        pub struct_size: usize,
        pub extension_start: *mut XLA_FFI_Extension_Base,
        pub size: i64,
        pub types: *mut c_int,
        pub rets: *mut *mut c_void,
    }

    #[prefix]
    pub struct XLA_FFI_CallFrame {
        pub struct_size: usize,
        pub extension_start: *mut XLA_FFI_Extension_Base,
        pub api: *const XLA_FFI_Api,
        pub ctx: *mut XLA_FFI_ExecutionContext,
        pub stage: c_int,
        pub args: XLA_FFI_Args,
        pub rets: XLA_FFI_Rets,
    }

    #[prefix]
    pub struct XLA_FFI_Metadata {
        pub struct_size: usize,
        pub api_version: XLA_FFI_Api_Version,
        pub traits: u32,
    }

    #[whole]
    pub struct XLA_FFI_Metadata_Extension {
        pub extension_base: XLA_FFI_Extension_Base,
        pub metadata: *mut XLA_FFI_Metadata,
    }

    #[prefix]
    pub struct XLA_FFI_Api {
        pub struct_size: usize,
        pub extension_start: *mut XLA_FFI_Extension_Base,
        pub api_version: XLA_FFI_Api_Version,
        pub internal_api: *mut c_void,
        pub XLA_FFI_Error_Create: Option<XLA_FFI_Error_Create>,
    }
}

/// `<name>_STRUCT_SIZE` of the structs this crate fills in and hands to C.
pub const PJRT_FFI_Register_Handler_Args_STRUCT_SIZE: usize =
    offset_of!(PJRT_FFI_Register_Handler_Args, traits) + size_of::<c_int>();
pub const XLA_FFI_Error_Create_Args_STRUCT_SIZE: usize =
    offset_of!(XLA_FFI_Error_Create_Args, errc) + size_of::<c_int>();
pub const XLA_FFI_Api_Version_STRUCT_SIZE: usize =
    offset_of!(XLA_FFI_Api_Version, minor_version) + size_of::<c_int>();

/// The `_STRUCT_SIZE` constants above, for the layout test.
pub const STRUCT_SIZES: &[(&str, usize)] = &[
    (
        "PJRT_FFI_Register_Handler_Args",
        PJRT_FFI_Register_Handler_Args_STRUCT_SIZE,
    ),
    (
        "XLA_FFI_Error_Create_Args",
        XLA_FFI_Error_Create_Args_STRUCT_SIZE,
    ),
    ("XLA_FFI_Api_Version", XLA_FFI_Api_Version_STRUCT_SIZE),
];

/// The XLA FFI API version the trampolines are written against, reported in the metadata query.
/// XLA accepts a handler whose version lies between 0.1 (its minimum) and its own version; every
/// struct and field mirrored here already exists in 0.1.
pub const HANDLER_API_VERSION: (c_int, c_int) = (0, 1);

/// The plugin's FFI extension carries `register_handler` only from this `struct_size` on.
const FFI_EXTENSION_MIN_SIZE: usize = size_of::<PJRT_FFI_Extension>();

/// Walks the plugin's extension chain for the FFI extension and returns its `register_handler`;
/// the error names what is missing.
pub(crate) fn register_handler_entry(
    api: &Api,
) -> std::result::Result<PJRT_FFI_Register_Handler, String> {
    let mut node = api.extension_start();
    let mut seen = 0usize;
    while !node.is_null() {
        // A chain longer than this is corrupt (or circular); every real plugin has a handful.
        if seen == 64 {
            return Err("its extension chain does not end after 64 entries".to_string());
        }
        seen += 1;
        // SAFETY: `node` is a non-null link of the chain the plugin publishes in its static
        // `PJRT_Api`; every extension begins with a `PJRT_Extension_Base` (struct_size, type,
        // next), and its `struct_size` says how much of it exists.
        let (size, kind, next) = unsafe {
            let size = (&raw const (*node).struct_size).read();
            if size < size_of::<PJRT_Extension_Base>() {
                return Err(format!(
                    "an extension in its chain is only {size} bytes long"
                ));
            }
            (
                size,
                (&raw const (*node).type_).read(),
                (&raw const (*node).next).read(),
            )
        };
        if kind == PJRT_Extension_Type_FFI {
            if size < FFI_EXTENSION_MIN_SIZE {
                return Err(format!(
                    "its FFI extension is {size} bytes long, without `register_handler` (needs \
                     {FFI_EXTENSION_MIN_SIZE} bytes; the plugin predates handler registration)"
                ));
            }
            let extension = node.cast::<PJRT_FFI_Extension>();
            // SAFETY: the extension is `PJRT_FFI_Extension` (its type says so) and at least
            // `size_of::<PJRT_FFI_Extension>()` bytes long, checked just above.
            let entry = unsafe { (&raw const (*extension).register_handler).read() };
            return entry
                .ok_or_else(|| "its FFI extension has a null `register_handler`".to_string());
        }
        node = next;
    }
    Err("it has no FFI extension (PJRT_Extension_Type_FFI)".to_string())
}

/// Registers trampoline `slot` as the typed FFI handler of `target` on `platform`. XLA calls the
/// trampoline once, inside this call, for its metadata.
pub(crate) fn register_trampoline(
    api: &Api,
    register: PJRT_FFI_Register_Handler,
    target: &str,
    platform: &str,
    slot: usize,
) -> Result<()> {
    let handler = TRAMPOLINES
        .get(slot)
        .ok_or_else(|| Error::InvalidArgument(format!("host kernel slot {slot} does not exist")))?;
    let mut args = PJRT_FFI_Register_Handler_Args {
        struct_size: PJRT_FFI_Register_Handler_Args_STRUCT_SIZE,
        target_name: target.as_ptr().cast(),
        target_name_size: target.len(),
        handler: *handler as *mut c_void,
        platform_name: platform.as_ptr().cast(),
        platform_name_size: platform.len(),
        traits: 0,
    };
    // SAFETY: `register` is the plugin's `register_handler` entry; `args` and the two strings it
    // points to (passed with their lengths, copied by the plugin) live across the call; the
    // handler is a trampoline of this crate, a `'static` function.
    let error = unsafe { register(&mut args) };
    api.take_error(error, "PJRT_FFI_Register_Handler")
}

/// How many host kernels one process can register (trampolines are fixed at compile time).
pub const SLOT_COUNT: usize = 32;

struct InstalledKernel {
    target: String,
    kernel: Arc<dyn HostKernel>,
}

static KERNELS: [OnceLock<InstalledKernel>; SLOT_COUNT] = [const { OnceLock::new() }; SLOT_COUNT];

/// Puts `kernel` in `slot`; false when the slot is already taken.
pub(crate) fn install(slot: usize, target: &str, kernel: Arc<dyn HostKernel>) -> bool {
    KERNELS.get(slot).is_some_and(|cell| {
        cell.set(InstalledKernel {
            target: target.to_string(),
            kernel,
        })
        .is_ok()
    })
}

macro_rules! trampolines {
    ($($slot:literal)*) => {
        static TRAMPOLINES: [XLA_FFI_Handler; SLOT_COUNT] = [$(trampoline::<$slot>),*];
    };
}

trampolines!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31);

unsafe extern "C" fn trampoline<const SLOT: usize>(
    frame: *mut XLA_FFI_CallFrame,
) -> *mut XLA_FFI_Error {
    match catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: XLA calls a registered handler with a valid call frame that lives for the call.
        unsafe { handle(SLOT, frame) }
    })) {
        Ok(error) => error,
        Err(_) => fatal("a host kernel trampoline panicked outside the kernel"),
    }
}

/// Ends the process: used only where no `XLA_FFI_Error` can be made (no usable FFI API in the
/// frame), since returning success would hand back unwritten results.
fn fatal(message: &str) -> ! {
    eprintln!("tlaloc-pjrt: {message}; aborting");
    std::process::abort()
}

/// # Safety
/// `frame` must be null or a call frame XLA passes to a handler, valid for the call.
unsafe fn handle(slot: usize, frame: *mut XLA_FFI_CallFrame) -> *mut XLA_FFI_Error {
    if frame.is_null() {
        fatal("XLA called a host kernel with a null call frame");
    }
    // SAFETY: every call frame begins with `struct_size` and `extension_start`.
    let (frame_size, extension) = unsafe {
        (
            (&raw const (*frame).struct_size).read(),
            (&raw const (*frame).extension_start).read(),
        )
    };
    // SAFETY: the extension chain comes from XLA with this frame.
    if unsafe { answer_metadata(extension) } {
        return std::ptr::null_mut();
    }
    if frame_size < size_of::<XLA_FFI_CallFrame>() {
        fatal(&format!(
            "the call frame is {frame_size} bytes long, shorter than the {} bytes this crate reads",
            size_of::<XLA_FFI_CallFrame>()
        ));
    }
    // SAFETY: the frame is at least as long as the mirror, checked just above.
    let frame = unsafe { &*frame };
    // SAFETY: `api` is the frame's FFI API table, static data of the plugin.
    let create = unsafe { error_create(frame.api) };
    if frame.stage != XLA_FFI_ExecutionStage_EXECUTE {
        return std::ptr::null_mut();
    }
    let Some(installed) = KERNELS.get(slot).and_then(OnceLock::get) else {
        return new_error(
            create,
            XLA_FFI_Error_Code_INTERNAL,
            &format!("no host kernel is installed in slot {slot}"),
        );
    };
    let target = &installed.target;
    // SAFETY: the frame's args and rets describe buffers XLA keeps alive and does not touch for
    // the duration of the call.
    let buffers = unsafe { decode(frame) };
    let (args, mut results) = match buffers {
        Ok(buffers) => buffers,
        Err(message) => {
            return new_error(
                create,
                XLA_FFI_Error_Code_INVALID_ARGUMENT,
                &format!("host kernel `{target}`: {message}"),
            );
        }
    };
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        installed.kernel.execute(&args, &mut results)
    }));
    match outcome {
        Ok(Ok(())) => std::ptr::null_mut(),
        Ok(Err(message)) => new_error(
            create,
            XLA_FFI_Error_Code_INTERNAL,
            &format!("host kernel `{target}` failed: {message}"),
        ),
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a non-string payload".to_string());
            new_error(
                create,
                XLA_FFI_Error_Code_INTERNAL,
                &format!("host kernel `{target}` panicked: {what}"),
            )
        }
    }
}

/// Fills in the metadata when `extension` is XLA's metadata query; true when it was.
///
/// # Safety
/// `extension` must be null or the head of the extension chain of a live call frame.
unsafe fn answer_metadata(mut extension: *mut XLA_FFI_Extension_Base) -> bool {
    let mut seen = 0usize;
    while !extension.is_null() && seen < 64 {
        seen += 1;
        // SAFETY: every extension begins with `XLA_FFI_Extension_Base`; its `struct_size` says
        // how much of it exists.
        let (size, kind, next) = unsafe {
            let size = (&raw const (*extension).struct_size).read();
            if size < size_of::<XLA_FFI_Extension_Base>() {
                return false;
            }
            (
                size,
                (&raw const (*extension).type_).read(),
                (&raw const (*extension).next).read(),
            )
        };
        if kind == XLA_FFI_Extension_Metadata {
            if size < size_of::<XLA_FFI_Metadata_Extension>() {
                // Left unanswered, the metadata keeps API version 0.0, which XLA refuses by name.
                return true;
            }
            let metadata_extension = extension.cast::<XLA_FFI_Metadata_Extension>();
            // SAFETY: the extension is a metadata extension at least as long as the mirror.
            let metadata = unsafe { (&raw const (*metadata_extension).metadata).read() };
            if metadata.is_null() {
                return true;
            }
            // SAFETY: `metadata` points to the `XLA_FFI_Metadata` XLA owns for this query; it
            // begins with `struct_size`.
            let metadata_size = unsafe { (&raw const (*metadata).struct_size).read() };
            if metadata_size < offset_of!(XLA_FFI_Metadata, traits) + size_of::<u32>() {
                return true;
            }
            // SAFETY: the metadata is writable by the handler (that is the query) and reaches
            // past `traits`, checked just above; fields after `traits` are left as XLA set them.
            unsafe {
                (&raw mut (*metadata).api_version).write(XLA_FFI_Api_Version {
                    struct_size: XLA_FFI_Api_Version_STRUCT_SIZE,
                    extension_start: std::ptr::null_mut(),
                    major_version: HANDLER_API_VERSION.0,
                    minor_version: HANDLER_API_VERSION.1,
                });
                (&raw mut (*metadata).traits).write(0);
            }
            return true;
        }
        extension = next;
    }
    false
}

/// The frame's `XLA_FFI_Error_Create`, after checking the API table is one this crate can read.
///
/// # Safety
/// `api` must be null or the `XLA_FFI_Api` table of a call frame.
unsafe fn error_create(api: *const XLA_FFI_Api) -> XLA_FFI_Error_Create {
    if api.is_null() {
        fatal("the call frame carries no XLA FFI API");
    }
    // SAFETY: every `XLA_FFI_Api` begins with `struct_size`.
    let size = unsafe { (&raw const (*api).struct_size).read() };
    if size < size_of::<XLA_FFI_Api>() {
        fatal(&format!(
            "the XLA FFI API table is {size} bytes long, shorter than the {} bytes this crate \
             reads (an XLA FFI API older than 0.1)",
            size_of::<XLA_FFI_Api>()
        ));
    }
    // SAFETY: the table is at least as long as the mirror, checked just above.
    let api = unsafe { &*api };
    let version = (api.api_version.major_version, api.api_version.minor_version);
    if version.0 != HANDLER_API_VERSION.0 || version < HANDLER_API_VERSION {
        fatal(&format!(
            "the XLA FFI API in the call frame is version {}.{}; host kernels need {}.{} or a \
             newer 0.x",
            version.0, version.1, HANDLER_API_VERSION.0, HANDLER_API_VERSION.1
        ));
    }
    match api.XLA_FFI_Error_Create {
        Some(create) => create,
        None => fatal("the XLA FFI API has no XLA_FFI_Error_Create"),
    }
}

fn new_error(create: XLA_FFI_Error_Create, code: c_int, message: &str) -> *mut XLA_FFI_Error {
    let message = CString::new(message.replace('\0', " ")).unwrap_or_default();
    let mut args = XLA_FFI_Error_Create_Args {
        struct_size: XLA_FFI_Error_Create_Args_STRUCT_SIZE,
        extension_start: std::ptr::null_mut(),
        message: message.as_ptr(),
        errc: code,
    };
    // SAFETY: `create` is the frame's `XLA_FFI_Error_Create`; the message is a NUL-terminated
    // string XLA copies during the call.
    let error = unsafe { create(&mut args) };
    if error.is_null() {
        fatal(&format!(
            "XLA_FFI_Error_Create returned null for: {}",
            message.to_string_lossy()
        ));
    }
    error
}

/// One buffer of a call frame, checked: element type, dims and its bytes.
struct RawBuffer<'a> {
    dtype: c_int,
    dims: &'a [i64],
    data: *mut u8,
    len: usize,
}

type Decoded<'a> = (Vec<HostBuffer<'a>>, Vec<HostBufferMut<'a>>);

/// Turns the frame's operands and results into host buffers, refusing anything but dense
/// buffers of a known element type and results that overlap another buffer.
///
/// # Safety
/// `frame` must be an execute-stage call frame whose buffers are valid, and not accessed by
/// anyone else, for `'a`.
unsafe fn decode<'a>(frame: &'a XLA_FFI_CallFrame) -> std::result::Result<Decoded<'a>, String> {
    // SAFETY: forwarded from this function's contract.
    let args = unsafe {
        raw_buffers(
            frame.args.size,
            frame.args.types,
            frame.args.args,
            XLA_FFI_ArgType_BUFFER,
            "operand",
        )?
    };
    // SAFETY: as above.
    let rets = unsafe {
        raw_buffers(
            frame.rets.size,
            frame.rets.types,
            frame.rets.rets,
            XLA_FFI_RetType_BUFFER,
            "result",
        )?
    };
    for (i, ret) in rets.iter().enumerate() {
        let overlaps = |other: &RawBuffer<'_>| {
            let (a, b) = (ret.data as usize, other.data as usize);
            ret.len > 0 && other.len > 0 && a < b + other.len && b < a + ret.len
        };
        if let Some(j) = args.iter().position(overlaps) {
            return Err(format!(
                "result {i} shares memory with operand {j}; aliased results are not supported"
            ));
        }
        if let Some(j) = rets[..i].iter().position(overlaps) {
            return Err(format!("result {i} shares memory with result {j}"));
        }
    }
    let args = args
        .into_iter()
        .map(|raw| {
            let bytes: &'a [u8] = if raw.len == 0 {
                &[]
            } else {
                // SAFETY: `data` points to `len` bytes XLA keeps alive for `'a`; operands are
                // only read, and no result overlaps them (checked above).
                unsafe { std::slice::from_raw_parts(raw.data, raw.len) }
            };
            HostBuffer::new(ElementType::from_raw(raw.dtype), raw.dims, bytes)
        })
        .collect();
    let rets = rets
        .into_iter()
        .map(|raw| {
            let bytes: &'a mut [u8] = if raw.len == 0 {
                &mut []
            } else {
                // SAFETY: `data` points to `len` writable bytes XLA keeps alive for `'a` and
                // overlapping no other buffer of the call (checked above), so this is the only
                // reference to them.
                unsafe { std::slice::from_raw_parts_mut(raw.data, raw.len) }
            };
            HostBufferMut::new(ElementType::from_raw(raw.dtype), raw.dims, bytes)
        })
        .collect();
    Ok((args, rets))
}

/// # Safety
/// `types` and `buffers` must point to `size` entries (or be anything when `size` is 0), each
/// buffer entry to an `XLA_FFI_Buffer` valid for `'a`.
unsafe fn raw_buffers<'a>(
    size: i64,
    types: *const c_int,
    buffers: *const *mut c_void,
    buffer_type: c_int,
    what: &str,
) -> std::result::Result<Vec<RawBuffer<'a>>, String> {
    let count = usize::try_from(size).map_err(|_| format!("{size} {what}s"))?;
    if count == 0 {
        return Ok(Vec::new());
    }
    if types.is_null() || buffers.is_null() {
        return Err(format!("the {what} list is null"));
    }
    let mut out = Vec::with_capacity(count);
    for i in 0..count {
        // SAFETY: both arrays have `count` entries (this function's contract).
        let (kind, buffer) = unsafe { (types.add(i).read(), buffers.add(i).read()) };
        if kind != buffer_type {
            return Err(format!(
                "{what} {i} is not a buffer (XLA FFI type {kind}); only dense buffers are \
                 supported"
            ));
        }
        let buffer = buffer.cast::<XLA_FFI_Buffer>();
        if buffer.is_null() {
            return Err(format!("{what} {i} is a null buffer"));
        }
        // SAFETY: a buffer entry points to an `XLA_FFI_Buffer` (contract); its `struct_size`
        // says how much of it exists.
        let buffer = unsafe {
            let size = (&raw const (*buffer).struct_size).read();
            if size < size_of::<XLA_FFI_Buffer>() {
                return Err(format!("{what} {i} is a {size}-byte XLA_FFI_Buffer"));
            }
            &*buffer
        };
        let rank = usize::try_from(buffer.rank)
            .map_err(|_| format!("{what} {i} has rank {}", buffer.rank))?;
        let dims: &'a [i64] = if rank == 0 {
            &[]
        } else if buffer.dims.is_null() {
            return Err(format!("{what} {i} has rank {rank} and no dims"));
        } else {
            // SAFETY: `dims` has `rank` entries, valid for `'a` like the buffer.
            unsafe { std::slice::from_raw_parts(buffer.dims, rank) }
        };
        let element_size = ElementType::byte_size_of_raw(buffer.dtype).ok_or_else(|| {
            format!(
                "{what} {i} has XLA FFI element type {}, which host kernels do not support",
                buffer.dtype
            )
        })?;
        let mut len = element_size;
        for &dim in dims {
            let dim = usize::try_from(dim).map_err(|_| format!("{what} {i} has dims {dims:?}"))?;
            len = len
                .checked_mul(dim)
                .ok_or_else(|| format!("{what} {i} with dims {dims:?} overflows"))?;
        }
        if len > isize::MAX as usize {
            return Err(format!("{what} {i} with dims {dims:?} is too large"));
        }
        if len > 0 && buffer.data.is_null() {
            return Err(format!("{what} {i} has dims {dims:?} and no data"));
        }
        out.push(RawBuffer {
            dtype: buffer.dtype,
            dims,
            data: buffer.data.cast(),
            len,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    //! The trampoline against hand-built call frames: the refusals and the stage handling (the
    //! field layout is pinned by the header test, the happy path by the plugin tests).

    use super::*;
    use crate::host_kernel::{HostBuffer, HostBufferMut};
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct FakeError {
        code: c_int,
        message: String,
    }

    unsafe extern "C" fn fake_error_create(
        args: *mut XLA_FFI_Error_Create_Args,
    ) -> *mut XLA_FFI_Error {
        // SAFETY: the trampoline passes valid args with a NUL-terminated message.
        let (code, message) = unsafe {
            let args = &*args;
            (
                args.errc,
                std::ffi::CStr::from_ptr(args.message)
                    .to_string_lossy()
                    .into_owned(),
            )
        };
        Box::into_raw(Box::new(FakeError { code, message })).cast()
    }

    fn fake_api() -> XLA_FFI_Api {
        XLA_FFI_Api {
            struct_size: size_of::<XLA_FFI_Api>(),
            extension_start: std::ptr::null_mut(),
            api_version: XLA_FFI_Api_Version {
                struct_size: XLA_FFI_Api_Version_STRUCT_SIZE,
                extension_start: std::ptr::null_mut(),
                major_version: 0,
                minor_version: 4,
            },
            internal_api: std::ptr::null_mut(),
            XLA_FFI_Error_Create: Some(fake_error_create),
        }
    }

    /// An f32 buffer description over `data` with `dims` (both outlive every call using it).
    fn buffer(dtype: c_int, data: &mut [f32], dims: &mut [i64]) -> XLA_FFI_Buffer {
        XLA_FFI_Buffer {
            struct_size: size_of::<XLA_FFI_Buffer>(),
            extension_start: std::ptr::null_mut(),
            dtype,
            data: data.as_mut_ptr().cast(),
            rank: dims.len() as i64,
            dims: dims.as_mut_ptr(),
        }
    }

    /// Runs trampoline `slot` on a frame of `stage` with `args` and `rets` (`(type, buffer)`);
    /// `Some((code, message))` when it returned an error.
    fn call(
        slot: usize,
        stage: c_int,
        extension: *mut XLA_FFI_Extension_Base,
        args: &mut [(c_int, &mut XLA_FFI_Buffer)],
        rets: &mut [(c_int, &mut XLA_FFI_Buffer)],
    ) -> Option<(c_int, String)> {
        let api = fake_api();
        let mut arg_types: Vec<c_int> = args.iter().map(|(t, _)| *t).collect();
        let mut arg_ptrs: Vec<*mut c_void> = args
            .iter_mut()
            .map(|(_, b)| (&raw mut **b).cast())
            .collect();
        let mut ret_types: Vec<c_int> = rets.iter().map(|(t, _)| *t).collect();
        let mut ret_ptrs: Vec<*mut c_void> = rets
            .iter_mut()
            .map(|(_, b)| (&raw mut **b).cast())
            .collect();
        let mut frame = XLA_FFI_CallFrame {
            struct_size: size_of::<XLA_FFI_CallFrame>(),
            extension_start: extension,
            // Older XLA sends the metadata query without an API table.
            api: if extension.is_null() {
                &api
            } else {
                std::ptr::null()
            },
            ctx: std::ptr::null_mut(),
            stage,
            args: XLA_FFI_Args {
                struct_size: size_of::<XLA_FFI_Args>(),
                extension_start: std::ptr::null_mut(),
                size: arg_ptrs.len() as i64,
                types: arg_types.as_mut_ptr(),
                args: arg_ptrs.as_mut_ptr(),
            },
            rets: XLA_FFI_Rets {
                struct_size: size_of::<XLA_FFI_Rets>(),
                extension_start: std::ptr::null_mut(),
                size: ret_ptrs.len() as i64,
                types: ret_types.as_mut_ptr(),
                rets: ret_ptrs.as_mut_ptr(),
            },
        };
        // SAFETY: the frame and everything it points to (locals and the caller's buffers) live
        // across the call.
        let error = unsafe { TRAMPOLINES[slot](&mut frame) };
        if error.is_null() {
            return None;
        }
        // SAFETY: non-null errors come from `fake_error_create`: boxed `FakeError`s.
        let error = unsafe { Box::from_raw(error.cast::<FakeError>()) };
        Some((error.code, error.message))
    }

    /// Counts its calls and doubles f32 operand 0 into result 0.
    struct Doubler(AtomicUsize);

    impl HostKernel for Doubler {
        fn execute(
            &self,
            args: &[HostBuffer<'_>],
            results: &mut [HostBufferMut<'_>],
        ) -> std::result::Result<(), String> {
            self.0.fetch_add(1, Ordering::SeqCst);
            let x = args[0].as_f32().ok_or("not f32")?;
            for (o, v) in results[0].as_f32_mut().ok_or("not f32")?.iter_mut().zip(x) {
                *o = v * 2.0;
            }
            Ok(())
        }
    }

    #[test]
    fn the_metadata_query_gets_version_0_1_and_no_traits() {
        #[repr(C)]
        struct LongerMetadata {
            metadata: XLA_FFI_Metadata,
            state_type_id: i64,
        }
        let mut metadata = LongerMetadata {
            metadata: XLA_FFI_Metadata {
                struct_size: size_of::<LongerMetadata>(),
                api_version: XLA_FFI_Api_Version {
                    struct_size: XLA_FFI_Api_Version_STRUCT_SIZE,
                    extension_start: std::ptr::null_mut(),
                    major_version: 0,
                    minor_version: 0,
                },
                traits: 7,
            },
            state_type_id: 99,
        };
        let mut extension = XLA_FFI_Metadata_Extension {
            extension_base: XLA_FFI_Extension_Base {
                struct_size: size_of::<XLA_FFI_Metadata_Extension>(),
                type_: XLA_FFI_Extension_Metadata,
                next: std::ptr::null_mut(),
            },
            metadata: &raw mut metadata.metadata,
        };
        let answer = call(
            31,
            XLA_FFI_ExecutionStage_EXECUTE,
            &raw mut extension.extension_base,
            &mut [],
            &mut [],
        );
        assert_eq!(answer.map(|(_, m)| m), None);
        assert_eq!(metadata.metadata.api_version.major_version, 0);
        assert_eq!(metadata.metadata.api_version.minor_version, 1);
        assert_eq!(
            metadata.metadata.api_version.struct_size,
            XLA_FFI_Api_Version_STRUCT_SIZE
        );
        assert_eq!(metadata.metadata.traits, 0);
        assert_eq!(metadata.state_type_id, 99);
    }

    #[test]
    fn stages_before_execute_do_not_run_the_kernel() {
        let kernel = Arc::new(Doubler(AtomicUsize::new(0)));
        assert!(install(30, "test.stages", kernel.clone()));
        let (mut x, mut y) = ([1.0f32, 2.0], [0.0f32; 2]);
        let (mut x_dims, mut y_dims) = ([2i64], [2i64]);
        let mut xb = buffer(XLA_FFI_DataType_F32, &mut x, &mut x_dims);
        let mut yb = buffer(XLA_FFI_DataType_F32, &mut y, &mut y_dims);
        for stage in [
            XLA_FFI_ExecutionStage_INSTANTIATE,
            XLA_FFI_ExecutionStage_PREPARE,
            XLA_FFI_ExecutionStage_INITIALIZE,
            XLA_FFI_ExecutionStage_EXECUTE,
        ] {
            let answer = call(
                30,
                stage,
                std::ptr::null_mut(),
                &mut [(XLA_FFI_ArgType_BUFFER, &mut xb)],
                &mut [(XLA_FFI_RetType_BUFFER, &mut yb)],
            );
            assert_eq!(answer.map(|(_, m)| m), None);
        }
        assert_eq!(kernel.0.load(Ordering::SeqCst), 1);
        assert_eq!(y, [2.0, 4.0]);
    }

    #[test]
    fn operands_the_kernel_cannot_read_are_refused_by_name() {
        let kernel = Arc::new(Doubler(AtomicUsize::new(0)));
        assert!(install(29, "test.refusals", kernel.clone()));
        let (mut x, mut y) = ([1.0f32, 2.0], [0.0f32; 2]);
        let (mut x_dims, mut y_dims, mut negative_dims) = ([2i64], [2i64], [-2i64]);
        let mut yb = buffer(XLA_FFI_DataType_F32, &mut y, &mut y_dims);
        let execute = XLA_FFI_ExecutionStage_EXECUTE;
        let none = std::ptr::null_mut();

        let mut token = buffer(XLA_FFI_DataType_TOKEN, &mut x, &mut x_dims);
        let (code, message) = call(
            29,
            execute,
            none,
            &mut [(XLA_FFI_ArgType_BUFFER, &mut token)],
            &mut [(XLA_FFI_RetType_BUFFER, &mut yb)],
        )
        .expect("a token operand must be refused");
        assert_eq!(code, XLA_FFI_Error_Code_INVALID_ARGUMENT);
        assert!(
            message.contains("`test.refusals`") && message.contains("element type 17"),
            "{message}"
        );

        let mut xb = buffer(XLA_FFI_DataType_F32, &mut x, &mut x_dims);
        let (_, message) = call(
            29,
            execute,
            none,
            &mut [(7, &mut xb)],
            &mut [(XLA_FFI_RetType_BUFFER, &mut yb)],
        )
        .expect("a non-buffer operand must be refused");
        assert!(message.contains("operand 0 is not a buffer"), "{message}");

        let mut negative = buffer(XLA_FFI_DataType_F32, &mut x, &mut negative_dims);
        let (_, message) = call(
            29,
            execute,
            none,
            &mut [(XLA_FFI_ArgType_BUFFER, &mut negative)],
            &mut [(XLA_FFI_RetType_BUFFER, &mut yb)],
        )
        .expect("a negative dim must be refused");
        assert!(message.contains("dims [-2]"), "{message}");

        let mut overlapping = buffer(XLA_FFI_DataType_F32, &mut y, &mut x_dims);
        let (_, message) = call(
            29,
            execute,
            none,
            &mut [],
            &mut [
                (XLA_FFI_RetType_BUFFER, &mut overlapping),
                (XLA_FFI_RetType_BUFFER, &mut yb),
            ],
        )
        .expect("overlapping results must be refused");
        assert!(
            message.contains("result 1 shares memory with result 0"),
            "{message}"
        );
        assert_eq!(kernel.0.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn an_empty_slot_answers_with_an_error() {
        let (code, message) = call(
            28,
            XLA_FFI_ExecutionStage_EXECUTE,
            std::ptr::null_mut(),
            &mut [],
            &mut [],
        )
        .expect("an empty slot must fail");
        assert_eq!(code, XLA_FFI_Error_Code_INTERNAL);
        assert!(message.contains("slot 28"), "{message}");
    }
}
