//! The C side of the backend: the declarations of `tritonbackend.h` / `tritonserver.h` (core
//! branch r24.10, TRITONBACKEND API 1.19) that the backend uses, written by hand, the function
//! table resolved from the running server, safe owning wrappers of the objects the server lends
//! (requests, inputs, response factories, metrics), and the exported entry points.
//!
//! This is the only module of the crate with `unsafe`. The library does not link
//! `libtritonserver.so` (server builds rename it); every `TRITONSERVER_*` / `TRITONBACKEND_*`
//! function is looked up in the process at `TRITONBACKEND_Initialize`, and a missing one is
//! refused by name. Every entry point runs its body under `catch_unwind`, so a panic becomes a
//! Triton error instead of unwinding into C++.

use std::ffi::{CStr, CString, c_char, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::ptr;
use std::sync::OnceLock;

use crate::error::{BackendError, Code};

/// The API version the declarations below were written against.
pub const API_VERSION_MAJOR: u32 = 1;
/// See [`API_VERSION_MAJOR`].
pub const API_VERSION_MINOR: u32 = 19;

macro_rules! opaque {
    ($($name:ident),* $(,)?) => {
        $(
            #[repr(C)]
            #[derive(Debug)]
            #[allow(non_camel_case_types)]
            #[doc = concat!("`", stringify!($name), "` (opaque).")]
            pub struct $name {
                _private: [u8; 0],
            }
        )*
    };
}

opaque!(
    TRITONSERVER_Error,
    TRITONSERVER_Message,
    TRITONSERVER_Parameter,
    TRITONSERVER_MetricFamily,
    TRITONSERVER_Metric,
    TRITONBACKEND_Backend,
    TRITONBACKEND_Model,
    TRITONBACKEND_ModelInstance,
    TRITONBACKEND_Request,
    TRITONBACKEND_Input,
    TRITONBACKEND_Output,
    TRITONBACKEND_Response,
    TRITONBACKEND_ResponseFactory,
);

/// C enums are `int`-sized; these mirror their values.
pub type CEnum = u32;

/// `TRITONSERVER_DataType`.
pub mod data_type {
    use super::CEnum;
    pub const BOOL: CEnum = 1;
    pub const UINT8: CEnum = 2;
    pub const UINT64: CEnum = 5;
    pub const INT32: CEnum = 8;
    pub const INT64: CEnum = 9;
    pub const FP32: CEnum = 11;
    pub const BYTES: CEnum = 13;
}

/// `TRITONSERVER_MemoryType`: CPU.
pub const MEMORY_CPU: CEnum = 0;
/// `TRITONSERVER_MemoryType`: pinned CPU.
pub const MEMORY_CPU_PINNED: CEnum = 1;
/// `TRITONSERVER_ParameterType`: string.
pub const PARAMETER_STRING: CEnum = 0;
/// `TRITONSERVER_LogLevel`.
pub const LOG_INFO: CEnum = 0;
/// See [`LOG_INFO`].
pub const LOG_WARN: CEnum = 1;
/// See [`LOG_INFO`].
pub const LOG_ERROR: CEnum = 2;
/// `TRITONSERVER_RequestReleaseFlag`: release all.
pub const REQUEST_RELEASE_ALL: u32 = 1;
/// `TRITONSERVER_ResponseCompleteFlag`: final.
pub const RESPONSE_COMPLETE_FINAL: u32 = 1;
/// `TRITONSERVER_MetricKind`: gauge.
pub const METRIC_KIND_GAUGE: CEnum = 1;

/// `TRITONSERVER_Error_Code`.
pub fn error_code(code: Code) -> CEnum {
    match code {
        Code::Unknown => 0,
        Code::Internal => 1,
        Code::NotFound => 2,
        Code::InvalidArg => 3,
        Code::Unavailable => 4,
        Code::Unsupported => 5,
        Code::AlreadyExists => 6,
        Code::Cancelled => 7,
    }
}

fn code_of(value: CEnum) -> Code {
    match value {
        1 => Code::Internal,
        2 => Code::NotFound,
        3 => Code::InvalidArg,
        4 => Code::Unavailable,
        5 => Code::Unsupported,
        6 => Code::AlreadyExists,
        7 => Code::Cancelled,
        _ => Code::Unknown,
    }
}

type Err = *mut TRITONSERVER_Error;

macro_rules! api {
    ($( $name:ident : fn($($arg:ty),* $(,)?) $(-> $ret:ty)?; )*) => {
        /// The server's functions, resolved once at `TRITONBACKEND_Initialize`.
        #[allow(non_snake_case)]
        pub struct Api {
            $( $name: unsafe extern "C" fn($($arg),*) $(-> $ret)?, )*
        }

        impl std::fmt::Debug for Api {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct("Api").field("functions", &Self::NAMES.len()).finish()
            }
        }

        impl Api {
            /// The names of every function the backend resolves.
            pub const NAMES: &'static [&'static str] = &[$(stringify!($name)),*];

            fn resolve(process: &libloading::os::unix::Library) -> Result<Api, BackendError> {
                Ok(Api {
                    $( $name: {
                        let name = concat!(stringify!($name), "\0");
                        // SAFETY: the symbol's type is its declaration in tritonbackend.h /
                        // tritonserver.h of core r24.10 (written out above, argument by
                        // argument); the pointer stays valid while the server runs.
                        let symbol = unsafe {
                            process.get::<unsafe extern "C" fn($($arg),*) $(-> $ret)?>(name.as_bytes())
                        };
                        match symbol {
                            Ok(symbol) => *symbol,
                            Err(_) => return Err(BackendError::new(
                                Code::Unsupported,
                                format!(
                                    "the server does not export {}; this backend needs a Triton with TRITONBACKEND API {}.{} or later",
                                    stringify!($name), API_VERSION_MAJOR, API_VERSION_MINOR
                                ),
                            )),
                        }
                    }, )*
                })
            }
        }
    };
}

api! {
    TRITONSERVER_ErrorNew: fn(CEnum, *const c_char) -> Err;
    TRITONSERVER_ErrorDelete: fn(Err);
    TRITONSERVER_ErrorCode: fn(Err) -> CEnum;
    TRITONSERVER_ErrorMessage: fn(Err) -> *const c_char;
    TRITONSERVER_LogMessage: fn(CEnum, *const c_char, i32, *const c_char) -> Err;
    TRITONSERVER_MessageSerializeToJson: fn(*mut TRITONSERVER_Message, *mut *const c_char, *mut usize) -> Err;
    TRITONSERVER_MessageDelete: fn(*mut TRITONSERVER_Message) -> Err;
    TRITONSERVER_ParameterNew: fn(*const c_char, CEnum, *const c_void) -> *mut TRITONSERVER_Parameter;
    TRITONSERVER_ParameterDelete: fn(*mut TRITONSERVER_Parameter);
    TRITONSERVER_MetricFamilyNew: fn(*mut *mut TRITONSERVER_MetricFamily, CEnum, *const c_char, *const c_char) -> Err;
    TRITONSERVER_MetricNew: fn(*mut *mut TRITONSERVER_Metric, *mut TRITONSERVER_MetricFamily, *const *const TRITONSERVER_Parameter, u64) -> Err;
    TRITONSERVER_MetricDelete: fn(*mut TRITONSERVER_Metric) -> Err;
    TRITONSERVER_MetricSet: fn(*mut TRITONSERVER_Metric, f64) -> Err;
    TRITONBACKEND_ApiVersion: fn(*mut u32, *mut u32) -> Err;
    TRITONBACKEND_ModelName: fn(*mut TRITONBACKEND_Model, *mut *const c_char) -> Err;
    TRITONBACKEND_ModelRepository: fn(*mut TRITONBACKEND_Model, *mut CEnum, *mut *const c_char) -> Err;
    TRITONBACKEND_ModelConfig: fn(*mut TRITONBACKEND_Model, u32, *mut *mut TRITONSERVER_Message) -> Err;
    TRITONBACKEND_ModelState: fn(*mut TRITONBACKEND_Model, *mut *mut c_void) -> Err;
    TRITONBACKEND_ModelSetState: fn(*mut TRITONBACKEND_Model, *mut c_void) -> Err;
    TRITONBACKEND_ModelInstanceModel: fn(*mut TRITONBACKEND_ModelInstance, *mut *mut TRITONBACKEND_Model) -> Err;
    TRITONBACKEND_RequestInput: fn(*mut TRITONBACKEND_Request, *const c_char, *mut *mut TRITONBACKEND_Input) -> Err;
    TRITONBACKEND_InputProperties: fn(*mut TRITONBACKEND_Input, *mut *const c_char, *mut CEnum, *mut *const i64, *mut u32, *mut u64, *mut u32) -> Err;
    TRITONBACKEND_InputBuffer: fn(*mut TRITONBACKEND_Input, u32, *mut *const c_void, *mut u64, *mut CEnum, *mut i64) -> Err;
    TRITONBACKEND_RequestId: fn(*mut TRITONBACKEND_Request, *mut *const c_char) -> Err;
    TRITONBACKEND_RequestCorrelationId: fn(*mut TRITONBACKEND_Request, *mut u64) -> Err;
    TRITONBACKEND_RequestOutputCount: fn(*mut TRITONBACKEND_Request, *mut u32) -> Err;
    TRITONBACKEND_RequestOutputName: fn(*mut TRITONBACKEND_Request, u32, *mut *const c_char) -> Err;
    TRITONBACKEND_RequestRelease: fn(*mut TRITONBACKEND_Request, u32) -> Err;
    TRITONBACKEND_ResponseFactoryNew: fn(*mut *mut TRITONBACKEND_ResponseFactory, *mut TRITONBACKEND_Request) -> Err;
    TRITONBACKEND_ResponseFactoryDelete: fn(*mut TRITONBACKEND_ResponseFactory) -> Err;
    TRITONBACKEND_ResponseFactorySendFlags: fn(*mut TRITONBACKEND_ResponseFactory, u32) -> Err;
    TRITONBACKEND_ResponseFactoryIsCancelled: fn(*mut TRITONBACKEND_ResponseFactory, *mut bool) -> Err;
    TRITONBACKEND_ResponseNewFromFactory: fn(*mut *mut TRITONBACKEND_Response, *mut TRITONBACKEND_ResponseFactory) -> Err;
    TRITONBACKEND_ResponseDelete: fn(*mut TRITONBACKEND_Response) -> Err;
    TRITONBACKEND_ResponseOutput: fn(*mut TRITONBACKEND_Response, *mut *mut TRITONBACKEND_Output, *const c_char, CEnum, *const i64, u32) -> Err;
    TRITONBACKEND_OutputBuffer: fn(*mut TRITONBACKEND_Output, *mut *mut c_void, u64, *mut CEnum, *mut i64) -> Err;
    TRITONBACKEND_ResponseSend: fn(*mut TRITONBACKEND_Response, u32, Err) -> Err;
}

static API: OnceLock<Api> = OnceLock::new();

fn api() -> &'static Api {
    // Entry points other than Initialize run only after Initialize succeeded.
    API.get()
        .expect("the Triton API is resolved at TRITONBACKEND_Initialize")
}

/// Turns a server error into a [`BackendError`] (and frees it); `None` for success.
fn take_error(err: Err) -> Option<BackendError> {
    if err.is_null() {
        return None;
    }
    let api = api();
    // SAFETY: `err` is a live error the server returned; its message is a C string owned by
    // it, copied out before the error is deleted (once, here).
    let (code, message) = unsafe {
        let code = (api.TRITONSERVER_ErrorCode)(err);
        let message = CStr::from_ptr((api.TRITONSERVER_ErrorMessage)(err))
            .to_string_lossy()
            .into_owned();
        (api.TRITONSERVER_ErrorDelete)(err);
        (code, message)
    };
    Some(BackendError::new(code_of(code), message))
}

fn check(err: Err, what: &str) -> Result<(), BackendError> {
    match take_error(err) {
        None => Ok(()),
        Some(e) => Err(BackendError::new(e.code, format!("{what}: {}", e.message))),
    }
}

fn c_string(text: &str) -> CString {
    CString::new(text.replace('\0', " ")).expect("NULs were replaced")
}

/// A new server error owning `error`'s message (the server takes ownership).
fn new_error(error: &BackendError) -> Err {
    let message = c_string(&error.message);
    // SAFETY: ErrorNew copies the message; the code is one of TRITONSERVER_Error_Code's.
    unsafe { (api().TRITONSERVER_ErrorNew)(error_code(error.code), message.as_ptr()) }
}

/// Copies a C string the server owns.
///
/// # Safety
/// `text` is null or a NUL-terminated string valid for the call.
unsafe fn owned(text: *const c_char) -> String {
    if text.is_null() {
        return String::new();
    }
    // SAFETY: the caller's contract.
    unsafe { CStr::from_ptr(text) }
        .to_string_lossy()
        .into_owned()
}

/// Writes a line to the server's log.
pub fn log(level: CEnum, message: &str) {
    let Some(api) = API.get() else {
        eprintln!("tlaloc backend: {message}");
        return;
    };
    let file = c"tlaloc";
    let message = c_string(message);
    // SAFETY: both strings outlive the call; LogMessage copies them.
    let err = unsafe { (api.TRITONSERVER_LogMessage)(level, file.as_ptr(), 0, message.as_ptr()) };
    let _ = take_error(err);
}

/// A model the server lends to the backend between ModelInitialize and ModelFinalize.
#[derive(Debug, Clone, Copy)]
pub struct Model(*mut TRITONBACKEND_Model);

impl Model {
    /// Its name.
    pub fn name(&self) -> Result<String, BackendError> {
        let mut name = ptr::null();
        // SAFETY: `self.0` is the live model; the name is owned by it.
        check(
            unsafe { (api().TRITONBACKEND_ModelName)(self.0, &mut name) },
            "model name",
        )?;
        // SAFETY: a C string owned by the model, valid now.
        Ok(unsafe { owned(name) })
    }

    /// The model's directory in the repository.
    pub fn repository(&self) -> Result<PathBuf, BackendError> {
        let mut kind: CEnum = 0;
        let mut location = ptr::null();
        // SAFETY: `self.0` is the live model; the location is owned by it.
        check(
            unsafe { (api().TRITONBACKEND_ModelRepository)(self.0, &mut kind, &mut location) },
            "model repository",
        )?;
        // SAFETY: a C string owned by the model, valid now.
        Ok(PathBuf::from(unsafe { owned(location) }))
    }

    /// The model configuration as JSON (version 1 of the serialization).
    pub fn config_json(&self) -> Result<String, BackendError> {
        let api = api();
        let mut message = ptr::null_mut();
        // SAFETY: `self.0` is the live model; the message is ours to delete.
        check(
            unsafe { (api.TRITONBACKEND_ModelConfig)(self.0, 1, &mut message) },
            "model configuration",
        )?;
        let mut base = ptr::null();
        let mut size = 0usize;
        // SAFETY: `message` is live; the JSON bytes are owned by it and copied before delete.
        unsafe {
            let serialized = check(
                (api.TRITONSERVER_MessageSerializeToJson)(message, &mut base, &mut size),
                "model configuration as JSON",
            );
            let json = serialized.map(|()| {
                String::from_utf8_lossy(std::slice::from_raw_parts(base.cast::<u8>(), size))
                    .into_owned()
            });
            let _ = take_error((api.TRITONSERVER_MessageDelete)(message));
            json
        }
    }
}

/// One input tensor of a request.
#[derive(Debug)]
pub struct Input {
    /// Its data type (`TRITONSERVER_DataType`).
    pub data_type: CEnum,
    /// Its shape.
    pub shape: Vec<i64>,
    /// Its bytes (all buffers, in order, copied to the host).
    pub bytes: Vec<u8>,
}

/// A request, owned by the backend from Execute until [`Request::release`].
#[derive(Debug)]
pub struct Request(*mut TRITONBACKEND_Request);

impl Request {
    /// The input `name`, `None` when the request has none by that name.
    pub fn input(&self, name: &str) -> Result<Option<Input>, BackendError> {
        let api = api();
        let c_name = c_string(name);
        let mut input = ptr::null_mut();
        // SAFETY: `self.0` is a live request; the input is owned by it.
        if let Some(_absent) = take_error(unsafe {
            (api.TRITONBACKEND_RequestInput)(self.0, c_name.as_ptr(), &mut input)
        }) {
            return Ok(None);
        }
        let mut data_type: CEnum = 0;
        let mut shape: *const i64 = ptr::null();
        let mut dims: u32 = 0;
        let mut byte_size: u64 = 0;
        let mut buffers: u32 = 0;
        // SAFETY: `input` is live; the name out-pointer may be null (not asked for).
        check(
            unsafe {
                (api.TRITONBACKEND_InputProperties)(
                    input,
                    ptr::null_mut(),
                    &mut data_type,
                    &mut shape,
                    &mut dims,
                    &mut byte_size,
                    &mut buffers,
                )
            },
            &format!("input {name}"),
        )?;
        let shape = if shape.is_null() || dims == 0 {
            Vec::new()
        } else {
            // SAFETY: the server gives `dims` dimensions at `shape`, owned by the input.
            unsafe { std::slice::from_raw_parts(shape, dims as usize) }.to_vec()
        };
        let mut bytes = Vec::with_capacity(byte_size as usize);
        for index in 0..buffers {
            let mut base: *const c_void = ptr::null();
            let mut size: u64 = 0;
            let mut memory: CEnum = MEMORY_CPU;
            let mut memory_id: i64 = 0;
            // SAFETY: `index` < the buffer count; the buffer is owned by the input.
            check(
                unsafe {
                    (api.TRITONBACKEND_InputBuffer)(
                        input,
                        index,
                        &mut base,
                        &mut size,
                        &mut memory,
                        &mut memory_id,
                    )
                },
                &format!("input {name} buffer {index}"),
            )?;
            if memory != MEMORY_CPU && memory != MEMORY_CPU_PINNED {
                return Err(BackendError::new(
                    Code::Unsupported,
                    format!("input {name} refused: it is in device memory; send it in host memory"),
                ));
            }
            if size > 0 {
                // SAFETY: `size` host bytes at `base`, valid while the request lives.
                bytes.extend_from_slice(unsafe {
                    std::slice::from_raw_parts(base.cast::<u8>(), size as usize)
                });
            }
        }
        Ok(Some(Input {
            data_type,
            shape,
            bytes,
        }))
    }

    /// The client's request ID (empty when it gave none).
    pub fn id(&self) -> String {
        let mut id = ptr::null();
        // SAFETY: `self.0` is a live request; the ID is owned by it and copied now.
        match take_error(unsafe { (api().TRITONBACKEND_RequestId)(self.0, &mut id) }) {
            // SAFETY: a C string owned by the live request, copied now.
            None => unsafe { owned(id) },
            Some(_) => String::new(),
        }
    }

    /// The numeric correlation ID (fails for a string ID).
    pub fn correlation_id(&self) -> Result<u64, BackendError> {
        let mut id = 0u64;
        // SAFETY: `self.0` is a live request.
        match take_error(unsafe { (api().TRITONBACKEND_RequestCorrelationId)(self.0, &mut id) }) {
            None => Ok(id),
            Some(e) => Err(e),
        }
    }

    /// The outputs the client asked for.
    pub fn requested_outputs(&self) -> Result<Vec<String>, BackendError> {
        let api = api();
        let mut count = 0u32;
        // SAFETY: `self.0` is a live request.
        check(
            unsafe { (api.TRITONBACKEND_RequestOutputCount)(self.0, &mut count) },
            "requested outputs",
        )?;
        let mut names = Vec::with_capacity(count as usize);
        for index in 0..count {
            let mut name = ptr::null();
            // SAFETY: `index` < count; the name is owned by the request.
            check(
                unsafe { (api.TRITONBACKEND_RequestOutputName)(self.0, index, &mut name) },
                "requested output name",
            )?;
            // SAFETY: a C string owned by the request, valid now.
            names.push(unsafe { owned(name) });
        }
        Ok(names)
    }

    /// A factory for this request's responses (outlives the request).
    pub fn response_factory(&self) -> Result<ResponseFactory, BackendError> {
        let mut factory = ptr::null_mut();
        // SAFETY: `self.0` is a live request; the factory is ours to delete.
        check(
            unsafe { (api().TRITONBACKEND_ResponseFactoryNew)(&mut factory, self.0) },
            "response factory",
        )?;
        Ok(ResponseFactory(factory))
    }

    /// Gives the request back to the server.
    pub fn release(self) {
        // SAFETY: `self.0` is owned by the backend and released once (self is consumed).
        let err = unsafe { (api().TRITONBACKEND_RequestRelease)(self.0, REQUEST_RELEASE_ALL) };
        if let Some(e) = take_error(err) {
            log(
                LOG_ERROR,
                &format!("releasing a request failed: {}", e.message),
            );
        }
    }
}

/// One output tensor of a response.
#[derive(Debug, Clone, PartialEq)]
pub struct OutputTensor {
    /// Its name in the model configuration.
    pub name: &'static str,
    /// Its shape.
    pub shape: Vec<i64>,
    /// Its data.
    pub data: TensorData,
}

/// The elements of an output tensor.
#[derive(Debug, Clone, PartialEq)]
pub enum TensorData {
    /// `TYPE_STRING` elements.
    Bytes(Vec<Vec<u8>>),
    /// `TYPE_INT32` elements.
    Int32(Vec<i32>),
}

impl TensorData {
    fn data_type(&self) -> CEnum {
        match self {
            TensorData::Bytes(_) => data_type::BYTES,
            TensorData::Int32(_) => data_type::INT32,
        }
    }

    /// The wire bytes: each string as a 4-byte little-endian length and its bytes.
    pub fn serialize(&self) -> Vec<u8> {
        match self {
            TensorData::Bytes(items) => {
                let mut out = Vec::new();
                for item in items {
                    out.extend_from_slice(&(item.len() as u32).to_le_bytes());
                    out.extend_from_slice(item);
                }
                out
            }
            TensorData::Int32(values) => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }
}

/// Makes and sends a request's responses from any thread, after the request is released.
#[derive(Debug)]
pub struct ResponseFactory(*mut TRITONBACKEND_ResponseFactory);

// SAFETY: a response factory is meant to be used from threads other than Execute's (decoupled
// models answer from their own threads); this wrapper is the only owner and is used by one
// thread at a time (it moves, it is not shared).
unsafe impl Send for ResponseFactory {}
// SAFETY: shared references to a factory exist only inside the one task that owns it (its
// future holds `&ResponseFactory` across awaits), so no two threads call it at once.
unsafe impl Sync for ResponseFactory {}

impl ResponseFactory {
    /// Whether the client went away or cancelled the request.
    pub fn is_cancelled(&self) -> bool {
        let mut cancelled = false;
        // SAFETY: `self.0` is a live factory.
        let err =
            unsafe { (api().TRITONBACKEND_ResponseFactoryIsCancelled)(self.0, &mut cancelled) };
        take_error(err).is_none() && cancelled
    }

    /// Sends one response with `outputs`; `last` marks it final.
    pub fn send(&self, outputs: &[OutputTensor], last: bool) -> Result<(), BackendError> {
        let api = api();
        let mut response = ptr::null_mut();
        // SAFETY: `self.0` is a live factory; the response is ours until sent or deleted.
        check(
            unsafe { (api.TRITONBACKEND_ResponseNewFromFactory)(&mut response, self.0) },
            "new response",
        )?;
        let filled = outputs.iter().try_for_each(|tensor| {
            // SAFETY: `response` is live and unsent.
            unsafe { fill_output(api, response, tensor) }
        });
        let flags = if last { RESPONSE_COMPLETE_FINAL } else { 0 };
        match filled {
            Ok(()) => {
                // SAFETY: sending hands the response to the server (no delete after).
                check(
                    unsafe { (api.TRITONBACKEND_ResponseSend)(response, flags, ptr::null_mut()) },
                    "send response",
                )
            }
            Err(e) => {
                // SAFETY: the unsent response is deleted once.
                let _ = take_error(unsafe { (api.TRITONBACKEND_ResponseDelete)(response) });
                self.send_error(&e)?;
                Err(e)
            }
        }
    }

    /// Sends the final response as an error.
    pub fn send_error(&self, error: &BackendError) -> Result<(), BackendError> {
        let api = api();
        let mut response = ptr::null_mut();
        // SAFETY: `self.0` is a live factory.
        check(
            unsafe { (api.TRITONBACKEND_ResponseNewFromFactory)(&mut response, self.0) },
            "new response",
        )?;
        // SAFETY: the server takes the response and the error.
        check(
            unsafe {
                (api.TRITONBACKEND_ResponseSend)(
                    response,
                    RESPONSE_COMPLETE_FINAL,
                    new_error(error),
                )
            },
            "send error response",
        )
    }

    /// Ends the response stream without another response.
    pub fn send_final_flag(&self) -> Result<(), BackendError> {
        // SAFETY: `self.0` is a live factory.
        check(
            unsafe {
                (api().TRITONBACKEND_ResponseFactorySendFlags)(self.0, RESPONSE_COMPLETE_FINAL)
            },
            "final flag",
        )
    }
}

impl Drop for ResponseFactory {
    fn drop(&mut self) {
        // SAFETY: the factory is deleted once, by its only owner.
        let _ = take_error(unsafe { (api().TRITONBACKEND_ResponseFactoryDelete)(self.0) });
    }
}

/// # Safety
/// `response` is a live, unsent response.
unsafe fn fill_output(
    api: &Api,
    response: *mut TRITONBACKEND_Response,
    tensor: &OutputTensor,
) -> Result<(), BackendError> {
    let name = c_string(tensor.name);
    let bytes = tensor.data.serialize();
    let mut output = ptr::null_mut();
    // SAFETY: the caller's contract; name and shape outlive the call (the server copies them).
    check(
        unsafe {
            (api.TRITONBACKEND_ResponseOutput)(
                response,
                &mut output,
                name.as_ptr(),
                tensor.data.data_type(),
                tensor.shape.as_ptr(),
                tensor.shape.len() as u32,
            )
        },
        &format!("output {}", tensor.name),
    )?;
    let mut buffer: *mut c_void = ptr::null_mut();
    let mut memory: CEnum = MEMORY_CPU;
    let mut memory_id: i64 = 0;
    // SAFETY: `output` is live; the buffer has `bytes.len()` bytes when it succeeds.
    check(
        unsafe {
            (api.TRITONBACKEND_OutputBuffer)(
                output,
                &mut buffer,
                bytes.len() as u64,
                &mut memory,
                &mut memory_id,
            )
        },
        &format!("output {} buffer", tensor.name),
    )?;
    if memory != MEMORY_CPU && memory != MEMORY_CPU_PINNED {
        return Err(BackendError::new(
            Code::Unsupported,
            format!(
                "output {} was given device memory; this backend writes host memory only",
                tensor.name
            ),
        ));
    }
    if !bytes.is_empty() {
        // SAFETY: `buffer` holds `bytes.len()` writable host bytes that do not overlap ours.
        unsafe { ptr::copy_nonoverlapping(bytes.as_ptr(), buffer.cast::<u8>(), bytes.len()) };
    }
    Ok(())
}

/// A gauge in the server's `/metrics`, one labelled series of a family.
#[derive(Debug)]
pub struct Gauge(*mut TRITONSERVER_Metric);

// SAFETY: Triton's metrics are thread-safe (prometheus-cpp gauges); the wrapper is the only
// owner and deletes the metric once.
unsafe impl Send for Gauge {}
// SAFETY: as above; `set` is the only operation and it is atomic on the server's side.
unsafe impl Sync for Gauge {}

impl Gauge {
    /// Sets its value.
    pub fn set(&self, value: f64) {
        // SAFETY: `self.0` is a live metric.
        let _ = take_error(unsafe { (api().TRITONSERVER_MetricSet)(self.0, value) });
    }
}

impl Drop for Gauge {
    fn drop(&mut self) {
        // SAFETY: deleted once, before its family (families live until Finalize).
        let _ = take_error(unsafe { (api().TRITONSERVER_MetricDelete)(self.0) });
    }
}

/// A gauge family, made once per backend.
#[derive(Debug)]
pub struct GaugeFamily(*mut TRITONSERVER_MetricFamily);

// SAFETY: families are thread-safe on the server's side and never deleted while the backend is
// loaded (they are made once and live in a static).
unsafe impl Send for GaugeFamily {}
// SAFETY: as above.
unsafe impl Sync for GaugeFamily {}

impl GaugeFamily {
    /// A new family of gauges `name`.
    pub fn new(name: &str, description: &str) -> Result<Self, BackendError> {
        let mut family = ptr::null_mut();
        let c_name = c_string(name);
        let c_description = c_string(description);
        // SAFETY: the strings outlive the call (copied by the server).
        check(
            unsafe {
                (api().TRITONSERVER_MetricFamilyNew)(
                    &mut family,
                    METRIC_KIND_GAUGE,
                    c_name.as_ptr(),
                    c_description.as_ptr(),
                )
            },
            &format!("metric family {name}"),
        )?;
        Ok(Self(family))
    }

    /// The gauge of this family labelled `model=<model>`.
    pub fn gauge(&self, model: &str) -> Result<Gauge, BackendError> {
        let api = api();
        let value = c_string(model);
        // SAFETY: ParameterNew copies name and value; the parameter is deleted below.
        let label = unsafe {
            (api.TRITONSERVER_ParameterNew)(
                c"model".as_ptr(),
                PARAMETER_STRING,
                value.as_ptr().cast::<c_void>(),
            )
        };
        if label.is_null() {
            return Err(BackendError::new(
                Code::Internal,
                "cannot make a metric label",
            ));
        }
        let labels = [label.cast_const()];
        let mut metric = ptr::null_mut();
        // SAFETY: the family is live; the labels array outlives the call.
        let made = check(
            unsafe { (api.TRITONSERVER_MetricNew)(&mut metric, self.0, labels.as_ptr(), 1) },
            "metric",
        );
        // SAFETY: the label is deleted once, after MetricNew copied it.
        unsafe { (api.TRITONSERVER_ParameterDelete)(label) };
        made.map(|()| Gauge(metric))
    }
}

/// Runs an entry point's body: a panic becomes an INTERNAL error, an error a server error.
fn guarded(name: &str, body: impl FnOnce() -> Result<(), BackendError>) -> Err {
    let outcome = catch_unwind(AssertUnwindSafe(body));
    let error = match outcome {
        Ok(Ok(())) => return ptr::null_mut(),
        Ok(Err(e)) => e,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            BackendError::new(Code::Internal, format!("{name} panicked: {what}"))
        }
    };
    if API.get().is_none() {
        eprintln!("tlaloc backend: {name}: {}", error.message);
        return ptr::null_mut();
    }
    log(LOG_ERROR, &format!("{name}: {}", error.message));
    new_error(&error)
}

/// Resolves the server's functions and checks its TRITONBACKEND API version.
fn initialize() -> Result<(), BackendError> {
    if API.get().is_none() {
        let process = libloading::os::unix::Library::this();
        let resolved = Api::resolve(&process)?;
        let _ = API.set(resolved);
    }
    let (mut major, mut minor) = (0u32, 0u32);
    // SAFETY: two out-pointers to locals.
    check(
        unsafe { (api().TRITONBACKEND_ApiVersion)(&mut major, &mut minor) },
        "API version",
    )?;
    crate::backend::check_api_version(major, minor)
}

/// `TRITONBACKEND_Initialize`.
#[unsafe(no_mangle)]
pub extern "C" fn TRITONBACKEND_Initialize(_backend: *mut TRITONBACKEND_Backend) -> Err {
    let outcome = catch_unwind(initialize);
    match outcome {
        Ok(Ok(())) => ptr::null_mut(),
        Ok(Err(e)) => match API.get() {
            Some(_) => {
                log(LOG_ERROR, &e.message);
                new_error(&e)
            }
            None => match resolve_error_new() {
                // Without the table, an error can still be made if ErrorNew itself resolves.
                Some(error_new) => {
                    let message = c_string(&e.message);
                    // SAFETY: ErrorNew's declared type; it copies the message.
                    unsafe { error_new(error_code(e.code), message.as_ptr()) }
                }
                None => {
                    eprintln!("tlaloc backend: {}", e.message);
                    ptr::null_mut()
                }
            },
        },
        Err(_) => {
            eprintln!("tlaloc backend: TRITONBACKEND_Initialize panicked");
            ptr::null_mut()
        }
    }
}

fn resolve_error_new() -> Option<unsafe extern "C" fn(CEnum, *const c_char) -> Err> {
    let process = libloading::os::unix::Library::this();
    // SAFETY: TRITONSERVER_ErrorNew's declared type in tritonserver.h r24.10.
    unsafe {
        process
            .get::<unsafe extern "C" fn(CEnum, *const c_char) -> Err>(b"TRITONSERVER_ErrorNew\0")
            .ok()
            .map(|s| *s)
    }
}

/// `TRITONBACKEND_ModelInitialize`: loads the engine, one per model.
///
/// # Safety
/// Called by Triton only, with the live objects its header describes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn TRITONBACKEND_ModelInitialize(model: *mut TRITONBACKEND_Model) -> Err {
    guarded("TRITONBACKEND_ModelInitialize", || {
        let state = crate::backend::ModelState::initialize(Model(model))?;
        let state = Box::into_raw(Box::new(state));
        // SAFETY: the model is live; the state pointer is reclaimed in ModelFinalize.
        let set = check(
            unsafe { (api().TRITONBACKEND_ModelSetState)(model, state.cast::<c_void>()) },
            "model state",
        );
        if set.is_err() {
            // SAFETY: never handed to the server; reclaimed once here.
            drop(unsafe { Box::from_raw(state) });
        }
        set
    })
}

/// # Safety
/// `model` is live and its state, if set, is a `ModelState` set by ModelInitialize.
unsafe fn model_state<'a>(
    model: *mut TRITONBACKEND_Model,
) -> Result<&'a crate::backend::ModelState, BackendError> {
    let mut state = ptr::null_mut();
    // SAFETY: the caller's contract.
    check(
        unsafe { (api().TRITONBACKEND_ModelState)(model, &mut state) },
        "model state",
    )?;
    if state.is_null() {
        return Err(BackendError::new(Code::Internal, "the model has no state"));
    }
    // SAFETY: set by ModelInitialize to a live Box<ModelState>, freed only in ModelFinalize,
    // which Triton calls after every instance is finalized.
    Ok(unsafe { &*state.cast::<crate::backend::ModelState>() })
}

/// `TRITONBACKEND_ModelFinalize`: stops the engine.
///
/// # Safety
/// Called by Triton only, with the live objects its header describes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn TRITONBACKEND_ModelFinalize(model: *mut TRITONBACKEND_Model) -> Err {
    guarded("TRITONBACKEND_ModelFinalize", || {
        let mut state = ptr::null_mut();
        // SAFETY: the model is live.
        check(
            unsafe { (api().TRITONBACKEND_ModelState)(model, &mut state) },
            "model state",
        )?;
        if !state.is_null() {
            // SAFETY: the Box made in ModelInitialize, reclaimed once; no instance is left.
            let state = unsafe { Box::from_raw(state.cast::<crate::backend::ModelState>()) };
            state.finalize();
        }
        Ok(())
    })
}

/// `TRITONBACKEND_ModelInstanceInitialize`: nothing per instance (one instance per model).
#[unsafe(no_mangle)]
pub extern "C" fn TRITONBACKEND_ModelInstanceInitialize(
    _instance: *mut TRITONBACKEND_ModelInstance,
) -> Err {
    guarded("TRITONBACKEND_ModelInstanceInitialize", || Ok(()))
}

/// `TRITONBACKEND_ModelInstanceFinalize`.
#[unsafe(no_mangle)]
pub extern "C" fn TRITONBACKEND_ModelInstanceFinalize(
    _instance: *mut TRITONBACKEND_ModelInstance,
) -> Err {
    guarded("TRITONBACKEND_ModelInstanceFinalize", || Ok(()))
}

/// `TRITONBACKEND_ModelInstanceExecute`: takes every request, answers through its response
/// factory from the engine's side, and returns without waiting on the device.
///
/// # Safety
/// Called by Triton only, with the live objects its header describes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn TRITONBACKEND_ModelInstanceExecute(
    instance: *mut TRITONBACKEND_ModelInstance,
    requests: *mut *mut TRITONBACKEND_Request,
    request_count: u32,
) -> Err {
    // The requests are the backend's from here on: copy the pointers out first, so that even a
    // failure below releases each one.
    let requests: Vec<Request> = if requests.is_null() {
        Vec::new()
    } else {
        // SAFETY: Triton passes `request_count` request pointers, valid for this call.
        unsafe { std::slice::from_raw_parts(requests, request_count as usize) }
            .iter()
            .map(|&r| Request(r))
            .collect()
    };
    let err = guarded("TRITONBACKEND_ModelInstanceExecute", || {
        let mut model = ptr::null_mut();
        // SAFETY: the instance is live.
        check(
            unsafe { (api().TRITONBACKEND_ModelInstanceModel)(instance, &mut model) },
            "instance model",
        )?;
        // SAFETY: the model is live and its state was set by ModelInitialize.
        let state = unsafe { model_state(model) }?;
        state.execute(requests);
        Ok(())
    });
    if !err.is_null() {
        // The requests were taken (and released) by the body or lost to a panic; Triton must
        // not get them back, so the error is logged and success returned.
        let _ = take_error(err);
    }
    ptr::null_mut()
}

/// `TRITONBACKEND_Finalize`.
#[unsafe(no_mangle)]
pub extern "C" fn TRITONBACKEND_Finalize(_backend: *mut TRITONBACKEND_Backend) -> Err {
    guarded("TRITONBACKEND_Finalize", || Ok(()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mirrored_enums_have_the_header_values() {
        // TRITONSERVER_DataType, TRITONSERVER_Error_Code and the flags as tritonserver.h r24.10
        // numbers them (an enum's members count up from 0 unless set).
        assert_eq!(
            (
                data_type::BOOL,
                data_type::UINT64,
                data_type::INT32,
                data_type::BYTES
            ),
            (1, 5, 8, 13)
        );
        assert_eq!(error_code(Code::Unavailable), 4);
        assert_eq!(error_code(Code::Cancelled), 7);
        for code in [
            Code::Unknown,
            Code::Internal,
            Code::NotFound,
            Code::InvalidArg,
            Code::Unavailable,
            Code::Unsupported,
            Code::AlreadyExists,
            Code::Cancelled,
        ] {
            assert_eq!(code_of(error_code(code)), code);
        }
        assert_eq!((REQUEST_RELEASE_ALL, RESPONSE_COMPLETE_FINAL), (1, 1));
        assert_eq!(
            std::mem::size_of::<CEnum>(),
            std::mem::size_of::<std::ffi::c_int>()
        );
    }

    #[test]
    fn opaque_handles_are_zero_sized_and_the_table_is_one_pointer_per_function() {
        assert_eq!(std::mem::size_of::<TRITONBACKEND_Request>(), 0);
        assert_eq!(
            std::mem::size_of::<Api>(),
            Api::NAMES.len() * std::mem::size_of::<usize>()
        );
        assert!(Api::NAMES.contains(&"TRITONBACKEND_ResponseFactoryIsCancelled"));
    }

    #[test]
    fn outside_a_server_the_first_missing_function_is_refused_by_name() {
        let process = libloading::os::unix::Library::this();
        let e = Api::resolve(&process).unwrap_err();
        assert_eq!(e.code, Code::Unsupported);
        assert!(
            e.message.contains("does not export TRITONSERVER_ErrorNew"),
            "{}",
            e.message
        );
    }

    #[test]
    fn a_panic_in_an_entry_point_body_does_not_unwind_out_of_it() {
        // Outside a server no error object can be made: the failure is printed and null
        // returned, but the panic stops here.
        let err = guarded("test entry", || panic!("boom"));
        assert!(err.is_null());
    }

    #[test]
    fn strings_serialize_with_a_little_endian_length_prefix() {
        let data = TensorData::Bytes(vec![b"ab".to_vec(), Vec::new()]);
        assert_eq!(data.serialize(), [2, 0, 0, 0, b'a', b'b', 0, 0, 0, 0]);
        assert_eq!(
            TensorData::Int32(vec![1, -1]).serialize(),
            [1, 0, 0, 0, 255, 255, 255, 255]
        );
    }
}
