//! One module per subcommand.

pub mod export;
pub mod inspect;
pub mod plugin;
pub mod serve;
pub mod verify;
