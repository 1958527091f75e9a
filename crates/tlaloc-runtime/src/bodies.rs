//! Which body of each entry runs: the portable one, or a variant the plugin in hand supports.
//!
//! A variant names a platform and the custom-call kernels it calls (`tlaloc_artifact::kernels`).
//! It is usable when the client's platform is that platform and every kernel is one this
//! runtime has ([`crate::host_kernels`]) and registered with the plugin's FFI extension;
//! registration happens here, once per variant, before anything is compiled or deserialized.
//! An entry runs the first usable variant it lists (the exporter lists them best first), else
//! its portable body. The outcome is one line of the load log naming the variant, how many
//! entries use it, and, for the others, why not.

use std::collections::{BTreeMap, HashMap};

use tlaloc_artifact::kernels::PORTABLE;
use tlaloc_artifact::{Artifact, BodyVariant};
use tlaloc_pjrt::Client;

use crate::host_kernels;

/// Which bodies the runtime may run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KernelChoice {
    /// The best body the plugin supports: a variant where one is usable, else the portable one.
    #[default]
    Auto,
    /// Every entry's portable body, whatever variants the artifact carries.
    Portable,
}

/// The body each entry runs and the load log's line about it.
#[derive(Debug, Clone, Default)]
pub(crate) struct BodyChoice {
    /// Entry name to the body it runs (`bodies/<sha256>.mlir`).
    pub bodies: HashMap<String, String>,
    /// Entry name to the variant it runs; absent for the portable body.
    pub variants: HashMap<String, String>,
    /// What was chosen and why; `None` when the artifact has no variants.
    pub line: Option<String>,
}

/// Chooses a body for every entry of `artifact` on `client`, registering the kernels of each
/// variant it considers with the client's plugin.
pub(crate) fn choose(artifact: &Artifact, client: &Client, choice: KernelChoice) -> BodyChoice {
    let entries = &artifact.manifest().entries;
    let mut chosen = BodyChoice {
        bodies: entries
            .iter()
            .map(|e| (e.name.clone(), e.body.clone()))
            .collect(),
        ..BodyChoice::default()
    };
    let with_variants = entries.iter().filter(|e| !e.variants.is_empty()).count();
    if with_variants == 0 {
        return chosen;
    }
    if choice == KernelChoice::Portable {
        chosen.line = Some(format!(
            "bodies: {PORTABLE} for all {} entries (--kernels {PORTABLE}; {with_variants} carry variants)",
            entries.len()
        ));
        return chosen;
    }
    let platform = client
        .platform_name()
        .unwrap_or_else(|e| format!("(unknown: {e})"));
    // Whether each variant name is usable, decided once.
    let mut usable: BTreeMap<String, Result<(), String>> = BTreeMap::new();
    for entry in entries {
        for variant in &entry.variants {
            if !usable.contains_key(&variant.name) {
                let verdict = support(variant, &platform, client);
                usable.insert(variant.name.clone(), verdict);
            }
            if usable[&variant.name].is_ok() {
                chosen
                    .bodies
                    .insert(entry.name.clone(), variant.body.clone());
                chosen
                    .variants
                    .insert(entry.name.clone(), variant.name.clone());
                break;
            }
        }
    }
    let mut parts = Vec::new();
    for (name, verdict) in &usable {
        let count = chosen.variants.values().filter(|v| *v == name).count();
        match verdict {
            Ok(()) => parts.push(format!("variant {name} for {count}")),
            Err(why) => parts.push(format!("variant {name} not usable: {why}")),
        }
    }
    let portable = entries.len() - chosen.variants.len();
    let line = format!(
        "bodies: {}; {PORTABLE} for {portable} of {} entries",
        parts.join("; "),
        entries.len()
    );
    if usable.values().all(Result::is_ok) {
        tracing::info!("{line}");
    } else {
        tracing::warn!("{line}");
    }
    chosen.line = Some(line);
    chosen
}

/// Whether `variant` can run on `client` (whose platform is `platform`): registers its kernels.
fn support(variant: &BodyVariant, platform: &str, client: &Client) -> Result<(), String> {
    if !variant.platform.eq_ignore_ascii_case(platform) {
        return Err(format!(
            "it needs a {} plugin and this one is {platform}",
            variant.platform
        ));
    }
    for target in &variant.kernels {
        let kernel = host_kernels::kernel_for(target)
            .ok_or_else(|| format!("this runtime has no kernel {target}"))?;
        tlaloc_pjrt::register_host_kernel(client.plugin(), target, kernel)
            .map_err(|e| format!("registering {target}: {e}"))?;
    }
    Ok(())
}
