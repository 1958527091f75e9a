//! One module per subcommand.

pub mod plugin;
