//! The persistent compile cache: serialized executables on disk, keyed by everything that can
//! change the compiled code.
//!
//! Key = sha256 over the plugin's PJRT API version, its platform name and version, the plugin
//! file (path and size: two builds can share an API and platform version), the device kind,
//! the compiler flags XLA reads from the environment (`XLA_FLAGS`), the body's sha256 and the
//! compile-option bytes. Value = `LoadedExecutable::serialize()` in `<dir>/<key>.bin` behind a
//! header naming the key and the payload's sha256, written to a temporary name and renamed, so
//! a reader never sees half a file. A file whose header names another key (a file swapped in
//! from another entry or plugin) or whose payload does not hash to its header is a miss, and is
//! rewritten; so is a file that fails to load.
//!
//! The same identity, with the plugin file named by its sha256 instead of its path (paths differ
//! between machines) and the compile options added, is what executables shipped in an artifact
//! are recorded under ([`CacheIdentity::compiler_identity`]).
//!
//! What the cache trusts: whoever can write its directory. The header binds a file to its
//! key, so files cannot be swapped between entries, bodies or plugin builds by renaming, but a
//! writer who forges a header chooses the code that runs, as a writer of the plugin file
//! would. Keep the cache directory as private as the plugin.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use sha2::{Digest, Sha256};
use tlaloc_artifact::CompilerIdentity;

/// What identifies the plugin build and device an executable was compiled for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheIdentity {
    /// PJRT API (major, minor).
    pub api_version: (u32, u32),
    /// `PJRT_Client_PlatformName`.
    pub platform_name: String,
    /// `PJRT_Client_PlatformVersion`.
    pub platform_version: String,
    /// The plugin file, as `<canonical path>:<size in bytes>`.
    pub plugin_file: String,
    /// The device kind (e.g. `cpu`, `NVIDIA H200`).
    pub device_kind: String,
    /// Compiler flags from the environment ([`CacheIdentity::compiler_flags_from_env`]).
    pub compiler_flags: String,
}

impl CacheIdentity {
    /// The flags XLA plugins read from the environment when they compile.
    pub fn compiler_flags_from_env() -> String {
        std::env::var("XLA_FLAGS").unwrap_or_default()
    }

    /// `<canonical path>:<size>` of a plugin file (the path as given when it cannot be read).
    pub fn plugin_file_of(path: &Path) -> String {
        let canonical = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
        let size = std::fs::metadata(&canonical).map(|m| m.len()).unwrap_or(0);
        format!("{}:{size}", canonical.display())
    }

    /// The identity an artifact records executables under: this one with the plugin file at
    /// `plugin` named by its name, length and sha256, and the compile options' bytes. With a
    /// compile cache, the plugin's hash is remembered there (see [`PLUGIN_HASHES_DIR`]).
    pub fn compiler_identity(
        &self,
        plugin: &Path,
        compile_options: &[u8],
        cache: Option<&CompileCache>,
    ) -> std::io::Result<CompilerIdentity> {
        let (plugin_byte_length, plugin_sha256) = plugin_file_hash(plugin, cache)?;
        let (major, minor) = self.api_version;
        Ok(CompilerIdentity {
            platform_name: self.platform_name.clone(),
            device_kind: self.device_kind.clone(),
            pjrt_api_version: format!("{major}.{minor}"),
            platform_version: self.platform_version.clone(),
            plugin_file_name: plugin
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            plugin_byte_length,
            plugin_sha256,
            xla_flags: self.compiler_flags.clone(),
            compile_options: hex::encode(compile_options),
        })
    }
}

/// Subdirectory of the compile cache remembering plugin hashes: one file per (canonical path,
/// length, modification time, inode) of a plugin, holding its sha256. Hashing a plugin of
/// hundreds of megabytes costs a large part of a start that deserializes every entry; a
/// reinstalled plugin is a new file (new inode or time) and is hashed again. Trusted as the
/// cache is: whoever can write it can already choose the code that runs.
pub const PLUGIN_HASHES_DIR: &str = "plugin-sha256";

/// `(length, sha256)` of a plugin file: remembered in this process and, with a cache, on disk.
fn plugin_file_hash(path: &Path, cache: Option<&CompileCache>) -> std::io::Result<(u64, String)> {
    static HASHED: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());
    let canonical = path.canonicalize()?;
    let meta = std::fs::metadata(&canonical)?;
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    #[cfg(unix)]
    let inode = std::os::unix::fs::MetadataExt::ino(&meta);
    #[cfg(not(unix))]
    let inode = 0u64;
    let file_key = hex::encode(Sha256::digest(format!(
        "{}\0{}\0{mtime}\0{inode}",
        canonical.display(),
        meta.len()
    )));
    let remembered = HASHED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .find(|(k, _)| *k == file_key)
        .map(|(_, hash)| hash.clone());
    let on_disk = cache.map(|c| c.dir().join(PLUGIN_HASHES_DIR).join(&file_key));
    let read_back = || {
        let text = std::fs::read_to_string(on_disk.as_ref()?).ok()?;
        let hash = text.trim();
        tlaloc_artifact::paths::check_sha256(hash).ok()?;
        Some(hash.to_owned())
    };
    if let Some(hash) = remembered.or_else(read_back) {
        return Ok((meta.len(), hash));
    }
    let mut hasher = Sha256::new();
    let len = std::io::copy(&mut std::fs::File::open(&canonical)?, &mut hasher)?;
    let hash = hex::encode(hasher.finalize());
    HASHED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push((file_key, hash.clone()));
    if let Some(file) = on_disk {
        let write = || -> std::io::Result<()> {
            let dir = file.parent().expect("inside the cache");
            std::fs::create_dir_all(dir)?;
            let tmp = file.with_extension(format!("tmp.{}", std::process::id()));
            std::fs::write(&tmp, format!("{hash}\n"))?;
            std::fs::rename(&tmp, &file)
        };
        if let Err(e) = write() {
            tracing::warn!(file = %file.display(), error = %e, "could not remember the plugin's hash");
        }
    }
    Ok((len, hash))
}

/// A cache directory.
#[derive(Debug, Clone)]
pub struct CompileCache {
    dir: PathBuf,
}

impl CompileCache {
    /// The cache in `dir` (created on first write).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// The default directory: `$TLALOC_HOME/compile-cache`.
    pub fn default_dir() -> PathBuf {
        tlaloc_pjrt::discovery::project_home().join("compile-cache")
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The key of one body compiled with `options` for `identity`.
    pub fn key(identity: &CacheIdentity, body_sha256: &str, options: &[u8]) -> String {
        let mut h = Sha256::new();
        let (major, minor) = identity.api_version;
        for part in [
            format!("pjrt-api {major}.{minor}").as_bytes(),
            identity.platform_name.as_bytes(),
            identity.platform_version.as_bytes(),
            identity.plugin_file.as_bytes(),
            identity.device_kind.as_bytes(),
            identity.compiler_flags.as_bytes(),
            body_sha256.as_bytes(),
            options,
        ] {
            // Length-prefixed, so that no two different part lists hash the same bytes.
            h.update((part.len() as u64).to_le_bytes());
            h.update(part);
        }
        hex::encode(h.finalize())
    }

    fn path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.bin"))
    }

    /// The stored bytes for `key`, if any and if they are bound to `key`.
    pub fn get(&self, key: &str) -> Option<Vec<u8>> {
        let path = self.path(key);
        let file = std::fs::read(&path).ok()?;
        match unwrap_entry(&file, key) {
            Ok(payload) => Some(payload.to_vec()),
            Err(why) => {
                tracing::warn!(file = %path.display(), why, "compile cache file refused; recompiling");
                None
            }
        }
    }

    /// Stores `bytes` under `key`; failures are logged, not fatal (the cache is an optimisation).
    pub fn put(&self, key: &str, bytes: &[u8]) {
        let write = || -> std::io::Result<()> {
            std::fs::create_dir_all(&self.dir)?;
            let tmp = self.dir.join(format!("{key}.tmp.{}", std::process::id()));
            std::fs::write(&tmp, wrap_entry(key, bytes))?;
            std::fs::rename(&tmp, self.path(key))
        };
        if let Err(e) = write() {
            tracing::warn!(dir = %self.dir.display(), error = %e, "could not write the compile cache");
        }
    }
}

/// The first line of every cache file.
const MAGIC: &str = "tlaloc-compile-cache 1";

/// `MAGIC\n<key>\n<sha256 of payload>\n<payload>`.
fn wrap_entry(key: &str, payload: &[u8]) -> Vec<u8> {
    let header = format!("{MAGIC}\n{key}\n{}\n", hex::encode(Sha256::digest(payload)));
    let mut out = Vec::with_capacity(header.len() + payload.len());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(payload);
    out
}

/// The payload of a cache file written for `key`, or why it is refused.
fn unwrap_entry<'a>(file: &'a [u8], key: &str) -> Result<&'a [u8], &'static str> {
    let mut rest = file;
    let mut line = || -> Result<&'a [u8], &'static str> {
        let end = rest.iter().position(|&b| b == b'\n').ok_or("no header")?;
        let (head, tail) = rest.split_at(end);
        rest = &tail[1..];
        Ok(head)
    };
    if line()? != MAGIC.as_bytes() {
        return Err("not a compile cache file of this format");
    }
    if line()? != key.as_bytes() {
        return Err("written for another key (swapped in from another entry or plugin)");
    }
    let digest = line()?;
    let payload = rest;
    if digest != hex::encode(Sha256::digest(payload)).as_bytes() {
        return Err("the payload does not match its hash (truncated or altered)");
    }
    Ok(payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity() -> CacheIdentity {
        CacheIdentity {
            api_version: (0, 81),
            platform_name: "cpu".into(),
            platform_version: "1".into(),
            plugin_file: "/plugins/a.so:10".into(),
            device_kind: "cpu".into(),
            compiler_flags: String::new(),
        }
    }

    #[test]
    fn every_part_of_the_identity_changes_the_key() {
        let base = CompileCache::key(&identity(), "abc", b"opts");
        let variants = [
            CompileCache::key(
                &CacheIdentity {
                    api_version: (0, 115),
                    ..identity()
                },
                "abc",
                b"opts",
            ),
            CompileCache::key(
                &CacheIdentity {
                    platform_name: "cuda".into(),
                    ..identity()
                },
                "abc",
                b"opts",
            ),
            CompileCache::key(
                &CacheIdentity {
                    platform_version: "2".into(),
                    ..identity()
                },
                "abc",
                b"opts",
            ),
            CompileCache::key(
                &CacheIdentity {
                    device_kind: "NVIDIA H200".into(),
                    ..identity()
                },
                "abc",
                b"opts",
            ),
            CompileCache::key(
                &CacheIdentity {
                    plugin_file: "/plugins/a.so:11".into(),
                    ..identity()
                },
                "abc",
                b"opts",
            ),
            CompileCache::key(
                &CacheIdentity {
                    compiler_flags: "--xla_gpu_enable_triton_gemm=false".into(),
                    ..identity()
                },
                "abc",
                b"opts",
            ),
            CompileCache::key(&identity(), "abd", b"opts"),
            CompileCache::key(&identity(), "abc", b"opt"),
            // Moving a byte between parts must not collide.
            CompileCache::key(&identity(), "abco", b"pts"),
        ];
        for v in variants {
            assert_ne!(v, base);
        }
        assert_eq!(base, CompileCache::key(&identity(), "abc", b"opts"));
        assert_eq!(base.len(), 64);
    }

    #[test]
    fn a_plugin_hash_is_remembered_in_the_cache_and_redone_for_a_new_file() {
        let dir = tempfile::tempdir().unwrap();
        let plugin = dir.path().join("plugin.so");
        let cache = CompileCache::new(dir.path().join("cache"));
        std::fs::write(&plugin, b"build one").unwrap();
        let first = plugin_file_hash(&plugin, Some(&cache)).unwrap();
        assert_eq!(first, (9, hex::encode(Sha256::digest(b"build one"))));
        let remembered: Vec<_> = std::fs::read_dir(cache.dir().join(PLUGIN_HASHES_DIR))
            .unwrap()
            .collect();
        assert_eq!(remembered.len(), 1);
        // A reinstalled plugin is another file: hashed again, not taken from the memo.
        std::fs::remove_file(&plugin).unwrap();
        std::fs::write(&plugin, b"build two!").unwrap();
        let second = plugin_file_hash(&plugin, Some(&cache)).unwrap();
        assert_eq!(second, (10, hex::encode(Sha256::digest(b"build two!"))));
    }

    #[test]
    fn put_then_get_round_trips() {
        let dir = std::env::temp_dir().join(format!("tlaloc-cache-test-{}", std::process::id()));
        let cache = CompileCache::new(&dir);
        assert_eq!(cache.get("k"), None);
        cache.put("k", b"bytes");
        assert_eq!(cache.get("k").as_deref(), Some(&b"bytes"[..]));
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// Regression: the cache was keyed by file name only, so a file copied over another
    /// entry's ran as that entry.
    #[test]
    fn a_cache_file_swapped_in_from_another_entry_is_refused() {
        let dir = std::env::temp_dir().join(format!("tlaloc-cache-swap-{}", std::process::id()));
        let cache = CompileCache::new(&dir);
        cache.put("a", b"code of a");
        cache.put("b", b"code of b");
        std::fs::copy(dir.join("a.bin"), dir.join("b.bin")).unwrap();
        assert_eq!(cache.get("b"), None);
        assert_eq!(cache.get("a").as_deref(), Some(&b"code of a"[..]));
        // A truncated or altered payload, and a file of no header, are misses too.
        let whole = std::fs::read(dir.join("a.bin")).unwrap();
        std::fs::write(dir.join("a.bin"), &whole[..whole.len() - 1]).unwrap();
        assert_eq!(cache.get("a"), None);
        std::fs::write(dir.join("a.bin"), b"raw executable bytes").unwrap();
        assert_eq!(cache.get("a"), None);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
