//! One module per subcommand.

pub mod bench;
pub mod compile;
pub mod export;
pub mod generate;
pub mod inspect;
pub mod plugin;
pub mod serve;
pub mod sign;
pub mod verify;
