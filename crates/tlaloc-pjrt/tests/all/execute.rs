//! StableHLO programs run on every test plugin and checked against Rust reference computations.
