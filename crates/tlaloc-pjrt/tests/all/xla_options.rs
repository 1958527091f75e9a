//! XLA compiler options passed per compile (`CompileOptions::xla_options`): the plugin applies
//! them to that executable, and refuses a name it does not know.

use tlaloc_pjrt::{CompileOptions, XlaOptionValue};

use crate::common::on_each_plugin;

const ADD_ONE: &str = r#"module @add_one {
  func.func public @main(%x: tensor<4xf32>) -> tensor<4xf32> {
    %one = stablehlo.constant dense<1.0> : tensor<4xf32>
    %y = stablehlo.add %x, %one : tensor<4xf32>
    return %y : tensor<4xf32>
  }
}
"#;

fn with_option(name: &str, value: &str) -> CompileOptions {
    let mut options = CompileOptions::default();
    options
        .xla_options
        .insert(name.into(), XlaOptionValue::parse(value));
    options
}

#[test]
fn an_xla_option_reaches_the_compile_it_was_given_to_and_no_other() {
    on_each_plugin(|path, client| {
        let dumped = tempfile::tempdir().expect("tempdir");
        let dir = dumped.path().to_str().expect("utf-8 temp path");
        client
            .compile(ADD_ONE, &with_option("xla_dump_to", dir))
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let files = std::fs::read_dir(dumped.path()).expect("dump dir").count();
        assert!(
            files > 0,
            "{}: xla_dump_to={dir} dumped nothing",
            path.display()
        );

        // The next compile, without the option, dumps nothing there: the option was this
        // executable's, not the process's.
        let before: Vec<_> = std::fs::read_dir(dumped.path())
            .expect("dump dir")
            .map(|e| e.expect("entry").path())
            .collect();
        client
            .compile(
                &ADD_ONE.replace("@add_one", "@add_one_again"),
                &CompileOptions::default(),
            )
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let after = std::fs::read_dir(dumped.path()).expect("dump dir").count();
        assert_eq!(after, before.len(), "{}", path.display());
    });
}

#[test]
fn an_xla_option_of_no_known_name_is_refused_naming_it() {
    on_each_plugin(|path, client| {
        let err = client
            .compile(ADD_ONE, &with_option("xla_no_such_option_here", "1"))
            .err()
            .unwrap_or_else(|| panic!("{}: an unknown option compiled", path.display()));
        assert!(
            err.to_string().contains("xla_no_such_option_here"),
            "{}: {err}",
            path.display()
        );
    });
}
