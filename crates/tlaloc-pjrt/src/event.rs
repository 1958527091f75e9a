//! `PJRT_Event`: a completion signal for asynchronous work (a transfer, an execution).

use crate::api::{pjrt_call, warn_in_drop};
use crate::error::Result;
use crate::ffi::{self, ArgsStruct};
use crate::plugin::Plugin;

/// An owned PJRT event, destroyed on drop.
pub struct Event {
    plugin: Plugin,
    raw: *mut ffi::PJRT_Event,
}

// SAFETY: PJRT events are thread-safe futures; the handle is destroyed once, in Drop.
unsafe impl Send for Event {}
// SAFETY: as above.
unsafe impl Sync for Event {}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Event").field("raw", &self.raw).finish()
    }
}

impl Event {
    /// Takes ownership of `raw`; `None` when the plugin returned no event.
    pub(crate) fn from_raw(plugin: &Plugin, raw: *mut ffi::PJRT_Event) -> Option<Event> {
        (!raw.is_null()).then(|| Event {
            plugin: plugin.clone(),
            raw,
        })
    }

    /// Blocks until the event is ready; returns the error the work ended with, if any.
    pub fn wait(&self) -> Result<()> {
        let mut args = ffi::PJRT_Event_Await_Args::new();
        args.event = self.raw;
        // SAFETY: `raw` is a live event owned by `self`.
        unsafe { pjrt_call!(self.plugin.api(), PJRT_Event_Await, &mut args) }
    }

    /// Whether the work has finished (successfully or not).
    pub fn is_ready(&self) -> Result<bool> {
        let mut args = ffi::PJRT_Event_IsReady_Args::new();
        args.event = self.raw;
        // SAFETY: `raw` is a live event owned by `self`.
        unsafe { pjrt_call!(self.plugin.api(), PJRT_Event_IsReady, &mut args) }?;
        Ok(args.is_ready)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let mut args = ffi::PJRT_Event_Destroy_Args::new();
        args.event = self.raw;
        // SAFETY: `raw` is live, owned by `self`, and not used after this call.
        let result = unsafe { pjrt_call!(self.plugin.api(), PJRT_Event_Destroy, &mut args) };
        warn_in_drop("PJRT_Event_Destroy", result);
    }
}
