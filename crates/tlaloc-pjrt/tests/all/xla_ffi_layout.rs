//! The custom-call mirrors of `tlaloc_pjrt::xla_ffi` against the C headers they mirror:
//! `xla/pjrt/c/pjrt_c_api_ffi_extension.h` and `xla/ffi/api/c_api.h` of OpenXLA.
//!
//! Neither CPU plugin wheel ships those headers (jaxlib ships `xla/ffi/api/`, OpenXLA's source
//! tree has both), so the test runs only when asked: point `TLALOC_XLA_FFI_INCLUDE` at a
//! directory holding `xla/ffi/api/c_api.h`, `xla/pjrt/c/pjrt_c_api_ffi_extension.h` and
//! `xla/pjrt/c/pjrt_c_api.h`, then `cargo test -p tlaloc-pjrt --test all xla_ffi -- --ignored`.
//! A C program prints `offsetof`/`sizeof` of every mirrored field (and `sizeof` of the structs
//! mirrored whole), the `_STRUCT_SIZE` of the structs this crate fills in, and every mirrored enum
//! value; the Rust side prints the same lines.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;

use tlaloc_pjrt::xla_ffi::{CONSTS, LAYOUTS, STRUCT_SIZES};

const INCLUDE_ENV: &str = "TLALOC_XLA_FFI_INCLUDE";

fn c_program() -> String {
    let mut c = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include \"xla/ffi/api/c_api.h\"\n\
         #include \"xla/pjrt/c/pjrt_c_api_ffi_extension.h\"\nint main(void) {\n",
    );
    for layout in LAYOUTS {
        let name = layout.name;
        if layout.whole {
            writeln!(
                c,
                "  printf(\"struct {name} size=%zu\\n\", sizeof({name}));"
            )
            .unwrap();
        }
        for (field, _, _) in layout.fields {
            writeln!(
                c,
                "  printf(\"field {name}.{field} offset=%zu size=%zu\\n\", offsetof({name}, {field}), sizeof((({name}*)0)->{field}));"
            )
            .unwrap();
        }
    }
    for (name, _) in STRUCT_SIZES {
        writeln!(
            c,
            "  printf(\"struct_size {name}=%zu\\n\", (size_t){name}_STRUCT_SIZE);"
        )
        .unwrap();
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
        if layout.whole {
            lines.push(format!("struct {} size={}", layout.name, layout.size));
        }
        for (field, offset, size) in layout.fields {
            lines.push(format!(
                "field {}.{field} offset={offset} size={size}",
                layout.name
            ));
        }
    }
    for (name, size) in STRUCT_SIZES {
        lines.push(format!("struct_size {name}={size}"));
    }
    for (name, value) in CONSTS {
        lines.push(format!("const {name}={value}"));
    }
    lines
}

#[test]
#[ignore = "needs OpenXLA's FFI headers: set TLALOC_XLA_FFI_INCLUDE and pass --ignored"]
fn xla_ffi_mirrors_match_the_c_headers() {
    let include = PathBuf::from(std::env::var_os(INCLUDE_ENV).unwrap_or_else(|| {
        panic!("set {INCLUDE_ENV} to a directory holding xla/ffi/api/c_api.h and xla/pjrt/c/")
    }));
    for header in [
        "xla/ffi/api/c_api.h",
        "xla/pjrt/c/pjrt_c_api_ffi_extension.h",
        "xla/pjrt/c/pjrt_c_api.h",
    ] {
        assert!(
            include.join(header).is_file(),
            "{} not found",
            include.join(header).display()
        );
    }
    let dir = std::env::temp_dir().join(format!("tlaloc-xla-ffi-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let source = dir.join("layout.c");
    let binary = dir.join("layout");
    std::fs::write(&source, c_program()).unwrap();
    let compiler = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let output = Command::new(&compiler)
        .arg("-std=c11")
        .arg("-I")
        .arg(&include)
        .arg(&source)
        .arg("-o")
        .arg(&binary)
        .output()
        .unwrap_or_else(|e| panic!("running the C compiler `{compiler}`: {e}"));
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
        "layout differs from the headers in {}:\n{}",
        include.display(),
        mismatches.join("\n")
    );
    assert_eq!(rust_lines.len(), c_lines.len());
    std::fs::remove_dir_all(&dir).ok();
}
