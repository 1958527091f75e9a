//! Finding a PJRT plugin on disk.
//!
//! The search order is fixed and every place looked at is recorded, so that "no plugin found"
//! can say exactly where it looked and what was there: the `TLALOC_PJRT_PLUGIN_PATH` variable,
//! the project-local cache that `tlaloc plugin install` fills, the `site-packages` of the active
//! virtual environment, of common project venvs and of the `python3` on `PATH`, and finally the
//! system location of libtpu. Nothing here is specific to one machine: every place is derived
//! from the environment or the working directory.

use std::fmt;
use std::path::{Path, PathBuf};

/// Environment variable naming a plugin `.so` that overrides every other location.
pub const PLUGIN_PATH_ENV: &str = "TLALOC_PJRT_PLUGIN_PATH";
/// Environment variable naming the project-local state directory (default `./.tlaloc`).
pub const HOME_ENV: &str = "TLALOC_HOME";

/// The device family a plugin drives, as told by where it was found and what it is called.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PluginKind {
    /// XLA's CPU plugin.
    Cpu,
    /// XLA's CUDA (NVIDIA GPU) plugin.
    Cuda,
    /// XLA's ROCm (AMD GPU) plugin.
    Rocm,
    /// Google's libtpu.
    Tpu,
    /// A plugin named explicitly whose family the name does not tell.
    Unknown,
}

impl PluginKind {
    /// Guesses the family from a plugin's file path (the wheels name their directories and files
    /// after the platform).
    pub fn from_path(path: &Path) -> PluginKind {
        let text = path.to_string_lossy().to_ascii_lowercase();
        if text.contains("cuda") {
            PluginKind::Cuda
        } else if text.contains("rocm") {
            PluginKind::Rocm
        } else if text.contains("tpu") {
            PluginKind::Tpu
        } else if text.contains("cpu") {
            PluginKind::Cpu
        } else {
            PluginKind::Unknown
        }
    }

    /// Whether the plugin drives a GPU (and so needs GPU client options).
    pub fn is_gpu(self) -> bool {
        matches!(self, PluginKind::Cuda | PluginKind::Rocm)
    }
}

impl fmt::Display for PluginKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PluginKind::Cpu => "cpu",
            PluginKind::Cuda => "cuda",
            PluginKind::Rocm => "rocm",
            PluginKind::Tpu => "tpu",
            PluginKind::Unknown => "unknown",
        })
    }
}

/// What the caller wants: a family, or one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PluginRequest {
    /// The best plugin found: an accelerator (CUDA, ROCm, TPU) before the CPU.
    Auto,
    /// The first plugin of this family.
    Kind(PluginKind),
    /// Exactly this file.
    Path(PathBuf),
}

impl PluginRequest {
    /// Parses the CLI spelling: `auto`, `cpu`, `cuda`, `rocm`, `tpu`, or a path.
    pub fn parse(text: &str) -> PluginRequest {
        match text {
            "auto" => PluginRequest::Auto,
            "cpu" => PluginRequest::Kind(PluginKind::Cpu),
            "cuda" | "gpu" => PluginRequest::Kind(PluginKind::Cuda),
            "rocm" => PluginRequest::Kind(PluginKind::Rocm),
            "tpu" => PluginRequest::Kind(PluginKind::Tpu),
            path => PluginRequest::Path(PathBuf::from(path)),
        }
    }
}

impl fmt::Display for PluginRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PluginRequest::Auto => f.write_str("any plugin"),
            PluginRequest::Kind(kind) => write!(f, "a {kind} plugin"),
            PluginRequest::Path(path) => write!(f, "the plugin file {}", path.display()),
        }
    }
}

/// A plugin file found on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundPlugin {
    /// The `.so` file.
    pub path: PathBuf,
    /// Its family, as told by its path.
    pub kind: PluginKind,
}

/// One place the search looked at, and what it held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchedPlace {
    /// Where the place comes from (`$TLALOC_PJRT_PLUGIN_PATH`, `project cache`, ...).
    pub origin: String,
    /// The directory or file looked at.
    pub location: PathBuf,
    /// Plugins found there (empty when none).
    pub found: Vec<FoundPlugin>,
    /// Why nothing was found, when nothing was.
    pub note: Option<String>,
}

/// Every place searched, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SearchReport {
    /// The places, in search order.
    pub places: Vec<SearchedPlace>,
}

/// No plugin matched a request.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "found no PJRT plugin for {request}; searched:\n{report}\ninstall one with `tlaloc plugin install cpu`, or set {PLUGIN_PATH_ENV} to a plugin .so"
)]
pub struct NotFound {
    /// What was asked for.
    pub request: PluginRequest,
    /// Where the search looked.
    pub report: SearchReport,
}

impl fmt::Display for SearchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for place in &self.places {
            write!(f, "  [{}] {}: ", place.origin, place.location.display())?;
            if place.found.is_empty() {
                writeln!(f, "{}", place.note.as_deref().unwrap_or("nothing"))?;
            } else {
                let found: Vec<String> = place
                    .found
                    .iter()
                    .map(|p| format!("{} ({})", p.path.display(), p.kind))
                    .collect();
                writeln!(f, "{}", found.join(", "))?;
            }
        }
        Ok(())
    }
}

impl SearchReport {
    /// Every plugin found, in search order, without repeats of the same file.
    pub fn plugins(&self) -> Vec<FoundPlugin> {
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::new();
        for place in &self.places {
            for plugin in &place.found {
                let key = plugin
                    .path
                    .canonicalize()
                    .unwrap_or_else(|_| plugin.path.clone());
                if seen.insert(key) {
                    out.push(plugin.clone());
                }
            }
        }
        out
    }
}

/// The project-local state directory: `$TLALOC_HOME`, else `.tlaloc` in the working directory.
pub fn project_home() -> PathBuf {
    match std::env::var_os(HOME_ENV) {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => PathBuf::from(".tlaloc"),
    }
}

/// The project-local plugin cache that `tlaloc plugin install` fills.
pub fn plugin_cache_dir() -> PathBuf {
    project_home().join("plugins")
}

/// Where plugin files sit inside a `site-packages` directory, as glob-like (dir, file) patterns:
/// `*` in a directory component matches any name containing the rest of the component.
const SITE_PACKAGES_LAYOUTS: &[(&[&str], &str)] = &[
    (&["jax_plugins", "*cuda"], "xla_cuda_plugin.so"),
    (&["jax_plugins", "*rocm"], "xla_rocm_plugin.so"),
    (&["xla_plugins", "xla_cpu_pjrt"], "*.so"),
    (&["lammps_jax_pjrt_cpu"], "*.so"),
    (&["libtpu"], "libtpu.so"),
];

/// Looks at every place in order and reports what each held.
pub fn search() -> SearchReport {
    let mut places = Vec::new();

    if let Some(path) = std::env::var_os(PLUGIN_PATH_ENV).filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        places.push(file_place(format!("${PLUGIN_PATH_ENV}"), &path));
    }

    let cache = plugin_cache_dir();
    places.push(cache_place(&cache));

    for (origin, dir) in site_packages_dirs() {
        places.push(site_packages_place(origin, &dir));
    }

    places.push(file_place(
        "system libtpu".into(),
        Path::new("/lib/libtpu.so"),
    ));
    SearchReport { places }
}

/// Finds the plugin a request names.
pub fn find(request: &PluginRequest) -> Result<FoundPlugin, NotFound> {
    if let PluginRequest::Path(path) = request {
        let place = file_place("given path".into(), path);
        return place.found.first().cloned().ok_or_else(|| NotFound {
            request: request.clone(),
            report: SearchReport {
                places: vec![place],
            },
        });
    }
    search().choose(request)
}

impl SearchReport {
    /// The plugin this report offers for a family request (`Auto` or `Kind`); a `Path` request
    /// is answered by [`find`] without searching.
    pub fn choose(self, request: &PluginRequest) -> Result<FoundPlugin, NotFound> {
        // An explicit environment override wins over everything, whatever the request.
        if let Some(first) = self.places.first()
            && first.origin.starts_with('$')
            && let Some(plugin) = first.found.first()
        {
            return Ok(plugin.clone());
        }
        let plugins = self.plugins();
        let chosen = match request {
            PluginRequest::Auto => plugins
                .iter()
                .find(|p| {
                    matches!(
                        p.kind,
                        PluginKind::Cuda | PluginKind::Rocm | PluginKind::Tpu
                    )
                })
                .or_else(|| plugins.first()),
            PluginRequest::Kind(kind) => plugins.iter().find(|p| p.kind == *kind),
            PluginRequest::Path(path) => plugins.iter().find(|p| p.path == *path),
        };
        chosen.cloned().ok_or_else(|| NotFound {
            request: request.clone(),
            report: self,
        })
    }
}

fn file_place(origin: String, path: &Path) -> SearchedPlace {
    let (found, note) = if path.is_file() {
        (
            vec![FoundPlugin {
                path: path.to_path_buf(),
                kind: PluginKind::from_path(path),
            }],
            None,
        )
    } else if path.exists() {
        (Vec::new(), Some("exists but is not a file".to_string()))
    } else {
        (Vec::new(), Some("does not exist".to_string()))
    };
    SearchedPlace {
        origin,
        location: path.to_path_buf(),
        found,
        note,
    }
}

fn cache_place(cache: &Path) -> SearchedPlace {
    let mut found = Vec::new();
    let note = match sorted_entries(cache) {
        Err(note) => Some(note),
        Ok(dirs) => {
            for dir in dirs.into_iter().filter(|d| d.is_dir()) {
                for file in sorted_entries(&dir).unwrap_or_default() {
                    if is_shared_object(&file) {
                        found.push(FoundPlugin {
                            kind: PluginKind::from_path(&file),
                            path: file,
                        });
                    }
                }
            }
            found.is_empty().then(|| "no plugin installed".to_string())
        }
    };
    SearchedPlace {
        origin: "project cache".into(),
        location: cache.to_path_buf(),
        found,
        note,
    }
}

fn site_packages_place(origin: String, dir: &Path) -> SearchedPlace {
    let mut found = Vec::new();
    for (dirs, file) in SITE_PACKAGES_LAYOUTS {
        let mut candidates = vec![dir.to_path_buf()];
        for component in *dirs {
            candidates = candidates
                .iter()
                .flat_map(|base| match_component(base, component))
                .collect();
        }
        for base in candidates {
            for path in match_file(&base, file) {
                found.push(FoundPlugin {
                    kind: PluginKind::from_path(&path),
                    path,
                });
            }
        }
    }
    let note = if !dir.is_dir() {
        Some("does not exist".to_string())
    } else if found.is_empty() {
        Some("no plugin package installed".to_string())
    } else {
        None
    };
    SearchedPlace {
        origin,
        location: dir.to_path_buf(),
        found,
        note,
    }
}

fn match_component(base: &Path, pattern: &str) -> Vec<PathBuf> {
    match pattern.strip_prefix('*') {
        None => {
            let path = base.join(pattern);
            if path.is_dir() { vec![path] } else { vec![] }
        }
        Some(needle) => sorted_entries(base)
            .unwrap_or_default()
            .into_iter()
            .filter(|p| {
                p.is_dir()
                    && p.file_name()
                        .is_some_and(|n| n.to_string_lossy().contains(needle))
            })
            .collect(),
    }
}

fn match_file(base: &Path, pattern: &str) -> Vec<PathBuf> {
    if pattern == "*.so" {
        sorted_entries(base)
            .unwrap_or_default()
            .into_iter()
            .filter(|p| is_shared_object(p))
            .collect()
    } else {
        let path = base.join(pattern);
        if path.is_file() { vec![path] } else { vec![] }
    }
}

fn is_shared_object(path: &Path) -> bool {
    path.is_file() && path.extension().is_some_and(|e| e == "so")
}

fn sorted_entries(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let read = std::fs::read_dir(dir).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => "does not exist".to_string(),
        _ => format!("cannot be read: {e}"),
    })?;
    let mut entries: Vec<PathBuf> = read.filter_map(|e| e.ok().map(|e| e.path())).collect();
    entries.sort();
    Ok(entries)
}

/// The `site-packages` directories worth looking in, each with where it comes from: the active
/// virtual environment, venvs in the working directory, the `python3` on `PATH`, and the user's
/// own site. Found from the file system alone (no interpreter is started).
fn site_packages_dirs() -> Vec<(String, PathBuf)> {
    let mut prefixes: Vec<(String, PathBuf)> = Vec::new();
    if let Some(venv) = std::env::var_os("VIRTUAL_ENV").filter(|v| !v.is_empty()) {
        prefixes.push(("$VIRTUAL_ENV".into(), PathBuf::from(venv)));
    }
    for name in [".venv", "venv"] {
        let dir = PathBuf::from(name);
        if dir.is_dir() {
            prefixes.push((format!("./{name}"), dir));
        }
    }
    let mut python_prefixes = Vec::new();
    if let Some(python) = which("python3") {
        // The interpreter's prefix is the parent of its `bin`; follow links (venvs link to the
        // real interpreter) and keep both the linked and the real prefix.
        for candidate in [python.clone(), python.canonicalize().unwrap_or(python)] {
            if let Some(prefix) = candidate.parent().and_then(Path::parent)
                && !python_prefixes.contains(&prefix.to_path_buf())
            {
                python_prefixes.push(prefix.to_path_buf());
                prefixes.push(("python3 on PATH".into(), prefix.to_path_buf()));
            }
        }
    }
    if let Some(home) = std::env::var_os("HOME") {
        prefixes.push(("user site".into(), PathBuf::from(home).join(".local")));
    }

    let mut dirs = Vec::new();
    for (origin, prefix) in prefixes {
        let lib = prefix.join("lib");
        let mut found_any = false;
        for entry in sorted_entries(&lib).unwrap_or_default() {
            let is_python = entry
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("python3"));
            if !is_python {
                continue;
            }
            for leaf in ["site-packages", "dist-packages"] {
                let dir = entry.join(leaf);
                if dir.is_dir() {
                    found_any = true;
                    dirs.push((origin.clone(), dir));
                }
            }
        }
        if !found_any {
            dirs.push((origin, lib.join("python3*/site-packages")));
        }
    }
    // A launcher script (pyenv's shims, for one) hides the real prefix: only the interpreter
    // knows it, so ask it, but only when the file system gave no answer.
    let python_found = dirs
        .iter()
        .any(|(origin, dir)| origin == "python3 on PATH" && dir.is_dir());
    if !python_found
        && !python_prefixes.is_empty()
        && let Some(dir) = interpreter_site_packages()
    {
        dirs.push(("python3 on PATH (asked)".into(), dir));
    }
    let mut unique = Vec::new();
    for (origin, dir) in dirs {
        if !unique.iter().any(|(_, d): &(String, PathBuf)| d == &dir) {
            unique.push((origin, dir));
        }
    }
    unique
}

fn interpreter_site_packages() -> Option<PathBuf> {
    let output = std::process::Command::new("python3")
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8(output.stdout).ok()?;
    let dir = PathBuf::from(text.trim());
    (output.status.success() && dir.is_dir()).then_some(dir)
}

fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_is_read_from_the_wheel_layout() {
        let cases = [
            (
                "site-packages/jax_plugins/xla_cuda13/xla_cuda_plugin.so",
                PluginKind::Cuda,
            ),
            (
                "site-packages/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so",
                PluginKind::Cpu,
            ),
            (
                "plugins/lammps-jax-pjrt-cpu-0.11.2/pjrt_c_api_cpu_plugin.so",
                PluginKind::Cpu,
            ),
            ("/lib/libtpu.so", PluginKind::Tpu),
            ("custom/plugin.so", PluginKind::Unknown),
        ];
        for (path, kind) in cases {
            assert_eq!(PluginKind::from_path(Path::new(path)), kind, "{path}");
        }
    }

    #[test]
    fn site_packages_layouts_are_matched() {
        let root = std::env::temp_dir().join(format!("tlaloc-discovery-{}", std::process::id()));
        let site = root.join("site-packages");
        let cuda = site.join("jax_plugins/xla_cuda13");
        let cpu = site.join("xla_plugins/xla_cpu_pjrt");
        std::fs::create_dir_all(&cuda).unwrap();
        std::fs::create_dir_all(&cpu).unwrap();
        std::fs::write(cuda.join("xla_cuda_plugin.so"), b"").unwrap();
        std::fs::write(cpu.join("xla_cpu_pjrt.so"), b"").unwrap();
        std::fs::write(cpu.join("__init__.py"), b"").unwrap();

        let place = site_packages_place("test".into(), &site);
        let kinds: Vec<PluginKind> = place.found.iter().map(|p| p.kind).collect();
        assert_eq!(kinds, vec![PluginKind::Cuda, PluginKind::Cpu]);

        let missing = site_packages_place("test".into(), &root.join("nope"));
        assert!(missing.found.is_empty());
        assert_eq!(missing.note.as_deref(), Some("does not exist"));
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn not_found_lists_every_place() {
        let err = find(&PluginRequest::Path(PathBuf::from("/nonexistent/x.so"))).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("/nonexistent/x.so"), "{text}");
        assert!(text.contains("does not exist"), "{text}");
        assert!(text.contains("tlaloc plugin install cpu"), "{text}");
    }
}
