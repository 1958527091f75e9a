//! Loads an artifact onto a PJRT device and runs it: paged KV pool, block manager,
//! scheduler and sampling.
