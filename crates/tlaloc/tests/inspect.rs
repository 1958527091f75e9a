//! `tlaloc inspect` on checkpoints, through the binary: the first lines say the architecture
//! found, the tensors per element type and the export verdict, for accepted and refused ones
//! alike (the counts asserted are those gguf-py's reader and the fixture's safetensors header
//! give), and a refused checkpoint is a report, not a failed command.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn inspect(path: &Path) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_tlaloc"))
        .arg("inspect")
        .arg(path)
        .output()
        .expect("running the tlaloc binary");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "tlaloc inspect {} failed ({}):\n{stdout}\n{}",
        path.display(),
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

#[test]
fn inspect_says_architecture_types_and_verdict_first() {
    let fixture = root().join("tests/data/fixtures/tiny-llama-gqa");
    let out = inspect(&fixture);
    let head: Vec<&str> = out.lines().take(5).collect();
    assert_eq!(head[0], format!("checkpoint: {}", fixture.display()));
    assert_eq!(head[1], "format: safetensors (1 file)");
    assert_eq!(head[2], "architecture: LlamaForCausalLM (model_type llama)");
    assert_eq!(head[3], "tensors by type (21): F32 21");
    assert_eq!(head[4], "export: accepted");
    assert!(
        out.contains("tensors (21):"),
        "the full description follows:\n{out}"
    );

    // gguf-py's all-types GGUF: every type counted and read, but no model metadata.
    let seed = root().join("fuzz/seeds/gguf_header/all-types.gguf");
    let out = inspect(&seed);
    assert!(
        out.contains(
            "tensors by type (12): IQ4_NL 1, IQ4_XS 1, Q2_K 1, Q3_K 1, Q4_0 1, Q4_1 1, Q4_K 1, \
             Q5_0 1, Q5_1 1, Q5_K 1, Q6_K 1, Q8_0 1\n"
        ) && out.contains("architecture: llama\n")
            && out.contains("export: refused: config field `llama.embedding_length`"),
        "{out}"
    );
    assert!(
        !out.contains("config:"),
        "no description of a refused checkpoint:\n{out}"
    );

    let gemma = root().join(".tlaloc/models/gemma-3-270m-q4_k_m.gguf");
    if gemma.is_file() {
        let out = inspect(&gemma);
        assert!(
            out.contains("architecture: gemma3\n")
                && out.contains(
                    "tensors by type (236): F32 109, Q4_K 27, Q5_0 81, Q6_K 9, Q8_0 10\n"
                )
                // The architecture is built and its SentencePiece vocabulary rebuilt.
                && out.contains("export: accepted"),
            "{out}"
        );
    } else {
        eprintln!(
            "skipping Gemma: {} is absent (`bash scripts/setup.sh`)",
            gemma.display()
        );
    }
}
