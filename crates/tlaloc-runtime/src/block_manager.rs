//! The page pool of the paged K/V cache: which pages are free, which are held and by how many
//! sequences, and which hold a cached prefix block.
//!
//! The pool has `numBlocks` pages of `blockSize` tokens each. Page 0 is the scratch page that
//! padded rows write into (their block tables are all 0), so it is never handed out.
//!
//! Pages are reference-counted: a page holding a full block of a prompt can be shared by every
//! sequence whose tokens start the same way (automatic prefix caching, keyed by the chained
//! [`BlockHash`] of [`crate::prefix_cache`]). A page's content is written once, by the sequence
//! that computed it, and only ever read after it is registered under its hash: a sequence writes
//! only past its last full cached block. A page whose last holder lets go goes back to one of
//! two places: the free stack (O(1)), or, when it holds a registered block, the evictable list
//! in least-recently-released order (a `BTreeMap` by release tick, O(log n)). Allocation takes
//! the free stack first, then evicts the least recently released cached page (forgetting its
//! hash); a page with holders is never evicted, because it is on neither list.
//!
//! Design: the block manager hands out plain page numbers and each sequence keeps its own page
//! list (its block table), instead of allocation handles that free themselves on drop. The one
//! thread that owns the scheduler also owns this pool, so a handle would need a shared back
//! reference (`Rc<RefCell<…>>`) only to call `free` from `Drop`; explicit tables keep ownership
//! flat, the table is what the step's `blockTables` input copies anyway, and a leaked page cannot
//! hide: `used()` is checked to be 0 after every test.

use std::collections::{BTreeMap, HashMap};

use thiserror::Error;

pub use crate::prefix_cache::BlockHash;
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

/// Reference-counted allocator of K/V pages with a cache of prefix blocks; page 0 is reserved.
#[derive(Debug, Clone)]
pub struct BlockManager {
    block_size: usize,
    num_blocks: usize,
    /// Pages with no holder and no cached block.
    free: Vec<PageId>,
    /// Holders of each page (sequences whose block table names it).
    refs: Vec<u32>,
    /// The cached block each page holds, if registered.
    hash_of: Vec<Option<BlockHash>>,
    /// Registered blocks: the page that holds each.
    by_hash: HashMap<BlockHash, PageId>,
    /// Cached pages with no holder, by the tick at which they were released: the first is
    /// evicted first.
    evictable: BTreeMap<u64, PageId>,
    /// Each evictable page's key in `evictable`.
    released_at: Vec<u64>,
    tick: u64,
    /// Cached pages evicted so far.
    evictions: u64,
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
            refs: vec![0; num_blocks],
            hash_of: vec![None; num_blocks],
            by_hash: HashMap::new(),
            evictable: BTreeMap::new(),
            released_at: vec![0; num_blocks],
            tick: 0,
            evictions: 0,
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

    /// Pages currently held by at least one sequence.
    pub fn used(&self) -> usize {
        self.allocatable() - self.free_count()
    }

    /// Pages free to allocate: never used, or holding a cached block nobody holds (evicted on
    /// demand).
    pub fn free_count(&self) -> usize {
        self.free.len() + self.evictable.len()
    }

    /// Pages holding a registered block, held or not.
    pub fn cached(&self) -> usize {
        self.by_hash.len()
    }

    /// Cached pages with no holder (reused on a hit, evicted on demand).
    pub fn evictable(&self) -> usize {
        self.evictable.len()
    }

    /// Cached pages evicted to make room so far.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// How many sequences hold `page`.
    pub fn holders(&self, page: PageId) -> u32 {
        self.refs[page as usize]
    }

    /// The block `page` is registered under, if any.
    pub fn hash_of(&self, page: PageId) -> Option<BlockHash> {
        self.hash_of[page as usize]
    }

    /// Pages needed to hold `tokens` tokens.
    pub fn pages_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    /// Takes one page with no cached block: a free one, else the least recently released
    /// cached page (its block forgotten); `None` when every page is held.
    pub fn allocate(&mut self) -> Option<PageId> {
        let page = match self.free.pop() {
            Some(page) => page,
            None => {
                let (_, page) = self.evictable.pop_first()?;
                let hash = self.hash_of[page as usize]
                    .take()
                    .expect("an evictable page holds a cached block");
                self.by_hash.remove(&hash);
                self.evictions += 1;
                page
            }
        };
        debug_assert_ne!(page, 0, "the scratch page was on a free list");
        debug_assert_eq!(self.refs[page as usize], 0, "page {page} handed out twice");
        self.refs[page as usize] = 1;
        Some(page)
    }

    /// Grows `table` until it holds `tokens` tokens; all or nothing (on `false` the table and
    /// the pool are as they were).
    pub fn grow_to(&mut self, table: &mut Vec<PageId>, tokens: usize) -> bool {
        let needed = self.pages_for(tokens).saturating_sub(table.len());
        if needed > self.free_count() {
            return false;
        }
        for _ in 0..needed {
            let page = self.allocate().expect("free count checked above");
            table.push(page);
        }
        true
    }

    /// Lets go of every page of `table` and empties it. A page whose last holder this was goes
    /// back to the free stack, or, holding a cached block, to the end of the eviction order.
    /// The table's last pages are released first, so that a prefix outlives its tail.
    pub fn release(&mut self, table: &mut Vec<PageId>) {
        for page in table.drain(..).rev() {
            let p = page as usize;
            debug_assert!(
                page != 0 && p < self.num_blocks,
                "page {page} is not an allocatable page"
            );
            debug_assert!(self.refs[p] > 0, "page {page} freed twice");
            self.refs[p] -= 1;
            if self.refs[p] > 0 {
                continue;
            }
            if self.hash_of[p].is_some() {
                self.tick += 1;
                self.released_at[p] = self.tick;
                self.evictable.insert(self.tick, page);
            } else {
                self.free.push(page);
            }
        }
    }

    /// The pages holding the longest run of `hashes` that is cached, in order (the pool is not
    /// changed; [`acquire`](Self::acquire) takes them).
    pub fn lookup(&self, hashes: &[BlockHash]) -> Vec<PageId> {
        hashes
            .iter()
            .map_while(|hash| self.by_hash.get(hash).copied())
            .collect()
    }

    /// Adds a holder to a cached page (from [`lookup`](Self::lookup)); a page nobody held
    /// leaves the eviction order.
    pub fn acquire(&mut self, page: PageId) {
        let p = page as usize;
        debug_assert!(
            self.hash_of[p].is_some(),
            "page {page} holds no cached block"
        );
        if self.refs[p] == 0 {
            let removed = self.evictable.remove(&self.released_at[p]);
            debug_assert_eq!(removed, Some(page), "page {page} was not evictable");
        }
        self.refs[p] += 1;
    }

    /// Registers the full block in held `page` under `hash`, so later sequences can share it;
    /// `false` (nothing changed) when the block is already cached in another page or the page
    /// already holds one.
    pub fn register(&mut self, page: PageId, hash: BlockHash) -> bool {
        let p = page as usize;
        debug_assert!(self.refs[p] > 0, "page {page} registered while not held");
        if self.hash_of[p].is_some() || self.by_hash.contains_key(&hash) {
            return false;
        }
        self.hash_of[p] = Some(hash);
        self.by_hash.insert(hash, page);
        true
    }

    /// Forgets every cached block (after a failed step the pools' contents are unknown): held
    /// pages stay held, evictable ones become free.
    pub fn forget_cached(&mut self) {
        self.by_hash.clear();
        for (_, page) in std::mem::take(&mut self.evictable) {
            self.free.push(page);
        }
        self.hash_of.iter_mut().for_each(|h| *h = None);
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

    fn hash(n: u32) -> BlockHash {
        BlockHash::root(b"unit").chain(&[n])
    }

    #[test]
    fn a_shared_page_is_freed_by_its_last_holder_and_then_kept_for_reuse() {
        let mut pool = BlockManager::new(4, 4).unwrap();
        let mut a = Vec::new();
        assert!(pool.grow_to(&mut a, 8));
        assert!(pool.register(a[0], hash(0)));
        assert!(
            !pool.register(a[1], hash(0)),
            "a block is cached in one page"
        );
        let hit = pool.lookup(&[hash(0), hash(1)]);
        assert_eq!(hit, vec![a[0]], "the run stops at the first miss");
        let mut b = hit.clone();
        pool.acquire(b[0]);
        assert_eq!(pool.holders(a[0]), 2);
        pool.release(&mut a);
        assert_eq!(pool.holders(b[0]), 1, "still held by b");
        assert_eq!((pool.used(), pool.evictable()), (1, 0));
        pool.release(&mut b);
        assert_eq!((pool.used(), pool.evictable(), pool.cached()), (0, 1, 1));
        assert_eq!(pool.free_count(), 3);
        // A hit on a page nobody holds takes it back out of the eviction order.
        let page = pool.lookup(&[hash(0)])[0];
        pool.acquire(page);
        assert_eq!((pool.used(), pool.evictable()), (1, 0));
        pool.release(&mut vec![page]);
    }

    #[test]
    fn allocation_takes_plain_free_pages_first_then_the_least_recently_released_cached() {
        let mut pool = BlockManager::new(5, 4).unwrap();
        let mut table = Vec::new();
        assert!(pool.grow_to(&mut table, 12));
        for (i, &page) in table.iter().enumerate() {
            assert!(pool.register(page, hash(i as u32)));
        }
        let pages = table.clone();
        // Released last page first: the tail of a sequence is evicted before its prefix.
        pool.release(&mut table);
        assert_eq!(pool.evictable(), 3);
        let plain = pool.allocate().unwrap();
        assert!(!pages.contains(&plain), "the never-used page goes first");
        assert_eq!(pool.allocate(), Some(pages[2]));
        assert_eq!(
            pool.hash_of(pages[2]),
            None,
            "an evicted page forgets its block"
        );
        assert_eq!(pool.lookup(&[hash(2)]), Vec::<PageId>::new());
        assert_eq!(pool.allocate(), Some(pages[1]));
        assert_eq!(pool.evictions(), 2);
        assert_eq!(pool.lookup(&[hash(0), hash(1)]), vec![pages[0]]);
        // Held pages are never evicted: with the last cached page held, nothing is left.
        pool.acquire(pages[0]);
        assert_eq!(pool.allocate(), None);
        pool.release(&mut vec![plain, pages[2], pages[1], pages[0]]);
        pool.forget_cached();
        assert_eq!(
            (pool.cached(), pool.evictable(), pool.free_count()),
            (0, 0, 4)
        );
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
