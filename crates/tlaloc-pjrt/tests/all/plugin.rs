//! Loading and its refusals, attributes, clients, devices.

use std::path::{Path, PathBuf};
use std::process::Command;

use tlaloc_pjrt::{AttributeValue, Client, ClientOptions, Error, GpuOptions, Plugin};

use crate::common::on_each_plugin;

#[test]
fn attributes_and_version_are_readable() {
    on_each_plugin(|path, _| {
        let plugin = Plugin::load(path).unwrap();
        let (major, minor) = plugin.api_version();
        assert_eq!(major, 0);
        assert!(
            minor >= 81,
            "the header mirrored here is 0.81; {} reports 0.{minor}",
            path.display()
        );
        let attributes = plugin.attributes().unwrap();
        assert!(
            !attributes.is_empty(),
            "{} reports no attributes",
            path.display()
        );
        let current = plugin
            .stablehlo_current_version()
            .expect("stablehlo_current_version");
        let minimum = plugin
            .stablehlo_minimum_version()
            .expect("stablehlo_minimum_version");
        assert_eq!(current.len(), 3);
        assert!(
            minimum <= current,
            "minimum {minimum:?} above current {current:?}"
        );
        assert!(attributes.iter().any(
            |(name, value)| name == "xla_version" && matches!(value, AttributeValue::Int64(_))
        ));
        assert_eq!(
            plugin.xla_version(),
            attributes.iter().find_map(|(n, v)| match (n.as_str(), v) {
                ("xla_version", AttributeValue::Int64(v)) => Some(*v),
                _ => None,
            })
        );
    });
}

#[test]
fn loading_twice_gives_the_same_plugin() {
    on_each_plugin(|path, _| {
        let first = Plugin::load(path).unwrap();
        let second = Plugin::load(path).unwrap();
        assert_eq!(first.path(), second.path());
        assert_eq!(first.api_version(), second.api_version());
    });
}

#[test]
fn devices_and_memory_stats() {
    on_each_plugin(|path, client| {
        let platform = client.platform_name().unwrap();
        assert!(!platform.is_empty());
        client.platform_version().unwrap();
        let devices = client.addressable_devices().unwrap();
        if path.to_string_lossy().contains("cpu") {
            assert_eq!(devices.len(), 1, "cpu_device_count = 1 was asked for");
            assert_eq!(platform, "cpu");
        }
        for device in &devices {
            assert!(!device.kind().is_empty());
            // Memory stats are optional: CPU plugins report Unimplemented, which becomes None.
            let stats = device.memory_stats().unwrap();
            eprintln!(
                "device {} ({}): memory stats {stats:?}",
                device.id(),
                device.kind()
            );
            if let Some(stats) = stats {
                assert!(stats.bytes_in_use >= 0);
            }
        }
    });
}

#[test]
fn gpu_clients_need_gpu_options() {
    on_each_plugin(|path, client| {
        let platform = client.platform_name().unwrap().to_ascii_lowercase();
        let plugin = Plugin::load(path).unwrap();
        if ["cuda", "rocm", "gpu"].iter().any(|w| platform.contains(w)) {
            match Client::new(&plugin, ClientOptions::plugin_defaults()) {
                Err(Error::GpuWithoutOptions { platform: named }) => {
                    assert_eq!(named.to_ascii_lowercase(), platform)
                }
                other => {
                    panic!("a {platform} client without GPU options must be refused, got {other:?}")
                }
            }
            // CPU options are not GPU options either (the plugin itself may reject their names).
            assert!(Client::new(&plugin, ClientOptions::cpu()).is_err());
            let options = GpuOptions {
                preallocate: false,
                memory_fraction: Some(0.5),
                allocator: None,
            };
            Client::new(&plugin, ClientOptions::gpu(options)).unwrap();
        } else {
            let client = Client::new(&plugin, ClientOptions::cpu()).unwrap();
            assert_eq!(client.platform_name().unwrap(), "cpu");
            let defaults = Client::new(&plugin, ClientOptions::plugin_defaults()).unwrap();
            assert_eq!(defaults.platform_name().unwrap(), "cpu");
        }
    });
}

#[test]
fn platform_hint_chooses_gpu_options_for_gpu_paths() {
    assert_eq!(
        ClientOptions::for_platform_hint("/x/jax_plugins/xla_cuda13/xla_cuda_plugin.so"),
        ClientOptions::gpu(GpuOptions::default())
    );
    assert_eq!(
        ClientOptions::for_platform_hint("ROCm"),
        ClientOptions::gpu(GpuOptions::default())
    );
    assert_eq!(
        ClientOptions::for_platform_hint("/x/xla_cpu_pjrt.so"),
        ClientOptions::cpu()
    );
    assert!(!GpuOptions::default().preallocate);
}

/// Builds a shared library from C source with the system compiler.
fn build_fake_plugin(name: &str, source: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tlaloc-pjrt-fake-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let c = dir.join(format!("{name}.c"));
    let so = dir.join(format!("{name}.so"));
    std::fs::write(&c, source).unwrap();
    let compiler = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let output = Command::new(&compiler)
        .args(["-shared", "-fPIC", "-o"])
        .arg(&so)
        .arg(&c)
        .output()
        .unwrap_or_else(|e| {
            panic!("running the C compiler `{compiler}` (set CC to choose another): {e}")
        });
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    so
}

/// A library whose `GetPjrtApi` returns a table that ends right after `pjrt_api_version`.
fn table_source(major: i32) -> String {
    format!(
        "#include <stddef.h>\n\
         struct version {{ size_t struct_size; void* extension_start; int major; int minor; }};\n\
         struct table {{ size_t struct_size; void* extension_start; struct version v; }};\n\
         static struct table t = {{ sizeof(struct table), 0, {{ sizeof(struct version), 0, {major}, 81 }} }};\n\
         const void* GetPjrtApi(void) {{ return &t; }}\n"
    )
}

fn expect_refusal(path: &Path) -> Error {
    let error = Plugin::load(path).expect_err("the plugin must be refused");
    assert!(
        error.to_string().contains(&path.display().to_string()),
        "the refusal must name the plugin: {error}"
    );
    error
}

#[test]
fn a_table_too_short_is_refused_by_name() {
    let path = build_fake_plugin("short", &table_source(0));
    match expect_refusal(&path) {
        Error::TableTooShort { found, needed, .. } => {
            assert_eq!(found, 40);
            assert!(needed > found);
        }
        other => panic!("expected TableTooShort, got {other:?}"),
    }
}

#[test]
fn another_major_version_is_refused_by_name() {
    let path = build_fake_plugin("major1", &table_source(1));
    assert!(matches!(
        expect_refusal(&path),
        Error::UnsupportedVersion {
            major: 1,
            minor: 81,
            ..
        }
    ));
}

#[test]
fn a_library_without_get_pjrt_api_is_refused_by_name() {
    let path = build_fake_plugin("nosymbol", "int not_pjrt(void) { return 0; }\n");
    assert!(matches!(expect_refusal(&path), Error::Load { .. }));
}

#[test]
fn a_file_that_is_not_a_library_is_refused_by_name() {
    let dir = std::env::temp_dir().join(format!("tlaloc-pjrt-fake-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("text.so");
    std::fs::write(&path, "not a shared library").unwrap();
    assert!(matches!(expect_refusal(&path), Error::Load { .. }));
    assert!(matches!(
        Plugin::load(dir.join("missing.so")),
        Err(Error::Load { .. })
    ));
}
