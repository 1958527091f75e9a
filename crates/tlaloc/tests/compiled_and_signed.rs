//! The `tlaloc` binary on an exported tiny Llama and every test plugin: `compile` ships
//! executables (for each entry's portable body and its `cpu` variant) that `generate` then loads
//! instead of compiling, under `--kernels auto` and `portable` alike (reproducing transformers'
//! greedy ids), another plugin compiles instead and says why; `keygen`, `sign`, `verify
//! --public-key` and `serve --require-signature` accept a signed artifact and refuse an
//! unsigned, altered or foreign-signed one by name.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;
use tlaloc_artifact::signature::SIGNATURE_FILE;
use tlaloc_artifact::{Dtype, LadderOptions, MANIFEST_FILE};
use tlaloc_export::{ExportOptions, export};
use tlaloc_pjrt::testing::{test_plugin_paths, workspace_root};

use common::scratch;

/// The tiny GQA Llama fixture exported with a small ladder into `out`, every entry with a `cpu`
/// body variant beside its portable body.
fn export_tiny(out: &Path) {
    let options = ExportOptions {
        dtype: Dtype::F32,
        kv_dtype: None,
        ladder: LadderOptions::full_pool(2, 128, 16, vec![16]),
        force: false,
        cpu_variant: true,
        keep_quantized: false,
        quantize_activations: false,
        tensor_parallel: 1,
    };
    let fixture = workspace_root().join("tests/data/fixtures/tiny-llama-gqa");
    export(&fixture, out, &options, &mut |_| {}).unwrap();
}

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tlaloc"))
        .args(args)
        .output()
        .expect("running the tlaloc binary")
}

fn ok(args: &[&str]) -> String {
    let output = run(args);
    assert!(
        output.status.success(),
        "tlaloc {} failed:\n{}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// Runs a command that must fail, and returns its stderr.
fn refused(args: &[&str]) -> String {
    let output = run(args);
    assert!(
        !output.status.success(),
        "tlaloc {} was accepted",
        args.join(" ")
    );
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn ids(value: &Value) -> Vec<u64> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect()
}

/// `tlaloc generate --json` of the golden's first case with no compile cache, every entry made
/// ready at start, then `extra`.
fn generate(dir: &Path, plugin: &Path, case: &Value, extra: &[&str]) -> Value {
    let prompt: Vec<String> = ids(&case["prompt_ids"])
        .iter()
        .map(u64::to_string)
        .collect();
    let max = ids(&case["greedy_ids"]).len().to_string();
    let prompt = prompt.join(",");
    let mut args = vec![
        "generate",
        "--artifact",
        dir.to_str().unwrap(),
        "--plugin",
        plugin.to_str().unwrap(),
        "--no-compile-cache",
        "--prompt-ids",
        &prompt,
        "--max-new-tokens",
        &max,
        "--ignore-eos",
        "--eager-compile",
        "--json",
    ];
    args.extend_from_slice(extra);
    serde_json::from_str(&ok(&args)).unwrap()
}

#[test]
fn compiled_artifacts_start_from_their_executables_and_reproduce_transformers() {
    let golden: Value = serde_json::from_str(
        &std::fs::read_to_string(workspace_root().join("tests/data/goldens/tiny-llama-gqa.json"))
            .unwrap(),
    )
    .unwrap();
    let case = &golden["cases"][0];
    // Greedy ids up to the first step where float order may pick the other token.
    let comparable = case["steps"]
        .as_array()
        .unwrap()
        .iter()
        .position(|s| s["margin"].as_f64().is_some_and(|m| m < 1e-3))
        .unwrap_or(usize::MAX);
    let expected = ids(&case["greedy_ids"]);
    let n = comparable.min(expected.len());
    let plugins = test_plugin_paths();
    for (i, plugin) in plugins.iter().enumerate() {
        let root = scratch(&format!("compiled-tiny-{i}"));
        std::fs::create_dir_all(&root).unwrap();
        let dir = root.join("artifact");
        export_tiny(&dir);
        let said = ok(&[
            "compile",
            dir.to_str().unwrap(),
            "--plugin",
            plugin.to_str().unwrap(),
            "--no-compile-cache",
        ]);
        assert!(said.starts_with("compiled "), "{said}");
        ok(&["verify", dir.to_str().unwrap()]);
        // One executable for each entry's portable body and one for its variant.
        let manifest: Value =
            serde_json::from_slice(&std::fs::read(dir.join(MANIFEST_FILE)).unwrap()).unwrap();
        let entries = manifest["entries"].as_array().unwrap().len();
        let shipped = manifest["executables"][0]["entries"].as_array().unwrap();
        assert_eq!(shipped.len(), 2 * entries, "{shipped:?}");

        // The variant's executables (the default here) and the portable ones both load from
        // the artifact.
        for extra in [&[][..], &["--kernels", "portable"][..]] {
            let out = generate(&dir, plugin, case, extra);
            let load = &out["timings"]["load"];
            assert_eq!(load["compiled"], 0, "{extra:?}: {load}");
            assert_eq!(load["from_artifact"], entries, "{extra:?}: {load}");
            assert_eq!(ids(&out["generated_ids"])[..n], expected[..n]);
        }

        for other in plugins.iter().filter(|p| *p != plugin) {
            let out = generate(&dir, other, case, &[]);
            let load = &out["timings"]["load"];
            assert_eq!(load["from_artifact"], 0, "{load}");
            let line = load["executables"].as_str().unwrap();
            let builder = plugin.file_name().unwrap().to_str().unwrap();
            assert!(
                line.contains("built by") && line.contains(builder),
                "{line}"
            );
            assert_eq!(ids(&out["generated_ids"])[..n], expected[..n]);
        }
    }
}

#[test]
fn signatures_are_checked_by_verify_and_serve_and_refused_by_name() {
    let root = scratch("signed-tiny");
    std::fs::create_dir_all(&root).unwrap();
    let dir = root.join("artifact");
    export_tiny(&dir);
    let d = dir.to_str().unwrap();
    let prefix = root.join("release");
    ok(&["keygen", "--out", prefix.to_str().unwrap()]);
    let (secret, public) = (root.join("release.secret"), root.join("release.pub"));
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&secret).unwrap().permissions().mode();
        assert_eq!(
            mode & 0o077,
            0,
            "the secret key is readable by others: {mode:o}"
        );
    }
    // A second keygen never overwrites the key.
    let e = refused(&["keygen", "--out", prefix.to_str().unwrap()]);
    assert!(e.contains("never overwritten"), "{e}");
    let (s, p) = (secret.to_str().unwrap(), public.to_str().unwrap());

    // Unsigned: verify --public-key and serve --require-signature refuse it by name.
    let e = refused(&["verify", d, "--public-key", p]);
    assert!(
        e.contains("is not signed") && e.contains(SIGNATURE_FILE),
        "{e}"
    );
    let serve = |key: &str| {
        refused(&[
            "serve",
            "--artifact",
            d,
            "--port",
            "0",
            "--require-signature",
            key,
        ])
    };
    let e = serve(p);
    assert!(e.contains("is not signed"), "{e}");

    ok(&["sign", d, "--key", s]);
    let said = ok(&["verify", d, "--public-key", p]);
    assert!(said.contains("signed by key"), "{said}");
    // The key never went into the artifact, and a key inside it is refused.
    let listing: Vec<String> = walk(&dir);
    assert!(
        !listing
            .iter()
            .any(|f| f.contains("secret") || f.ends_with(".pub")),
        "{listing:?}"
    );
    std::fs::copy(&secret, dir.join("inside.secret")).unwrap();
    let e = refused(&[
        "sign",
        d,
        "--key",
        dir.join("inside.secret").to_str().unwrap(),
    ]);
    assert!(e.contains("inside the artifact"), "{e}");
    std::fs::remove_file(dir.join("inside.secret")).unwrap();

    // Another key's public half: refused as signed by another key.
    let other = root.join("other");
    ok(&["keygen", "--out", other.to_str().unwrap()]);
    let other_public = root.join("other.pub");
    let e = refused(&["verify", d, "--public-key", other_public.to_str().unwrap()]);
    assert!(e.contains("not by the expected key"), "{e}");
    let e = serve(other_public.to_str().unwrap());
    assert!(e.contains("not by the expected key"), "{e}");

    // One flipped byte in the signature, then in the manifest: both refused by name.
    for file in [SIGNATURE_FILE, MANIFEST_FILE] {
        let path = dir.join(file);
        let original = std::fs::read(&path).unwrap();
        let mut flipped = original.clone();
        // The last decimal digit: flipping its low bit keeps it a digit, so the file still
        // parses and only the signature check can refuse it.
        let at = original.iter().rposition(u8::is_ascii_digit).unwrap();
        flipped[at] ^= 0x01;
        std::fs::write(&path, &flipped).unwrap();
        let e = refused(&["verify", d, "--public-key", p]);
        assert!(
            e.contains("does not match") && e.contains(SIGNATURE_FILE),
            "{file}: {e}"
        );
        let e = serve(p);
        assert!(e.contains("does not match"), "{file}: {e}");
        std::fs::write(&path, &original).unwrap();
    }
    ok(&["verify", d, "--public-key", p]);
}

/// Every file under `dir`, as paths relative to it.
fn walk(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                out.push(
                    path.strip_prefix(dir)
                        .unwrap()
                        .to_string_lossy()
                        .into_owned(),
                );
            }
        }
    }
    out
}
