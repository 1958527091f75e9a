//! ggml dequantization against gguf-py (`gguf.quants.dequantize`), bit for bit: the synthetic
//! blocks of every read type in tests/data/gguf-quants (random blocks with finite f16 scales, and
//! gguf-py's own quantization of seeded data), a GGUF written by gguf-py's writer holding every
//! type, and the leading rows of real tensors of the real GGUF files (SmolLM2 Q4_1, Gemma 3 270M
//! Q4_K_M). All expected values come from scripts/oracle/make_gguf_quant_goldens.py. Also the
//! header fuzz harness over its seed and seeded mutations of it.

#[path = "../../../fuzz/harness/gguf_header.rs"]
mod harness;
#[path = "../../../fuzz/harness/mutate.rs"]
mod mutate;

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use tlaloc_export::gguf::{GGML_TYPES, GgmlType, GgufHeader, dequantize};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn manifest() -> serde_json::Value {
    let path = root().join("tests/data/gguf-quants/MANIFEST.json");
    serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap()
}

fn f32_bits(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn dequantized_bits(ty: GgmlType, bytes: &[u8]) -> Vec<u32> {
    dequantize(ty, bytes)
        .unwrap_or_else(|e| panic!("{}: {e}", ty.name()))
        .to_f32()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

fn assert_same_bits(what: &str, got: &[u32], want: &[u32]) {
    assert_eq!(got.len(), want.len(), "{what}: element count");
    let differ: Vec<usize> = (0..got.len()).filter(|&i| got[i] != want[i]).collect();
    if let Some(&first) = differ.first() {
        panic!(
            "{what}: {} of {} values differ from gguf-py; first at {first}: got {} ({:#010x}), \
             want {} ({:#010x})",
            differ.len(),
            got.len(),
            f32::from_bits(got[first]),
            got[first],
            f32::from_bits(want[first]),
            want[first]
        );
    }
}

#[test]
fn every_block_type_that_is_read_dequantizes_exactly_as_gguf_py() {
    let manifest = manifest();
    let types = manifest["types"].as_object().unwrap();
    // The goldens cover every quantized type the table marks as read, and nothing else.
    let read: Vec<&str> = GGML_TYPES
        .iter()
        .filter(|r| r.supported && r.block_elements > 1)
        .map(|r| r.name)
        .collect();
    let mut covered: Vec<&str> = types.keys().map(String::as_str).collect();
    covered.sort();
    let mut expected = read.clone();
    expected.sort();
    assert_eq!(covered, expected);
    for (name, info) in types {
        let ty = GgmlType::from_name(name).unwrap();
        // The table's id and sizes agree with gguf-py's GGML_QUANT_SIZES.
        assert_eq!(
            u64::from(ty.id()),
            info["id"].as_u64().unwrap(),
            "{name} id"
        );
        let (elements, bytes) = ty.block();
        assert_eq!(elements as u64, info["block_elements"].as_u64().unwrap());
        assert_eq!(bytes as u64, info["block_bytes"].as_u64().unwrap());
        let dir = root().join("tests/data/gguf-quants");
        let blocks = std::fs::read(dir.join(format!("{name}.blocks"))).unwrap();
        let want = f32_bits(&std::fs::read(dir.join(format!("{name}.f32"))).unwrap());
        let random = info["random_blocks"].as_u64().unwrap() as usize;
        let quantized = info["quantized_blocks"].as_u64().unwrap() as usize;
        assert_eq!(blocks.len(), (random + quantized) * bytes, "{name}");
        assert_same_bits(name, &dequantized_bits(ty, &blocks), &want);
    }
}

#[test]
fn a_gguf_written_by_gguf_py_with_every_type_reads_back_as_gguf_py_dequantizes_it() {
    let path = root().join("fuzz/seeds/gguf_header/all-types.gguf");
    let bytes = std::fs::read(&path).unwrap();
    let header = GgufHeader::parse(&bytes).unwrap();
    assert_eq!(
        header.tensors.len(),
        manifest()["types"].as_object().unwrap().len()
    );
    for t in &header.tensors {
        let name = t.ggml_type.name();
        assert_eq!(t.name, format!("{}.weight", name.to_lowercase()));
        assert_eq!(t.ne, vec![256, 2], "{}", t.name);
        let want = f32_bits(
            &std::fs::read(root().join(format!("tests/data/gguf-quants/{name}.f32"))).unwrap(),
        );
        let got = dequantized_bits(t.ggml_type, &bytes[t.offset..t.offset + t.byte_len]);
        assert_same_bits(&t.name, &got, &want[..512]);
    }
}

#[test]
fn real_gguf_tensors_dequantize_exactly_as_gguf_py() {
    let manifest = manifest();
    let records = manifest["real_blocks"].as_array().unwrap();
    let mut files: Vec<&str> = records
        .iter()
        .map(|r| r["file"].as_str().unwrap())
        .collect();
    files.dedup();
    assert!(
        files.contains(&"SmolLM2-135M-Instruct.Q4_1.gguf"),
        "the goldens were made without the SmolLM2 GGUF"
    );
    let mut checked = 0;
    for file in files {
        let path = root().join(".tlaloc/models").join(file);
        if !path.is_file() {
            // SmolLM2 is the bundled model every checkout has; the others are optional.
            assert!(
                !file.starts_with("SmolLM2"),
                "{} is missing: run `bash scripts/setup.sh`",
                path.display()
            );
            eprintln!(
                "skipping the real blocks of {file}: {} is absent (`bash scripts/setup.sh` fetches it)",
                path.display()
            );
            continue;
        }
        let bytes = std::fs::read(&path).unwrap();
        let header = GgufHeader::parse(&bytes).unwrap();
        for r in records.iter().filter(|r| r["file"] == file) {
            let tensor = r["tensor"].as_str().unwrap();
            let info = header.tensors.iter().find(|t| t.name == tensor).unwrap();
            assert_eq!(
                info.ggml_type.name(),
                r["type"].as_str().unwrap(),
                "{tensor}"
            );
            let row_elements = r["row_elements"].as_u64().unwrap() as usize;
            let rows = r["rows"].as_u64().unwrap() as usize;
            assert_eq!(info.ne[0], row_elements, "{tensor}");
            let (block, block_bytes) = info.ggml_type.block();
            let len = rows * row_elements / block * block_bytes;
            let got = dequantized_bits(info.ggml_type, &bytes[info.offset..info.offset + len]);
            let head: Vec<u32> = r["head_f32_bits"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect();
            assert_same_bits(&format!("{file} {tensor} head"), &got[..head.len()], &head);
            let mut hasher = Sha256::new();
            for v in &got {
                hasher.update(v.to_le_bytes());
            }
            assert_eq!(
                hex::encode(hasher.finalize()),
                r["sha256_f32"].as_str().unwrap(),
                "{file} {tensor}: the dequantized rows differ from gguf-py's"
            );
            checked += 1;
        }
    }
    eprintln!("real tensors checked: {checked}");
}

#[test]
fn gguf_header_seeds_and_their_mutations_never_panic_and_stay_in_bounds() {
    let corpus = root().join("fuzz/seeds/gguf_header");
    let runs = mutate::run_corpus(&corpus, 10_000, harness::run);
    eprintln!("gguf_header: {runs} inputs");
}
