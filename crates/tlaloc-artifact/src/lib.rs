//! The serving artifact: manifest schema, bucket ladder, padding contract, loader and
//! integrity check. Reads JSON, text and bytes; knows nothing of plugins or graphs.
