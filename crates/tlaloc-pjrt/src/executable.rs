//! Compiling StableHLO text, executing with borrowed or donated arguments, and serializing
//! executables.
//!
//! Donation is declared by the program (`tf.aliasing_output` / `jax.buffer_donor` on @main's
//! arguments). A [`ExecuteArg::Donated`] buffer is moved into the call so Rust code cannot touch
//! it again; every [`ExecuteArg::Borrowed`] index is passed in `non_donatable_input_indices` so
//! that PJRT never donates a buffer the caller still holds.
//!
//! The PJRT C API of 0.81 has no parameter-count query, so the count is read from @main's
//! signature in the program text when compiling, and carried inside the bytes of
//! [`LoadedExecutable::serialize`]; an execute with the wrong count is refused before it reaches
//! a plugin (some abort on it).
//!
//! A program compiled for several devices (replicas or SPMD partitions of one client) runs in one
//! call, [`LoadedExecutable::execute_per_device`], one argument list per device in the order of
//! [`LoadedExecutable::addressable_devices`]; every buffer is checked to be on its list's device
//! before the call, since a plugin given a misplaced buffer may copy it silently or fail deep
//! inside XLA.

use std::ffi::c_char;
use std::sync::Arc;

use crate::api::{pjrt_call, warn_in_drop};
use crate::buffer::Buffer;
use crate::client::{Client, Device};
use crate::compile_options::CompileOptions;
use crate::error::{Error, ErrorCode, Result};
use crate::event::Event;
use crate::ffi::{self, ArgsStruct};

/// One argument of [`LoadedExecutable::execute`].
#[derive(Debug)]
pub enum ExecuteArg<'a> {
    /// Read by the program; never donated.
    Borrowed(&'a Buffer),
    /// Moved into the call; its memory may be reused for an output the program aliases to it.
    ///
    /// The buffer cannot be used afterwards; the compiler refuses it:
    ///
    /// ```compile_fail,E0382
    /// fn step(program: &tlaloc_pjrt::LoadedExecutable, pool: tlaloc_pjrt::Buffer) {
    ///     let _ = program.execute(vec![tlaloc_pjrt::ExecuteArg::Donated(pool)]);
    ///     let _ = pool.dims();
    /// }
    /// ```
    Donated(Buffer),
}

impl ExecuteArg<'_> {
    fn buffer(&self) -> &Buffer {
        match self {
            ExecuteArg::Borrowed(buffer) => buffer,
            ExecuteArg::Donated(buffer) => buffer,
        }
    }
}

struct ExecutableInner {
    client: Client,
    raw: *mut ffi::PJRT_LoadedExecutable,
    num_outputs: usize,
    num_parameters: Option<usize>,
}

// SAFETY: PJRT loaded executables are thread-safe (concurrent Execute calls are allowed); the
// handle is destroyed once, in Drop.
unsafe impl Send for ExecutableInner {}
// SAFETY: as above.
unsafe impl Sync for ExecutableInner {}

impl Drop for ExecutableInner {
    fn drop(&mut self) {
        let mut args = ffi::PJRT_LoadedExecutable_Destroy_Args::new();
        args.executable = self.raw;
        // SAFETY: `raw` is live, owned by this value and not used after this call.
        let result = unsafe {
            pjrt_call!(
                self.client.plugin().api(),
                PJRT_LoadedExecutable_Destroy,
                &mut args
            )
        };
        warn_in_drop("PJRT_LoadedExecutable_Destroy", result);
    }
}

/// A compiled program loaded on a client. Cheap to clone, `Send + Sync`.
#[derive(Clone)]
pub struct LoadedExecutable {
    inner: Arc<ExecutableInner>,
}

impl std::fmt::Debug for LoadedExecutable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedExecutable")
            .field("num_outputs", &self.inner.num_outputs)
            .field("num_parameters", &self.inner.num_parameters)
            .finish()
    }
}

/// The `PJRT_Executable` view of a loaded executable, destroyed on drop.
struct ExecutableView<'a> {
    client: &'a Client,
    raw: *mut ffi::PJRT_Executable,
}

impl<'a> ExecutableView<'a> {
    fn of(
        client: &'a Client,
        loaded: *mut ffi::PJRT_LoadedExecutable,
    ) -> Result<ExecutableView<'a>> {
        let mut args = ffi::PJRT_LoadedExecutable_GetExecutable_Args::new();
        args.loaded_executable = loaded;
        // SAFETY: `loaded` is a live executable of `client`; the returned view becomes ours.
        unsafe {
            pjrt_call!(
                client.plugin().api(),
                PJRT_LoadedExecutable_GetExecutable,
                &mut args
            )
        }?;
        if args.executable.is_null() {
            return Err(Error::Pjrt {
                call: "PJRT_LoadedExecutable_GetExecutable",
                code: ErrorCode::Internal,
                message: "the plugin returned no executable".to_string(),
            });
        }
        Ok(ExecutableView {
            client,
            raw: args.executable,
        })
    }

    fn num_outputs(&self) -> Result<usize> {
        let mut args = ffi::PJRT_Executable_NumOutputs_Args::new();
        args.executable = self.raw;
        // SAFETY: the view is live.
        unsafe {
            pjrt_call!(
                self.client.plugin().api(),
                PJRT_Executable_NumOutputs,
                &mut args
            )
        }?;
        Ok(args.num_outputs)
    }

    fn serialize(&self) -> Result<Vec<u8>> {
        let mut args = ffi::PJRT_Executable_Serialize_Args::new();
        args.executable = self.raw;
        // SAFETY: the view is live; the returned bytes stay valid until the deleter is called.
        unsafe {
            pjrt_call!(
                self.client.plugin().api(),
                PJRT_Executable_Serialize,
                &mut args
            )
        }?;
        let bytes = if args.serialized_bytes.is_null() {
            Vec::new()
        } else {
            // SAFETY: the plugin returned `serialized_bytes_size` readable bytes, backed by
            // `serialized_executable` until its deleter runs below.
            unsafe {
                std::slice::from_raw_parts(
                    args.serialized_bytes.cast::<u8>(),
                    args.serialized_bytes_size,
                )
            }
            .to_vec()
        };
        if let Some(deleter) = args.serialized_executable_deleter {
            // SAFETY: the deleter the plugin gave for exactly this object, called once.
            unsafe { deleter(args.serialized_executable) };
        }
        Ok(bytes)
    }
}

impl Drop for ExecutableView<'_> {
    fn drop(&mut self) {
        let mut args = ffi::PJRT_Executable_Destroy_Args::new();
        args.executable = self.raw;
        // SAFETY: the view is live, ours, and not used after this call.
        let result = unsafe {
            pjrt_call!(
                self.client.plugin().api(),
                PJRT_Executable_Destroy,
                &mut args
            )
        };
        warn_in_drop("PJRT_Executable_Destroy", result);
    }
}

/// One output list and one completion event (if asked for) per device.
type PerDevice = (Vec<Vec<Buffer>>, Vec<Option<Event>>);

const SERIALIZED_MAGIC: &[u8; 8] = b"TLALOCX1";
const UNKNOWN_PARAMETERS: u32 = u32::MAX;

impl Client {
    /// Compiles StableHLO (MLIR text, pretty or generic form) with typed options.
    pub fn compile(&self, mlir_text: &str, options: &CompileOptions) -> Result<LoadedExecutable> {
        options.validate()?;
        let format = "mlir";
        let options_bytes = options.to_proto_bytes();
        let mut program = ffi::PJRT_Program::new();
        // The plugin only reads `code` when compiling; the field is `char*` because the same
        // struct is an out-parameter elsewhere.
        program.code = mlir_text.as_ptr().cast::<c_char>().cast_mut();
        program.code_size = mlir_text.len();
        program.format = format.as_ptr().cast::<c_char>();
        program.format_size = format.len();
        let mut args = ffi::PJRT_Client_Compile_Args::new();
        args.client = self.raw();
        args.program = &program;
        args.compile_options = options_bytes.as_ptr().cast::<c_char>();
        args.compile_options_size = options_bytes.len();
        // SAFETY: the text, the format string, `program` and the option bytes all outlive the
        // call; the plugin does not write through `code` when compiling.
        unsafe { pjrt_call!(self.plugin().api(), PJRT_Client_Compile, &mut args) }?;
        LoadedExecutable::new(self, args.executable, main_parameter_count(mlir_text))
    }

    /// Loads bytes made by [`LoadedExecutable::serialize`] (same plugin build).
    pub fn deserialize_executable(
        &self,
        bytes: &[u8],
        options: &CompileOptions,
    ) -> Result<LoadedExecutable> {
        let header = SERIALIZED_MAGIC.len() + 4;
        if bytes.len() < header || &bytes[..SERIALIZED_MAGIC.len()] != SERIALIZED_MAGIC {
            return Err(Error::BadSerializedExecutable(
                "not made by LoadedExecutable::serialize (missing the TLALOCX1 header)".to_string(),
            ));
        }
        let mut count = [0u8; 4];
        count.copy_from_slice(&bytes[SERIALIZED_MAGIC.len()..header]);
        let count = u32::from_le_bytes(count);
        let num_parameters = (count != UNKNOWN_PARAMETERS).then_some(count as usize);
        let payload = &bytes[header..];
        options.validate()?;
        let options_bytes = options.to_proto_bytes();
        let mut args = ffi::PJRT_Executable_DeserializeAndLoad_Args::new();
        args.client = self.raw();
        args.serialized_executable = payload.as_ptr().cast::<c_char>();
        args.serialized_executable_size = payload.len();
        args.overridden_serialized_compile_options = options_bytes.as_ptr().cast::<c_char>();
        args.overridden_serialized_compile_options_size = options_bytes.len();
        // SAFETY: `payload` and `options_bytes` outlive the call.
        unsafe {
            pjrt_call!(
                self.plugin().api(),
                PJRT_Executable_DeserializeAndLoad,
                &mut args
            )
        }?;
        LoadedExecutable::new(self, args.loaded_executable, num_parameters)
    }
}

impl LoadedExecutable {
    fn new(
        client: &Client,
        raw: *mut ffi::PJRT_LoadedExecutable,
        num_parameters: Option<usize>,
    ) -> Result<Self> {
        if raw.is_null() {
            return Err(Error::Pjrt {
                call: "PJRT executable creation",
                code: ErrorCode::Internal,
                message: "the plugin returned a null executable".to_string(),
            });
        }
        let mut inner = ExecutableInner {
            client: client.clone(),
            raw,
            num_outputs: 0,
            num_parameters,
        };
        // `inner` owns `raw` from here on, so an error below still destroys it.
        inner.num_outputs = ExecutableView::of(client, raw)?.num_outputs()?;
        Ok(LoadedExecutable {
            inner: Arc::new(inner),
        })
    }

    /// The client the executable is loaded on.
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// Number of outputs per execution.
    pub fn num_outputs(&self) -> usize {
        self.inner.num_outputs
    }

    /// Number of parameters of @main, when known.
    pub fn num_parameters(&self) -> Option<usize> {
        self.inner.num_parameters
    }

    /// The executable as bytes for [`Client::deserialize_executable`]: an 8-byte `TLALOCX1`
    /// tag, the parameter count (u32 LE), then the plugin's own serialization.
    pub fn serialize(&self) -> Result<Vec<u8>> {
        let payload = ExecutableView::of(&self.inner.client, self.inner.raw)?.serialize()?;
        let count = self
            .inner
            .num_parameters
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or(UNKNOWN_PARAMETERS);
        let mut out = Vec::with_capacity(payload.len() + 12);
        out.extend_from_slice(SERIALIZED_MAGIC);
        out.extend_from_slice(&count.to_le_bytes());
        out.extend_from_slice(&payload);
        Ok(out)
    }

    /// Runs the program once on its device and returns the outputs in order, without waiting
    /// for the computation (reading an output waits for it).
    pub fn execute(&self, args: Vec<ExecuteArg<'_>>) -> Result<Vec<Buffer>> {
        self.launch_one(args, false).map(|(outputs, _)| outputs)
    }

    /// Like [`execute`](Self::execute), also returning the event that fires when the device has
    /// finished (and reports an execution error).
    pub fn execute_with_completion(
        &self,
        args: Vec<ExecuteArg<'_>>,
    ) -> Result<(Vec<Buffer>, Option<Event>)> {
        self.launch_one(args, true)
    }

    fn launch_one(
        &self,
        args: Vec<ExecuteArg<'_>>,
        want_event: bool,
    ) -> Result<(Vec<Buffer>, Option<Event>)> {
        if let Some(expected) = self.inner.num_parameters {
            if args.len() != expected {
                return Err(Error::ArgumentCount {
                    expected,
                    found: args.len(),
                });
            }
        }
        let lists = vec![args];
        self.check_clients(&lists)?;
        let (mut outputs, mut events) = self.launch(lists, want_event)?;
        Ok((outputs.pop().unwrap_or_default(), events.pop().flatten()))
    }

    /// The devices the executable runs on (`PJRT_LoadedExecutable_AddressableDevices`), in the
    /// order [`execute_per_device`](Self::execute_per_device) takes its argument lists: for a
    /// program compiled with a [`DeviceAssignment`](crate::DeviceAssignment), replica by
    /// replica, each replica's partitions in order.
    pub fn addressable_devices(&self) -> Result<Vec<Device>> {
        let client = &self.inner.client;
        let mut args = ffi::PJRT_LoadedExecutable_AddressableDevices_Args::new();
        args.executable = self.inner.raw;
        // SAFETY: the executable is live; the returned array is owned by it.
        unsafe {
            pjrt_call!(
                client.plugin().api(),
                PJRT_LoadedExecutable_AddressableDevices,
                &mut args
            )
        }?;
        client.devices_from_raw(args.addressable_devices, args.num_addressable_devices)
    }

    /// Runs the program once across all its devices, `args[d]` being the arguments of device
    /// `d` of [`addressable_devices`](Self::addressable_devices) (each buffer on that device;
    /// for an SPMD program, that partition's shards), and returns each device's outputs in the
    /// same order, without waiting for the computation.
    ///
    /// An argument index that is [`ExecuteArg::Borrowed`] in any list is donated in none (PJRT
    /// takes one non-donatable index list for all devices); a [`ExecuteArg::Donated`] buffer at
    /// such an index is still consumed.
    pub fn execute_per_device(&self, args: Vec<Vec<ExecuteArg<'_>>>) -> Result<Vec<Vec<Buffer>>> {
        let devices = self.addressable_devices()?;
        let ids: Vec<i32> = devices.iter().map(Device::id).collect();
        if args.len() != devices.len() {
            return Err(Error::InvalidArgument(format!(
                "{} argument lists were given; the executable runs on {} devices (ids {ids:?}) \
                 and takes exactly one argument list per device, in that order",
                args.len(),
                devices.len()
            )));
        }
        let (expected, whose) = match self.inner.num_parameters {
            Some(count) => (count, "the executable's parameter count"),
            None => (args.first().map_or(0, Vec::len), "the first list's length"),
        };
        if let Some((position, list)) = args
            .iter()
            .enumerate()
            .find(|(_, list)| list.len() != expected)
        {
            return Err(Error::InvalidArgument(format!(
                "the argument list for device id {} (position {position}) has {} arguments; \
                 every list must have {expected} ({whose})",
                ids[position],
                list.len()
            )));
        }
        self.check_clients(&args)?;
        for (position, (list, device)) in args.iter().zip(&devices).enumerate() {
            for (index, arg) in list.iter().enumerate() {
                let raw = arg.buffer().device_raw()?;
                if raw != device.raw() {
                    let found = Device::new(self.inner.client.clone(), raw)?.id();
                    return Err(Error::InvalidArgument(format!(
                        "argument {index} of the list for device id {} (position {position}) is \
                         a buffer on device id {found}; each list's buffers must be on that \
                         list's device (device ids in list order: {ids:?})",
                        device.id()
                    )));
                }
            }
        }
        self.launch(args, false).map(|(outputs, _)| outputs)
    }

    fn check_clients(&self, lists: &[Vec<ExecuteArg<'_>>]) -> Result<()> {
        for (position, list) in lists.iter().enumerate() {
            for (index, arg) in list.iter().enumerate() {
                if !Arc::ptr_eq(&arg.buffer().client().inner, &self.inner.client.inner) {
                    return Err(Error::InvalidArgument(format!(
                        "argument {index} of argument list {position} is a buffer of another \
                         client"
                    )));
                }
            }
        }
        Ok(())
    }

    /// One `PJRT_LoadedExecutable_Execute` over `lists.len()` devices; the lists are already
    /// checked to be of one length and of this client.
    fn launch(&self, lists: Vec<Vec<ExecuteArg<'_>>>, want_events: bool) -> Result<PerDevice> {
        let num_devices = lists.len();
        let num_args = lists.first().map_or(0, Vec::len);
        let raw_args: Vec<Vec<*mut ffi::PJRT_Buffer>> = lists
            .iter()
            .map(|list| list.iter().map(|arg| arg.buffer().raw()).collect())
            .collect();
        let non_donatable: Vec<i64> = (0..num_args)
            .filter(|&index| {
                lists
                    .iter()
                    .any(|list| matches!(list[index], ExecuteArg::Borrowed(_)))
            })
            .map(|index| index as i64)
            .collect();
        let mut options = ffi::PJRT_ExecuteOptions::new();
        options.non_donatable_input_indices = non_donatable.as_ptr();
        options.num_non_donatable_input_indices = non_donatable.len();
        let argument_lists: Vec<*const *mut ffi::PJRT_Buffer> =
            raw_args.iter().map(|list| list.as_ptr()).collect();
        let mut outputs: Vec<Vec<*mut ffi::PJRT_Buffer>> =
            vec![vec![std::ptr::null_mut(); self.inner.num_outputs]; num_devices];
        let output_lists: Vec<*mut *mut ffi::PJRT_Buffer> =
            outputs.iter_mut().map(|list| list.as_mut_ptr()).collect();
        let mut complete_events: Vec<*mut ffi::PJRT_Event> =
            vec![std::ptr::null_mut(); num_devices];

        let mut call = ffi::PJRT_LoadedExecutable_Execute_Args::new();
        call.executable = self.inner.raw;
        call.options = &mut options;
        call.argument_lists = argument_lists.as_ptr();
        call.num_devices = num_devices;
        call.num_args = num_args;
        call.output_lists = output_lists.as_ptr();
        if want_events {
            call.device_complete_events = complete_events.as_mut_ptr();
        }
        let client = &self.inner.client;
        // SAFETY: every argument buffer is live (borrowed or owned by `lists`, which outlives the
        // call); the argument array is `num_devices` rows of `num_args` buffers, the output array
        // `num_devices` rows of `num_outputs` slots as the executable reports, the event array
        // `num_devices` slots; the rows, `options` and the index list all outlive the call.
        unsafe {
            pjrt_call!(
                client.plugin().api(),
                PJRT_LoadedExecutable_Execute,
                &mut call
            )
        }?;
        // Own every returned handle before looking for a null one, so that none leaks.
        let events: Vec<Option<Event>> = complete_events
            .into_iter()
            .map(|raw| Event::from_raw(client.plugin(), raw))
            .collect();
        // Donated buffers are dropped with `lists`: PJRT has already taken their memory, and
        // destroying the handle only releases the husk.
        drop(lists);
        let owned: Vec<Vec<Result<Buffer>>> = outputs
            .into_iter()
            .map(|row| {
                row.into_iter()
                    .map(|raw| Buffer::from_raw(client, raw))
                    .collect()
            })
            .collect();
        let outputs = owned
            .into_iter()
            .map(|row| row.into_iter().collect::<Result<Vec<_>>>())
            .collect::<Result<Vec<_>>>()?;
        Ok((outputs, events))
    }
}

/// Counts the parameters of `func.func ... @main(...)` in pretty-printed MLIR; `None` when the
/// text has no such signature (for example generic form).
pub(crate) fn main_parameter_count(text: &str) -> Option<usize> {
    let start = text.match_indices("@main(").map(|(i, _)| i).find(|&i| {
        let before = text[..i].trim_end();
        let before = ["public", "private", "nested"]
            .iter()
            .find_map(|word| before.strip_suffix(word))
            .unwrap_or(before)
            .trim_end();
        before.ends_with("func.func")
    })?;
    let signature = &text[start + "@main".len()..];
    let mut depth = 0usize;
    let mut count = 0usize;
    let mut previous = ' ';
    let mut in_string = false;
    let mut escaped = false;
    for c in signature.chars() {
        if in_string {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_string = true,
            '(' | '[' | '{' | '<' => depth += 1,
            '>' if previous == '-' => {}
            ')' | ']' | '}' | '>' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(count);
                }
            }
            '%' if depth == 1 => count += 1,
            _ => {}
        }
        previous = c;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::main_parameter_count;

    #[test]
    fn counts_main_parameters_in_pretty_form() {
        let text = r#"module @m {
  func.func private @helper(%a: tensor<f32>) -> tensor<f32> { return %a : tensor<f32> }
  func.func public @main(%arg0: tensor<2x3xf32> {tf.aliasing_output = 0 : i32}, %arg1: tensor<i32> {mhlo.sharding = "{replicated}"}, %arg2: tuple<tensor<f32>, tensor<f32>>) -> (tensor<2x3xf32>) {
    return %arg0 : tensor<2x3xf32>
  }
}"#;
        assert_eq!(main_parameter_count(text), Some(3));
        assert_eq!(
            main_parameter_count("func.func @main() -> tensor<f32> {"),
            Some(0)
        );
        assert_eq!(
            main_parameter_count("\"func.func\"() <{sym_name = \"main\"}>"),
            None
        );
    }
}
