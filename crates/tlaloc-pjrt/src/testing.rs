//! The shared test-plugin convention (behind the `testing` feature), for this crate's tests and
//! other crates' tests.
//!
//! `TLALOC_TEST_PLUGINS` is a ':'-separated list of plugin `.so` paths; when unset, every `*.so`
//! under `<workspace>/.tlaloc/plugins/*/`. Finding none is a test failure (a panic naming the
//! command that installs one), never a silent skip.

use std::path::{Path, PathBuf};

use crate::{Client, ClientOptions, Plugin};

/// Environment variable listing the plugins tests run on.
pub const TEST_PLUGINS_ENV: &str = "TLALOC_TEST_PLUGINS";

/// The workspace root this crate was built in.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("..")
}

/// The plugins tests must run on. Panics (failing the test) when there are none.
pub fn test_plugin_paths() -> Vec<PathBuf> {
    let paths: Vec<PathBuf> = match std::env::var_os(TEST_PLUGINS_ENV) {
        Some(list) => std::env::split_paths(&list)
            .filter(|p| !p.as_os_str().is_empty())
            .collect(),
        None => {
            let cache = workspace_root().join(".tlaloc").join("plugins");
            let mut found = Vec::new();
            for dir in std::fs::read_dir(&cache).into_iter().flatten().flatten() {
                for file in std::fs::read_dir(dir.path())
                    .into_iter()
                    .flatten()
                    .flatten()
                {
                    let path = file.path();
                    if path.extension().is_some_and(|ext| ext == "so") {
                        found.push(path);
                    }
                }
            }
            found.sort();
            found
        }
    };
    assert!(
        !paths.is_empty(),
        "no PJRT plugin to test with: set {TEST_PLUGINS_ENV} or run `tlaloc plugin install cpu` \
         (it fills <workspace>/.tlaloc/plugins/)"
    );
    for path in &paths {
        assert!(
            path.is_file(),
            "test plugin {} does not exist; fix {TEST_PLUGINS_ENV} or run `tlaloc plugin install cpu`",
            path.display()
        );
    }
    paths
}

/// A client of the plugin at `path`, with GPU options when the path mentions cuda, gpu or rocm.
/// Panics (failing the test) when the plugin cannot be loaded or the client created.
pub fn client_for(path: &Path) -> Client {
    let plugin = Plugin::load(path).unwrap_or_else(|e| panic!("loading {}: {e}", path.display()));
    let options = ClientOptions::for_platform_hint(&path.to_string_lossy());
    Client::new(&plugin, options)
        .unwrap_or_else(|e| panic!("creating a client of {}: {e}", path.display()))
}

/// A client of the plugin at `path` for work across `count` devices: a CPU plugin is asked for
/// `count` devices (`cpu_device_count`), a GPU plugin (path mentions cuda, gpu or rocm) gets its
/// usual GPU options and whatever devices it has. Panics when the plugin cannot be loaded;
/// returns the plugin's refusal, or a client that has fewer than `count` devices, as an error
/// for the test to report.
pub fn client_with_devices(path: &Path, count: u32) -> Result<Client, String> {
    let plugin = Plugin::load(path).unwrap_or_else(|e| panic!("loading {}: {e}", path.display()));
    let options = match ClientOptions::for_platform_hint(&path.to_string_lossy()) {
        options if options == ClientOptions::cpu() => ClientOptions::cpu_with_devices(count),
        options => options,
    };
    let client = Client::new(&plugin, options.clone())
        .map_err(|e| format!("creating a client with {options:?}: {e}"))?;
    let found = client
        .addressable_devices()
        .map_err(|e| format!("listing the devices of a client with {options:?}: {e}"))?
        .len();
    if found < count as usize {
        return Err(format!(
            "a client created with {options:?} has {found} addressable devices, {count} are needed"
        ));
    }
    Ok(client)
}

/// `(plugin path, client)` for every test plugin.
pub fn test_clients() -> Vec<(PathBuf, Client)> {
    test_plugin_paths()
        .into_iter()
        .map(|path| {
            let client = client_for(&path);
            (path, client)
        })
        .collect()
}
