//! The mirrored structs against the plugin's own C header.
