//! One module per subcommand.

pub mod bench;
pub mod export;
pub mod generate;
pub mod inspect;
pub mod plugin;
pub mod serve;
pub mod verify;
