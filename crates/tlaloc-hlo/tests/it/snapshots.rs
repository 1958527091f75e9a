//! Golden StableHLO text of every case in `tests/snapshots/<case>.mlir`. A difference fails
//! with a diff; `TLALOC_BLESS=1 cargo test -p tlaloc-hlo` rewrites the files.

use std::path::PathBuf;

use crate::cases::ALL;

fn snapshot_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots")
}

fn bless() -> bool {
    std::env::var_os("TLALOC_BLESS").is_some_and(|v| v == "1")
}

/// The first differing lines of two texts, for the failure message.
fn diff(want: &str, got: &str) -> String {
    let (w, g): (Vec<&str>, Vec<&str>) = (want.lines().collect(), got.lines().collect());
    let mut out = Vec::new();
    for i in 0..w.len().max(g.len()) {
        let (a, b) = (w.get(i), g.get(i));
        if a != b {
            out.push(format!(
                "line {}:\n  - {}\n  + {}",
                i + 1,
                a.unwrap_or(&"<none>"),
                b.unwrap_or(&"<none>")
            ));
            if out.len() == 5 {
                break;
            }
        }
    }
    out.join("\n")
}

#[test]
fn printed_text_matches_snapshots() {
    let dir = snapshot_dir();
    let mut failures = Vec::new();
    for (name, case) in ALL {
        let text = case().module.to_text();
        let path = dir.join(format!("{name}.mlir"));
        if bless() {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, &text).unwrap();
            continue;
        }
        match std::fs::read_to_string(&path) {
            Ok(want) if want == text => {}
            Ok(want) => failures.push(format!("{name}: text drifted\n{}", diff(&want, &text))),
            Err(e) => failures.push(format!("{name}: cannot read {} ({e})", path.display())),
        }
    }
    assert!(
        failures.is_empty(),
        "{}\n\nIf the change is intended, run `TLALOC_BLESS=1 cargo test -p tlaloc-hlo` and review the diff.",
        failures.join("\n\n")
    );
}

#[test]
fn no_snapshot_without_a_case() {
    let names: Vec<String> = ALL.iter().map(|(n, _)| format!("{n}.mlir")).collect();
    for entry in std::fs::read_dir(snapshot_dir()).expect("tests/snapshots exists") {
        let file = entry.unwrap().file_name().to_string_lossy().into_owned();
        assert!(
            names.contains(&file),
            "tests/snapshots/{file} belongs to no case; delete it or add the case"
        );
    }
}

#[test]
fn building_twice_prints_identical_bytes() {
    for (name, case) in ALL {
        assert_eq!(
            case().module.to_text(),
            case().module.to_text(),
            "{name} is not deterministic"
        );
    }
}

/// A typed-FFI custom call prints in generic form with `api_version = 4`, its target as a
/// string and its attributes as a `backend_config` dictionary sorted by name, strings escaped.
#[test]
fn custom_call_prints_the_typed_ffi_form() {
    use tlaloc_hlo::{CustomCallAttr, FunctionBuilder, ScalarType, TensorType};
    let mut f = FunctionBuilder::new("m");
    let x = f.arg(TensorType::new(ScalarType::F32, [1, 4]));
    let w = f.arg(TensorType::new(ScalarType::Bf16, [3, 4]));
    let y = f
        .custom_call(
            "tlaloc.cpu.matmul",
            &[x, w],
            TensorType::new(ScalarType::F32, [1, 3]),
            &[
                ("rows", CustomCallAttr::I64(1)),
                ("name", CustomCallAttr::Str("a\"b\\c\n".into())),
                ("fast", CustomCallAttr::Bool(true)),
            ],
        )
        .unwrap();
    let text = f.finish(&[y]).unwrap().to_text();
    let line = text
        .lines()
        .find(|l| l.contains("custom_call"))
        .expect("no custom_call line");
    assert_eq!(
        line.trim(),
        "%0 = \"stablehlo.custom_call\"(%arg0, %arg1) {api_version = 4 : i32, backend_config = \
         {fast = true, name = \"a\\\"b\\\\c\\0A\", rows = 1 : i64}, call_target_name = \
         \"tlaloc.cpu.matmul\"} : (tensor<1x4xf32>, tensor<3x4xbf16>) -> tensor<1x3xf32>"
    );
}
