//! Seeded byte mutations of a corpus, for running fuzz harnesses as ordinary tests on a stable
//! toolchain: each seed as it is, then `rounds` mutants of it (bytes flipped, inserted, removed,
//! truncated, a run duplicated), from a fixed-seed generator so a failure reproduces.

use std::path::Path;

struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// A mutant of `seed`: one to four edits.
fn mutate(seed: &[u8], rng: &mut XorShift) -> Vec<u8> {
    let mut bytes = seed.to_vec();
    // Bytes JSON parsers treat specially, so edits reach their branches.
    const INTERESTING: &[u8] = b"{}[]\":,0-9eE.+\\ntfu\x00\xff";
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(bytes.len() + 1);
        match rng.below(5) {
            0 if !bytes.is_empty() => {
                let i = at.min(bytes.len() - 1);
                bytes[i] = INTERESTING[rng.below(INTERESTING.len())];
            }
            1 => bytes.insert(at, INTERESTING[rng.below(INTERESTING.len())]),
            2 if at < bytes.len() => {
                bytes.remove(at);
            }
            3 => bytes.truncate(at),
            _ if !bytes.is_empty() => {
                let start = rng.below(bytes.len());
                let end = (start + 1 + rng.below(16)).min(bytes.len());
                let run = bytes[start..end].to_vec();
                let at = at.min(bytes.len());
                bytes.splice(at..at, run);
            }
            _ => {}
        }
    }
    bytes
}

/// Runs `harness` on every file of `corpus` and on `rounds` mutants of each.
pub fn run_corpus(corpus: &Path, rounds: usize, harness: fn(&[u8])) -> usize {
    let mut seeds: Vec<_> = std::fs::read_dir(corpus)
        .unwrap_or_else(|e| panic!("{}: {e}", corpus.display()))
        .map(|e| e.unwrap().path())
        .collect();
    seeds.sort();
    assert!(!seeds.is_empty(), "{} has no seeds", corpus.display());
    let mut runs = 0;
    for (n, path) in seeds.iter().enumerate() {
        let seed = std::fs::read(path).unwrap();
        harness(&seed);
        let mut rng = XorShift(0x9e37_79b9_7f4a_7c15 ^ (n as u64 + 1));
        for _ in 0..rounds {
            harness(&mutate(&seed, &mut rng));
        }
        runs += 1 + rounds;
    }
    runs
}
