//! A typed graph builder that prints StableHLO text.
