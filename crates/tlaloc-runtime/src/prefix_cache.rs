//! Automatic prefix caching: what names a full block of K/V, and the counts that say how often
//! a prompt found its prefix cached.
//!
//! A block's K/V depends on every token before it and on the model that computed it, so a
//! block is named by a chained hash: block `i`'s hash covers the hash of block `i - 1` and its
//! own tokens, and the chain starts at a root that covers the model's identity (the artifact's
//! manifest: weights, dtype, programs). Two sequences whose blocks `0..=i` have equal hashes
//! thus have equal K/V there, and share the pages ([`crate::block_manager`] owns the pages and
//! the map from hash to page; [`crate::scheduler`] decides when to look up and register).
//!
//! The hash is SHA-256 (truncated to 128 bits): a collision would silently serve another
//! prompt's K/V, so a fast non-cryptographic hash is not enough, and hashing 4 bytes per token
//! once per block is negligible next to a step.

use sha2::{Digest, Sha256};

/// The name of one full block of K/V: its tokens, every token before them, and the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash([u8; 16]);

impl BlockHash {
    /// The start of every chain for the model identified by `identity` (any bytes that change
    /// when the K/V a token gets would: the artifact's manifest).
    pub fn root(identity: &[u8]) -> BlockHash {
        let mut h = Sha256::new();
        h.update(b"tlaloc prefix root\0");
        h.update(identity);
        BlockHash::from_digest(h)
    }

    /// The hash of the block of `tokens` that follows the block named `self`.
    pub fn chain(&self, tokens: &[u32]) -> BlockHash {
        let mut h = Sha256::new();
        h.update(self.0);
        for token in tokens {
            h.update(token.to_le_bytes());
        }
        BlockHash::from_digest(h)
    }

    fn from_digest(h: Sha256) -> BlockHash {
        let digest = h.finalize();
        let mut out = [0u8; 16];
        out.copy_from_slice(&digest[..16]);
        BlockHash(out)
    }
}

/// Extends `hashes` (the chained hashes of the first full blocks of `tokens`, from `root`) to
/// every full block of `tokens`.
pub fn extend_hashes(
    root: &BlockHash,
    hashes: &mut Vec<BlockHash>,
    tokens: &[u32],
    block_size: usize,
) {
    let full = tokens.len() / block_size;
    for i in hashes.len()..full {
        let parent = if i == 0 { *root } else { hashes[i - 1] };
        hashes.push(parent.chain(&tokens[i * block_size..(i + 1) * block_size]));
    }
}

/// How often prompts found their prefix cached (cumulative).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixCacheStats {
    /// Lookups: one per sequence about to be prefilled from its start.
    pub queries: u64,
    /// Lookups that found at least one block.
    pub hits: u64,
    /// Tokens those lookups asked about (the sequences' lengths).
    pub query_tokens: u64,
    /// Tokens whose K/V was found cached (not prefilled).
    pub hit_tokens: u64,
    /// Cached blocks evicted to make room.
    pub evictions: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_hash_covers_the_model_and_every_earlier_token() {
        let a = BlockHash::root(b"model a");
        let b = BlockHash::root(b"model b");
        assert_ne!(
            a.chain(&[1, 2]),
            b.chain(&[1, 2]),
            "the model is in the hash"
        );
        assert_eq!(a.chain(&[1, 2]), a.chain(&[1, 2]));
        assert_ne!(a.chain(&[1, 2]), a.chain(&[2, 1]), "order counts");
        let mut x = Vec::new();
        extend_hashes(&a, &mut x, &[1, 2, 3, 4, 5], 2);
        let mut y = Vec::new();
        extend_hashes(&a, &mut y, &[9, 2, 3, 4], 2);
        assert_eq!(x.len(), 2, "only full blocks");
        assert_eq!(x[0], a.chain(&[1, 2]));
        assert_eq!(x[1], x[0].chain(&[3, 4]));
        assert_ne!(x[1], y[1], "same tokens after a different first block");
        // Extending is the same as hashing at once.
        let mut z = x[..1].to_vec();
        extend_hashes(&a, &mut z, &[1, 2, 3, 4, 5, 6], 2);
        assert_eq!(z[..2], x[..]);
        assert_eq!(z.len(), 3);
    }
}
