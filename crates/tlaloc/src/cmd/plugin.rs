//! `tlaloc plugin`: install CPU plugins from their PyPI wheels into the project-local cache, list
//! every place discovery looks at, and check that a plugin loads, compiles and executes.
//!
//! Installing goes through `pip download` because the plugins are published as wheels and pip
//! is what resolves a registry (mirrors, proxies, credentials) the way the user already set it
//! up; the wheel is then opened with the `zip` crate and only the files needed are kept.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::{Subcommand, ValueEnum};
use tlaloc_pjrt::discovery::{self, FoundPlugin, PluginRequest};

#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    /// Fetch a plugin wheel through pip and extract its library into the project cache.
    Install {
        /// Which platform to install a plugin for (only `cpu` is published on PyPI).
        platform: InstallPlatform,
        /// Which CPU plugin wheel: OpenXLA's `xla-cpu-pjrt` (PJRT API 0.81) or the newer XLA
        /// of jax 0.11.2 (`lammps-jax-pjrt-cpu`, PJRT API 0.115, the same XLA as the CUDA plugin).
        #[arg(long, value_enum, default_value_t = CpuWheel::XlaCpuPjrt)]
        wheel: CpuWheel,
        /// Install every known CPU plugin wheel.
        #[arg(long, conflicts_with = "wheel")]
        all: bool,
        /// Take the wheel from this directory instead of downloading it.
        #[arg(long)]
        wheel_dir: Option<PathBuf>,
        /// Replace an installed copy.
        #[arg(long)]
        force: bool,
    },
    /// Show every location searched for plugins and what is there.
    List,
    /// Load a plugin and report its ABI and StableHLO versions, then compile and run a program.
    Check {
        /// A plugin file, or `auto`, `cpu`, `cuda`, `tpu` (default `auto`).
        plugin: Option<String>,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum InstallPlatform {
    /// XLA's CPU plugin.
    Cpu,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CpuWheel {
    /// `xla-cpu-pjrt==0.0.1` (ships `pjrt_c_api.h`).
    XlaCpuPjrt,
    /// `lammps-jax-pjrt-cpu==0.11.2`.
    LammpsJaxPjrtCpu,
}

/// A wheel and the members of it worth keeping, with where each goes in the cache.
struct WheelSpec {
    distribution: &'static str,
    version: &'static str,
    members: &'static [(&'static str, &'static str)],
}

impl CpuWheel {
    const ALL: [CpuWheel; 2] = [CpuWheel::XlaCpuPjrt, CpuWheel::LammpsJaxPjrtCpu];

    fn spec(self) -> WheelSpec {
        match self {
            CpuWheel::XlaCpuPjrt => WheelSpec {
                distribution: "xla-cpu-pjrt",
                version: "0.0.1",
                members: &[
                    (
                        "xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so",
                        "xla_cpu_pjrt.so",
                    ),
                    (
                        "xla_plugins/xla_cpu_pjrt/include/pjrt_c_api.h",
                        "include/pjrt_c_api.h",
                    ),
                ],
            },
            CpuWheel::LammpsJaxPjrtCpu => WheelSpec {
                distribution: "lammps-jax-pjrt-cpu",
                version: "0.11.2",
                members: &[(
                    "lammps_jax_pjrt_cpu/pjrt_c_api_cpu_plugin.so",
                    "pjrt_c_api_cpu_plugin.so",
                )],
            },
        }
    }
}

pub fn run(command: PluginCommand) -> Result<()> {
    match command {
        PluginCommand::Install {
            platform: InstallPlatform::Cpu,
            wheel,
            all,
            wheel_dir,
            force,
        } => {
            let wheels = if all {
                CpuWheel::ALL.to_vec()
            } else {
                vec![wheel]
            };
            for wheel in wheels {
                let dir = install(&wheel.spec(), wheel_dir.as_deref(), force)?;
                println!("installed {}", dir.display());
            }
            Ok(())
        }
        PluginCommand::List => {
            let report = discovery::search();
            print!("{report}");
            match report.choose(&PluginRequest::Auto) {
                Ok(chosen) => {
                    println!(
                        "default choice: {} ({})",
                        chosen.path.display(),
                        chosen.kind
                    )
                }
                Err(_) => println!("no plugin found; install one with `tlaloc plugin install cpu`"),
            }
            Ok(())
        }
        PluginCommand::Check { plugin } => {
            let request = PluginRequest::parse(plugin.as_deref().unwrap_or("auto"));
            let found = discovery::find(&request)?;
            check(&found)
        }
    }
}

fn install(spec: &WheelSpec, wheel_dir: Option<&Path>, force: bool) -> Result<PathBuf> {
    let cache = discovery::plugin_cache_dir();
    let target = cache.join(format!("{}-{}", spec.distribution, spec.version));
    let complete = spec
        .members
        .iter()
        .all(|(_, dest)| target.join(dest).is_file());
    if complete && !force {
        println!(
            "{}=={} is already installed (use --force to replace it)",
            spec.distribution, spec.version
        );
        return Ok(target);
    }

    let download_dir;
    let search_dir = match wheel_dir {
        Some(dir) => dir.to_path_buf(),
        None => {
            download_dir = cache.join(".download");
            std::fs::create_dir_all(&download_dir)
                .with_context(|| format!("creating {}", download_dir.display()))?;
            pip_download(spec, &download_dir)?;
            download_dir.clone()
        }
    };
    let wheel = find_wheel(spec, &search_dir)?;

    let staging = cache.join(format!(".staging-{}", std::process::id()));
    if staging.exists() {
        std::fs::remove_dir_all(&staging)?;
    }
    extract(spec, &wheel, &staging)?;
    if target.exists() {
        std::fs::remove_dir_all(&target)
            .with_context(|| format!("removing the old {}", target.display()))?;
    }
    std::fs::rename(&staging, &target)
        .with_context(|| format!("moving the plugin into {}", target.display()))?;
    if wheel_dir.is_none() {
        // The wheel itself is not needed once its library is out.
        let _ = std::fs::remove_file(&wheel);
    }
    Ok(target)
}

fn pip_download(spec: &WheelSpec, dest: &Path) -> Result<()> {
    let requirement = format!("{}=={}", spec.distribution, spec.version);
    println!("downloading {requirement} through pip ...");
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_string());
    let status = Command::new(&python)
        .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:"])
        .args(["--disable-pip-version-check", "--quiet", "--dest"])
        .arg(dest)
        .arg(&requirement)
        .status()
        .with_context(|| {
            format!("starting `{python} -m pip` (set PYTHON to another interpreter)")
        })?;
    if !status.success() {
        bail!("`{python} -m pip download {requirement}` failed ({status})");
    }
    Ok(())
}

fn find_wheel(spec: &WheelSpec, dir: &Path) -> Result<PathBuf> {
    let prefix = format!("{}-{}-", spec.distribution.replace('-', "_"), spec.version);
    let mut seen = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if name.starts_with(&prefix) && name.ends_with(".whl") {
            return Ok(path);
        }
        seen.push(name);
    }
    bail!(
        "no wheel named {prefix}*.whl in {} (it holds: {})",
        dir.display(),
        if seen.is_empty() {
            "nothing".to_string()
        } else {
            seen.join(", ")
        }
    )
}

fn extract(spec: &WheelSpec, wheel: &Path, dest: &Path) -> Result<()> {
    let file =
        std::fs::File::open(wheel).with_context(|| format!("opening {}", wheel.display()))?;
    let mut archive = zip::ZipArchive::new(file)
        .with_context(|| format!("reading {} as a zip", wheel.display()))?;
    for (member, relative) in spec.members {
        let mut entry = archive
            .by_name(member)
            .with_context(|| format!("{} has no member {member}", wheel.display()))?;
        let out_path = dest.join(relative);
        if let Some(parent) = out_path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let mut bytes = Vec::with_capacity(usize::try_from(entry.size()).unwrap_or(0));
        entry.read_to_end(&mut bytes)?;
        std::fs::write(&out_path, &bytes)
            .with_context(|| format!("writing {}", out_path.display()))?;
    }
    Ok(())
}

/// A 2x2 matrix product plus a residual: small, but it goes through dot_general, element-wise
/// code, argument upload and result download.
const SMOKE_PROGRAM: &str = r#"module @smoke {
  func.func public @main(%a: tensor<2x2xf32>, %b: tensor<2x2xf32>) -> tensor<2x2xf32> {
    %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0], precision = [HIGHEST, HIGHEST] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %1 = stablehlo.add %0, %a : tensor<2x2xf32>
    return %1 : tensor<2x2xf32>
  }
}
"#;

fn attribute_text(value: &tlaloc_pjrt::AttributeValue) -> String {
    use tlaloc_pjrt::AttributeValue;
    match value {
        AttributeValue::String(text) => text.clone(),
        AttributeValue::Int64(v) => v.to_string(),
        AttributeValue::Int64List(values) => format!("{values:?}"),
        AttributeValue::Float(v) => v.to_string(),
        AttributeValue::Bool(v) => v.to_string(),
    }
}

fn check(found: &FoundPlugin) -> Result<()> {
    use tlaloc_pjrt::{Client, ClientOptions, CompileOptions, ExecuteArg, Plugin};

    println!(
        "plugin:            {} ({})",
        found.path.display(),
        found.kind
    );
    let started = Instant::now();
    let plugin =
        Plugin::load(&found.path).with_context(|| format!("loading {}", found.path.display()))?;
    let (major, minor) = plugin.api_version();
    println!("PJRT C API:        {major}.{minor}");
    for (name, value) in plugin.attributes()? {
        println!("attribute:         {name} = {}", attribute_text(&value));
    }
    let options = if found.kind.is_gpu() {
        ClientOptions::gpu(Default::default())
    } else {
        ClientOptions::cpu()
    };
    let client = Client::new(&plugin, options).context("creating a client")?;
    println!(
        "platform:          {} ({})",
        client.platform_name()?,
        client.platform_version()?
    );
    let devices = client.addressable_devices()?;
    let device = devices
        .first()
        .context("the client has no addressable device")?;
    println!("devices:           {}", devices.len());
    let compile_started = Instant::now();
    let executable = client
        .compile(SMOKE_PROGRAM, &CompileOptions::default())
        .context("compiling the smoke program")?;
    let compile_time = compile_started.elapsed();

    let a = [1.0f32, 2.0, 3.0, 4.0];
    let b = [0.5f32, -1.0, 2.0, 0.25];
    let mut expected = [0.0f32; 4];
    for i in 0..2 {
        for j in 0..2 {
            expected[i * 2 + j] = a[i * 2] * b[j] + a[i * 2 + 1] * b[2 + j] + a[i * 2 + j];
        }
    }
    let a_buffer = client.buffer_from_host(&a, &[2, 2], device)?;
    let b_buffer = client.buffer_from_host(&b, &[2, 2], device)?;
    let outputs = executable.execute(vec![
        ExecuteArg::Borrowed(&a_buffer),
        ExecuteArg::Borrowed(&b_buffer),
    ])?;
    let got: Vec<f32> = outputs
        .first()
        .context("the smoke program returned nothing")?
        .to_host_vec()?;
    if got != expected {
        bail!("the smoke program computed {got:?}, expected {expected:?}");
    }
    println!(
        "smoke test:        ok (compile {:.0} ms, total {:.0} ms)",
        compile_time.as_secs_f64() * 1e3,
        started.elapsed().as_secs_f64() * 1e3
    );
    Ok(())
}
