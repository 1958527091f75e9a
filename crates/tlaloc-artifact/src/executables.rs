//! Compiled executables shipped in the artifact: the manifest's `executables` section and the
//! one function that adds a set of them.
//!
//! An executable is only usable by the plugin build and device that made it, so the section
//! groups them by [`CompilerIdentity`] (plugin build, PJRT API version, platform, device kind,
//! compiler flags, compile options); a loader uses the set whose identity equals its own and
//! compiles everything else. Each executable is stored once under its sha256
//! (`executables/<sha256>.bin`, as bodies are) and listed per entry together with the body it
//! was compiled from, so an executable is never used for an entry whose body changed. An entry
//! with body variants may have one executable per body (the portable one and each variant the
//! plugin compiled); the loader takes the one of the body it chose.
//!
//! The section is optional and absent from an exported artifact, so an artifact without it
//! reads and writes exactly as before; a reader older than the section refuses one that has it
//! by naming the unknown field `executables`.
//!
//! Adding a set rewrites the manifest, which invalidates any signature over the old bytes:
//! [`add_executables`] removes the stale signature file and says so.

use std::collections::BTreeSet;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::ArtifactError;
use crate::loader::Artifact;
use crate::manifest::{MANIFEST_FILE, Manifest};
use crate::paths;
use crate::signature::SIGNATURE_FILE;

/// What compiled a set of executables. Two identities are the same plugin build on the same
/// device kind with the same options exactly when they are equal.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CompilerIdentity {
    /// `PJRT_Client_PlatformName`, e.g. `cpu`, `cuda`.
    pub platform_name: String,
    /// The device kind, e.g. `cpu`, `NVIDIA H200`.
    pub device_kind: String,
    /// PJRT C API version of the plugin, `major.minor`.
    pub pjrt_api_version: String,
    /// `PJRT_Client_PlatformVersion`.
    pub platform_version: String,
    /// The plugin file's name (for people; the hash is what is compared).
    pub plugin_file_name: String,
    /// The plugin file's length in bytes.
    pub plugin_byte_length: u64,
    /// sha256 of the plugin file: the plugin build.
    pub plugin_sha256: String,
    /// Compiler flags read from the environment (`XLA_FLAGS`) when compiling.
    pub xla_flags: String,
    /// The serialized `CompileOptionsProto`, lowercase hex.
    pub compile_options: String,
}

impl CompilerIdentity {
    /// A short description for logs: plugin file, build hash prefix, platform and device.
    pub fn describe(&self) -> String {
        format!(
            "{} (sha256 {}, {} {}, PJRT {}, device {})",
            self.plugin_file_name,
            self.plugin_sha256.get(..12).unwrap_or(&self.plugin_sha256),
            self.platform_name,
            self.platform_version,
            self.pjrt_api_version,
            self.device_kind
        )
    }

    /// The manifest field names in which `self` and `other` differ, in a fixed order.
    pub fn differences(&self, other: &CompilerIdentity) -> Vec<&'static str> {
        let mut out = Vec::new();
        let fields: [(&'static str, bool); 9] = [
            ("pluginSha256", self.plugin_sha256 != other.plugin_sha256),
            (
                "pluginByteLength",
                self.plugin_byte_length != other.plugin_byte_length,
            ),
            (
                "pluginFileName",
                self.plugin_file_name != other.plugin_file_name,
            ),
            (
                "pjrtApiVersion",
                self.pjrt_api_version != other.pjrt_api_version,
            ),
            ("platformName", self.platform_name != other.platform_name),
            (
                "platformVersion",
                self.platform_version != other.platform_version,
            ),
            ("deviceKind", self.device_kind != other.device_kind),
            ("xlaFlags", self.xla_flags != other.xla_flags),
            (
                "compileOptions",
                self.compile_options != other.compile_options,
            ),
        ];
        for (name, differs) in fields {
            if differs {
                out.push(name);
            }
        }
        out
    }
}

/// The executables one compiler identity made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExecutableSet {
    pub identity: CompilerIdentity,
    /// In manifest entry order.
    pub entries: Vec<ExecutableEntry>,
}

/// One entry's executable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExecutableEntry {
    /// The entry name.
    pub entry: String,
    /// The body it was compiled from: `bodies/<sha256>.mlir`, the entry's portable body or
    /// one of its variants'.
    pub body: String,
    /// `executables/<sha256>.bin`
    pub file: String,
    pub byte_length: u64,
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> ArtifactError {
    ArtifactError::InvalidManifest {
        field: field.into(),
        reason: reason.into(),
    }
}

/// The manifest checks of the section: identities distinct and well formed, every executable
/// naming a known entry and one of its bodies, each (entry, body) at most once per set, at a
/// content-addressed path.
pub(crate) fn validate(manifest: &Manifest) -> Result<(), ArtifactError> {
    let mut identities = BTreeSet::new();
    for (s, set) in manifest.executables.iter().enumerate() {
        let field = format!("executables[{s}]");
        if !identities.insert(&set.identity) {
            return Err(invalid(field, "the same identity appears twice"));
        }
        paths::check_sha256(&set.identity.plugin_sha256)
            .map_err(|reason| invalid(format!("{field}.identity.pluginSha256"), reason))?;
        let mut names = BTreeSet::new();
        for (i, e) in set.entries.iter().enumerate() {
            let field = format!("{field}.entries[{i}] ({})", e.entry);
            let entry = manifest
                .entry(&e.entry)
                .ok_or_else(|| invalid(&field, "names no entry of the manifest"))?;
            if !names.insert((e.entry.as_str(), e.body.as_str())) {
                return Err(invalid(field, "entry and body appear twice in one set"));
            }
            if !entry.bodies().any(|body| body == e.body) {
                let bodies: Vec<&str> = entry.bodies().collect();
                return Err(invalid(
                    format!("{field}.body"),
                    format!(
                        "{:?} is not a body of the entry ({}); compile the artifact again",
                        e.body,
                        bodies.join(", ")
                    ),
                ));
            }
            paths::executable_hash(&e.file)
                .map_err(|reason| invalid(format!("{field}.file"), reason))?;
        }
    }
    Ok(())
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> ArtifactError + '_ {
    move |source| ArtifactError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Writes `bytes` to `path` through a temporary name in the same directory, so a reader never
/// sees half a file.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), ArtifactError> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.tmp.{}", std::process::id()));
    std::fs::write(&tmp, bytes).map_err(io_error(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io_error(path))
}

/// What [`add_executables`] did.
#[derive(Debug)]
pub struct AddedExecutables {
    /// The artifact, reopened.
    pub artifact: Artifact,
    /// Distinct executable files of the new set.
    pub files: usize,
    /// Their bytes.
    pub bytes: u64,
    /// Whether a set of the same identity was replaced.
    pub replaced: bool,
    /// Whether a signature of the old manifest was removed.
    pub removed_signature: bool,
}

/// Adds (or replaces) the set of executables made by `identity`: writes each executable under
/// its sha256, rewrites the manifest with the set (sets sorted by identity, entries in manifest
/// order, so the same inputs give the same bytes), removes executable files no set names any
/// more and the signature of the old manifest, and reopens the artifact.
///
/// `executables` lists `(entry name, body, serialized executable)`: every entry of the
/// manifest must have at least one, each body one of the entry's.
pub fn add_executables(
    artifact: &Artifact,
    identity: CompilerIdentity,
    executables: &[(String, String, Vec<u8>)],
) -> Result<AddedExecutables, ArtifactError> {
    let root = artifact.root();
    let mut manifest = artifact.manifest().clone();
    let mut entries = Vec::with_capacity(manifest.entries.len());
    let mut written = BTreeSet::new();
    let mut bytes_total = 0;
    let dir = root.join(paths::EXECUTABLES_DIR);
    std::fs::create_dir_all(&dir).map_err(io_error(&dir))?;
    for entry in &manifest.entries {
        // In the order of the entry's bodies, so the same executables give the same manifest.
        let mut any = false;
        for body in entry.bodies() {
            let Some((_, _, bytes)) = executables
                .iter()
                .find(|(name, b, _)| *name == entry.name && b == body)
            else {
                continue;
            };
            any = true;
            let file = paths::executable_path(&paths::sha256_hex(bytes));
            if written.insert(file.clone()) {
                write_atomically(&root.join(&file), bytes)?;
                bytes_total += bytes.len() as u64;
            }
            entries.push(ExecutableEntry {
                entry: entry.name.clone(),
                body: body.to_owned(),
                file,
                byte_length: bytes.len() as u64,
            });
        }
        if !any {
            return Err(invalid(
                "executables",
                format!("no executable given for entry {}", entry.name),
            ));
        }
    }
    if let Some((name, body, _)) = executables.iter().find(|(name, body, _)| {
        manifest
            .entry(name)
            .is_some_and(|e| !e.bodies().any(|b| b == body))
    }) {
        return Err(invalid(
            "executables",
            format!(
                "an executable was given for {name:?} with {body:?}, which is not one of its bodies"
            ),
        ));
    }
    if let Some((name, _, _)) = executables
        .iter()
        .find(|(name, _, _)| manifest.entry(name).is_none())
    {
        return Err(invalid(
            "executables",
            format!("an executable was given for {name:?}, which is not an entry"),
        ));
    }
    let before = manifest.executables.len();
    manifest.executables.retain(|set| set.identity != identity);
    let replaced = manifest.executables.len() != before;
    manifest
        .executables
        .push(ExecutableSet { identity, entries });
    manifest
        .executables
        .sort_by(|a, b| a.identity.cmp(&b.identity));
    manifest.validate()?;

    let manifest_bytes = manifest
        .to_json_bytes()
        .map_err(|source| ArtifactError::Json {
            path: MANIFEST_FILE.to_owned(),
            source,
        })?;
    let signature = root.join(SIGNATURE_FILE);
    let removed_signature = signature.is_file();
    if removed_signature {
        std::fs::remove_file(&signature).map_err(io_error(&signature))?;
    }
    write_atomically(&root.join(MANIFEST_FILE), &manifest_bytes)?;

    // Executables of replaced sets that no set names any more.
    let named: BTreeSet<&str> = manifest
        .executables
        .iter()
        .flat_map(|set| set.entries.iter().map(|e| e.file.as_str()))
        .collect();
    for file in std::fs::read_dir(&dir).map_err(io_error(&dir))?.flatten() {
        let relative = format!(
            "{}/{}",
            paths::EXECUTABLES_DIR,
            file.file_name().to_string_lossy()
        );
        if paths::executable_hash(&relative).is_ok() && !named.contains(relative.as_str()) {
            std::fs::remove_file(file.path()).map_err(io_error(&file.path()))?;
        }
    }
    Ok(AddedExecutables {
        artifact: Artifact::open(root)?,
        files: written.len(),
        bytes: bytes_total,
        replaced,
        removed_signature,
    })
}
