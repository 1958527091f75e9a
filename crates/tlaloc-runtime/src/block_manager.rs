//! The page pool of the paged K/V cache: which pages are free, which are held.
//!
//! The pool has `numBlocks` pages of `blockSize` tokens each. Page 0 is the scratch page that
//! padded rows write into (their block tables are all 0), so it is never handed out. Free pages
//! sit on a stack, so allocating and freeing are O(1); a per-page "held" flag lets debug builds
//! assert that no page is freed twice and that page 0 is never handed out.
//!
//! Design: the block manager hands out plain page numbers and each sequence keeps its own page
//! list (its block table), instead of allocation handles that free themselves on drop. The one
//! thread that owns the scheduler also owns this pool, so a handle would need a shared back
//! reference (`Rc<RefCell<…>>`) only to call `free` from `Drop`; explicit tables keep ownership
//! flat, the table is what the step's `blockTables` input copies anyway, and a leaked page cannot
//! hide: `used()` is checked to be 0 after every test.

use thiserror::Error;

/// A page number in the K/V pools (`0 < page < numBlocks`).
pub type PageId = u32;

/// The pool's shape was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum BlockPoolError {
    /// A pool needs at least the scratch page plus one page to allocate.
    #[error(
        "a K/V pool of {num_blocks} blocks is too small: need at least 2 (page 0 is the reserved scratch page)"
    )]
    TooFewBlocks { num_blocks: usize },
    /// Pages hold at least one token.
    #[error("block size 0 refused; a block holds at least 1 token")]
    ZeroBlockSize,
    /// Page numbers are passed to programs as i32.
    #[error(
        "a K/V pool of {num_blocks} blocks cannot be addressed with i32 slot numbers at block size {block_size}"
    )]
    TooManyBlocks {
        num_blocks: usize,
        block_size: usize,
    },
}

/// Free-list allocator of K/V pages; page 0 is reserved.
#[derive(Debug, Clone)]
pub struct BlockManager {
    block_size: usize,
    num_blocks: usize,
    free: Vec<PageId>,
    held: Vec<bool>,
}

impl BlockManager {
    /// A pool of `num_blocks` pages (page 0 included) of `block_size` tokens.
    pub fn new(num_blocks: usize, block_size: usize) -> Result<Self, BlockPoolError> {
        if num_blocks < 2 {
            return Err(BlockPoolError::TooFewBlocks { num_blocks });
        }
        if block_size == 0 {
            return Err(BlockPoolError::ZeroBlockSize);
        }
        if num_blocks
            .checked_mul(block_size)
            .is_none_or(|slots| slots > i32::MAX as usize)
        {
            return Err(BlockPoolError::TooManyBlocks {
                num_blocks,
                block_size,
            });
        }
        // Reverse order so that page 1 is handed out first (easier to read in dumps).
        let free = (1..num_blocks as PageId).rev().collect();
        Ok(Self {
            block_size,
            num_blocks,
            free,
            held: vec![false; num_blocks],
        })
    }

    /// Tokens per page.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Pages in the pool, the scratch page included (the manifest's `numBlocks`).
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Pages that can ever be allocated (all but the scratch page).
    pub fn allocatable(&self) -> usize {
        tlaloc_artifact::KvCacheLayout::allocatable_blocks_of(self.num_blocks)
    }

    /// Pages currently held by sequences.
    pub fn used(&self) -> usize {
        self.allocatable() - self.free.len()
    }

    /// Pages free to allocate.
    pub fn free_count(&self) -> usize {
        self.free.len()
    }

    /// Pages needed to hold `tokens` tokens.
    pub fn pages_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    /// Takes one free page, or `None` when the pool is exhausted.
    pub fn allocate(&mut self) -> Option<PageId> {
        let page = self.free.pop()?;
        debug_assert_ne!(page, 0, "the scratch page was on the free list");
        debug_assert!(!self.held[page as usize], "page {page} handed out twice");
        self.held[page as usize] = true;
        Some(page)
    }

    /// Grows `table` until it holds `tokens` tokens; all or nothing (on `false` the table and
    /// the pool are as they were).
    pub fn grow_to(&mut self, table: &mut Vec<PageId>, tokens: usize) -> bool {
        let needed = self.pages_for(tokens).saturating_sub(table.len());
        if needed > self.free.len() {
            return false;
        }
        for _ in 0..needed {
            let page = self.allocate().expect("free count checked above");
            table.push(page);
        }
        true
    }

    /// Returns every page of `table` to the pool and empties it.
    pub fn release(&mut self, table: &mut Vec<PageId>) {
        for page in table.drain(..) {
            debug_assert!(
                page != 0 && (page as usize) < self.num_blocks,
                "page {page} is not an allocatable page"
            );
            debug_assert!(self.held[page as usize], "page {page} freed twice");
            self.held[page as usize] = false;
            self.free.push(page);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_zero_is_never_handed_out_and_all_others_are() {
        let mut pool = BlockManager::new(5, 4).unwrap();
        assert_eq!(pool.allocatable(), 4);
        let mut got: Vec<PageId> = std::iter::from_fn(|| pool.allocate()).collect();
        got.sort_unstable();
        assert_eq!(got, vec![1, 2, 3, 4]);
        assert_eq!(pool.used(), 4);
        assert_eq!(pool.free_count(), 0);
        pool.release(&mut got);
        assert_eq!(pool.used(), 0);
    }

    #[test]
    fn grow_is_all_or_nothing_and_counts_pages_by_tokens() {
        let mut pool = BlockManager::new(4, 16).unwrap();
        let mut table = Vec::new();
        assert!(pool.grow_to(&mut table, 17));
        assert_eq!(table.len(), 2);
        assert!(
            pool.grow_to(&mut table, 32),
            "32 tokens still fit in 2 pages"
        );
        assert_eq!(table.len(), 2);
        let mut other = Vec::new();
        assert!(!pool.grow_to(&mut other, 33), "3 pages asked, 1 free");
        assert!(other.is_empty());
        assert_eq!(pool.used(), 2);
        pool.release(&mut table);
        assert!(table.is_empty());
        assert_eq!(pool.free_count(), 3);
    }

    #[test]
    fn refuses_pools_that_cannot_work() {
        assert_eq!(
            BlockManager::new(1, 16).unwrap_err(),
            BlockPoolError::TooFewBlocks { num_blocks: 1 }
        );
        assert_eq!(
            BlockManager::new(8, 0).unwrap_err(),
            BlockPoolError::ZeroBlockSize
        );
        assert!(BlockManager::new(1 << 20, 1 << 12).is_err());
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "freed twice")]
    fn double_free_is_caught_in_debug() {
        let mut pool = BlockManager::new(4, 4).unwrap();
        let page = pool.allocate().unwrap();
        pool.release(&mut vec![page]);
        pool.release(&mut vec![page]);
    }
}
