//! One module per subcommand.

pub mod plugin;
pub mod serve;
