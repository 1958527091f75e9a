//! The mirrored structs and enum values against the C header they mirror.
//!
//! A C program that includes `pjrt_c_api.h` prints `sizeof`, `<name>_STRUCT_SIZE`, and every
//! field's `offsetof` and size for every struct `tlaloc_pjrt::ffi` records (the `PJRT_Api` table
//! included, so every entry's offset is checked), plus every recorded enum value; the same lines
//! are produced from the Rust side and compared. Needs a C compiler and the header, no plugin.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;

use tlaloc_pjrt::ffi::{CONSTS, LAYOUTS};

fn header_path() -> PathBuf {
    let path = match std::env::var_os("TLALOC_PJRT_HEADER") {
        Some(path) => PathBuf::from(path),
        None => tlaloc_pjrt::testing::workspace_root()
            .join(".tlaloc/plugins/xla-cpu-pjrt-0.0.1/include/pjrt_c_api.h"),
    };
    assert!(
        path.is_file(),
        "PJRT C header {} not found: run `tlaloc plugin install cpu` (the xla-cpu-pjrt wheel ships \
         it) or set TLALOC_PJRT_HEADER",
        path.display()
    );
    path
}

fn c_program() -> String {
    let mut c = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include \"pjrt_c_api.h\"\nint main(void) {\n",
    );
    for layout in LAYOUTS {
        let name = layout.name;
        writeln!(
            c,
            "  printf(\"struct {name} size=%zu struct_size=%zu\\n\", sizeof({name}), (size_t){name}_STRUCT_SIZE);"
        )
        .unwrap();
        for (field, _, _) in layout.fields {
            writeln!(
                c,
                "  printf(\"field {name}.{field} offset=%zu size=%zu\\n\", offsetof({name}, {field}), sizeof((({name}*)0)->{field}));"
            )
            .unwrap();
        }
    }
    for (name, _) in CONSTS {
        writeln!(c, "  printf(\"const {name}=%lld\\n\", (long long){name});").unwrap();
    }
    c.push_str("  return 0;\n}\n");
    c
}

fn rust_lines() -> Vec<String> {
    let mut lines = Vec::new();
    for layout in LAYOUTS {
        lines.push(format!(
            "struct {} size={} struct_size={}",
            layout.name, layout.size, layout.struct_size
        ));
        for (field, offset, size) in layout.fields {
            lines.push(format!(
                "field {}.{field} offset={offset} size={size}",
                layout.name
            ));
        }
    }
    for (name, value) in CONSTS {
        lines.push(format!("const {name}={value}"));
    }
    lines
}

#[test]
fn mirrored_structs_match_the_c_header() {
    let header = header_path();
    let dir = std::env::temp_dir().join(format!("tlaloc-pjrt-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let source = dir.join("layout.c");
    let binary = dir.join("layout");
    std::fs::write(&source, c_program()).unwrap();
    let compiler = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let output = Command::new(&compiler)
        .arg("-std=c11")
        .arg("-I")
        .arg(header.parent().unwrap())
        .arg(&source)
        .arg("-o")
        .arg(&binary)
        .output()
        .unwrap_or_else(|e| {
            panic!("running the C compiler `{compiler}` (set CC to choose another): {e}")
        });
    assert!(
        output.status.success(),
        "compiling the layout probe failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let output = Command::new(&binary).output().unwrap();
    assert!(output.status.success());
    let c_lines: Vec<String> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    let rust_lines = rust_lines();
    let mismatches: Vec<String> = rust_lines
        .iter()
        .zip(&c_lines)
        .filter(|(r, c)| r != c)
        .map(|(r, c)| format!("rust: {r}\n   C: {c}"))
        .collect();
    assert!(
        mismatches.is_empty(),
        "layout differs from {}:\n{}",
        header.display(),
        mismatches.join("\n")
    );
    assert_eq!(rust_lines.len(), c_lines.len());
    // The probe must have checked something substantial: the whole function table at least.
    assert!(
        LAYOUTS
            .iter()
            .any(|l| l.name == "PJRT_Api" && l.fields.len() > 100)
    );
    std::fs::remove_dir_all(&dir).ok();
}
