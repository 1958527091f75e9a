//! The model configuration as this backend reads it (Triton's `config.pbtxt`, given to the
//! backend as protobuf JSON with the proto's field names), and every refusal at model load.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::error::BackendError;

/// The parameters a model configuration may set, with what each means.
pub const PARAMETERS: &[(&str, &str)] = &[
    (
        "artifact",
        "the artifact directory (absolute, or relative to the model's directory)",
    ),
    (
        "plugin",
        "the PJRT plugin: auto, cpu, cuda, rocm, tpu or a path",
    ),
    (
        "compile_cache",
        "where compiled executables are kept between loads (absolute, or relative to the model's directory)",
    ),
];

/// Triton's default `max_sequence_idle_microseconds`.
pub const DEFAULT_SEQUENCE_IDLE: Duration = Duration::from_secs(1);

/// How the model is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// Decoupled text generation, the vLLM backend's contract.
    Generate,
    /// Token sequences under the sequence batcher.
    Sequence(SequenceControls),
}

/// The sequence batcher's control inputs, by the names the configuration gives them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SequenceControls {
    /// The input that is true on a sequence's first request.
    pub start: String,
    /// The input that is true on its last.
    pub end: String,
    /// The input that carries its correlation ID (UINT64).
    pub corrid: String,
    /// How long a sequence may stay idle before its pages are freed.
    pub idle: Duration,
}

/// What the backend takes from the model configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendConfig {
    /// The model's name.
    pub name: String,
    /// Generate or sequence.
    pub mode: Mode,
    /// The artifact directory.
    pub artifact: PathBuf,
    /// The plugin request (`auto` when unset).
    pub plugin: String,
    /// The compile cache directory (the runtime's default when unset).
    pub compile_cache: Option<PathBuf>,
    /// `max_batch_size` (0: the model takes no batch dimension).
    pub max_batch_size: usize,
}

impl BackendConfig {
    /// Reads `json` (the model's configuration) for the model in `model_dir`; refuses by name
    /// what the backend cannot serve. The artifact's top decode batch is checked later, at
    /// [`BackendConfig::check_batch`], once the artifact is open.
    pub fn parse(json: &str, model_dir: &Path) -> Result<Self, BackendError> {
        let config: Value = serde_json::from_str(json).map_err(|e| {
            BackendError::invalid(format!("the model configuration is not JSON: {e}"))
        })?;
        let name = config["name"].as_str().unwrap_or_default().to_owned();
        let instances: u64 = config["instance_group"]
            .as_array()
            .map(|groups| {
                groups
                    .iter()
                    .map(|g| number(&g["count"]).unwrap_or(1))
                    .sum()
            })
            .unwrap_or(1);
        if instances > 1 {
            return Err(BackendError::invalid(format!(
                "model {name}: instance_group count {instances} refused; the tlaloc backend serves a model from one instance (its engine batches every request itself): set count: 1"
            )));
        }
        let mut artifact = None;
        let mut plugin = None;
        let mut compile_cache = None;
        if let Some(parameters) = config["parameters"].as_object() {
            for (key, value) in parameters {
                let text = value["string_value"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                match key.as_str() {
                    "artifact" => artifact = Some(text),
                    "plugin" => plugin = Some(text),
                    "compile_cache" => compile_cache = Some(text),
                    other => {
                        let known: Vec<&str> = PARAMETERS.iter().map(|(k, _)| *k).collect();
                        return Err(BackendError::invalid(format!(
                            "model {name}: parameter `{other}` refused; the tlaloc backend takes {}",
                            known.join(", ")
                        )));
                    }
                }
            }
        }
        let artifact = artifact.filter(|a| !a.is_empty()).ok_or_else(|| {
            BackendError::invalid(format!(
                "model {name}: the parameter `artifact` is missing; set it to the artifact directory (parameters {{ key: \"artifact\" value {{ string_value: \"...\" }} }})"
            ))
        })?;
        let max_batch_size = number(&config["max_batch_size"]).unwrap_or(0) as usize;
        let decoupled = config["model_transaction_policy"]["decoupled"]
            .as_bool()
            .unwrap_or(false);
        let sequence = &config["sequence_batching"];
        let mode = if sequence.is_object() {
            Mode::Sequence(sequence_controls(&name, sequence)?)
        } else if decoupled {
            Mode::Generate
        } else {
            return Err(BackendError::invalid(format!(
                "model {name}: neither mode configured; set model_transaction_policy {{ decoupled: true }} for generate mode, or sequence_batching {{ oldest {{ }} ... }} for sequence mode"
            )));
        };
        if matches!(mode, Mode::Sequence(_)) && decoupled {
            return Err(BackendError::invalid(format!(
                "model {name}: a decoupled sequence model refused; sequence mode answers each request once: set decoupled: false"
            )));
        }
        Ok(Self {
            name,
            mode,
            artifact: resolve(model_dir, &artifact),
            plugin: plugin.unwrap_or_else(|| "auto".into()),
            compile_cache: compile_cache.map(|c| resolve(model_dir, &c)),
            max_batch_size,
        })
    }

    /// Refuses a `max_batch_size` above the artifact's top decode batch.
    pub fn check_batch(&self, top_decode_batch: usize) -> Result<(), BackendError> {
        if self.max_batch_size > top_decode_batch {
            return Err(BackendError::invalid(format!(
                "model {}: max_batch_size {} refused; the artifact's top decode batch is {top_decode_batch}: set max_batch_size to at most {top_decode_batch}, or export with a larger --max-batch",
                self.name, self.max_batch_size
            )));
        }
        Ok(())
    }
}

fn resolve(model_dir: &Path, path: &str) -> PathBuf {
    let path = Path::new(path);
    if path.is_absolute() {
        path.to_owned()
    } else {
        model_dir.join(path)
    }
}

/// A protobuf JSON integer: a number, or (64-bit fields) a string of digits.
fn number(value: &Value) -> Option<u64> {
    value
        .as_u64()
        .or_else(|| value.as_str().and_then(|s| s.parse().ok()))
}

fn sequence_controls(name: &str, sequence: &Value) -> Result<SequenceControls, BackendError> {
    if !sequence["oldest"].is_object() {
        return Err(BackendError::invalid(format!(
            "model {name}: sequence_batching without the oldest strategy refused; the tlaloc backend batches sequences itself: use oldest {{ max_candidate_sequences: N }}"
        )));
    }
    let mut start = None;
    let mut end = None;
    let mut corrid = None;
    for input in sequence["control_input"].as_array().into_iter().flatten() {
        let input_name = input["name"].as_str().unwrap_or_default().to_owned();
        for control in input["control"].as_array().into_iter().flatten() {
            match control["kind"].as_str().unwrap_or("CONTROL_SEQUENCE_START") {
                "CONTROL_SEQUENCE_START" => start = Some(input_name.clone()),
                "CONTROL_SEQUENCE_END" => end = Some(input_name.clone()),
                "CONTROL_SEQUENCE_CORRID" => {
                    let data_type = control["data_type"].as_str().unwrap_or("TYPE_INVALID");
                    if data_type != "TYPE_UINT64" {
                        return Err(BackendError::invalid(format!(
                            "model {name}: the CORRID control {input_name} of {data_type} refused; sequences are named by numbers: use data_type: TYPE_UINT64"
                        )));
                    }
                    corrid = Some(input_name.clone());
                }
                _ => {}
            }
        }
    }
    let missing = |kind: &str| {
        BackendError::invalid(format!(
            "model {name}: the sequence control {kind} is missing; add a control_input with kind {kind}"
        ))
    };
    let start = start.ok_or_else(|| missing("CONTROL_SEQUENCE_START"))?;
    let end = end.ok_or_else(|| missing("CONTROL_SEQUENCE_END"))?;
    let corrid = corrid.ok_or_else(|| missing("CONTROL_SEQUENCE_CORRID"))?;
    let idle = number(&sequence["max_sequence_idle_microseconds"])
        .filter(|&us| us > 0)
        .map(Duration::from_micros)
        .unwrap_or(DEFAULT_SEQUENCE_IDLE);
    Ok(SequenceControls {
        start,
        end,
        corrid,
        idle,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sequence_config(corrid_type: &str, extra: &str) -> String {
        format!(
            r#"{{"name":"s","max_batch_size":4,"instance_group":[{{"count":1}}],
            "parameters":{{"artifact":{{"string_value":"a"}}{extra}}},
            "sequence_batching":{{"oldest":{{"max_candidate_sequences":8}},
              "max_sequence_idle_microseconds":"2500000",
              "control_input":[
                {{"name":"START","control":[{{"kind":"CONTROL_SEQUENCE_START","int32_false_true":[0,1]}}]}},
                {{"name":"END","control":[{{"kind":"CONTROL_SEQUENCE_END","int32_false_true":[0,1]}}]}},
                {{"name":"CORRID","control":[{{"kind":"CONTROL_SEQUENCE_CORRID","data_type":"{corrid_type}"}}]}}]}}}}"#
        )
    }

    #[test]
    fn a_sequence_config_reads_its_controls_and_idle_time_and_a_relative_artifact() {
        let config =
            BackendConfig::parse(&sequence_config("TYPE_UINT64", ""), Path::new("/m")).unwrap();
        assert_eq!(config.artifact, PathBuf::from("/m/a"));
        assert_eq!(
            config.mode,
            Mode::Sequence(SequenceControls {
                start: "START".into(),
                end: "END".into(),
                corrid: "CORRID".into(),
                idle: Duration::from_micros(2_500_000),
            })
        );
        assert!(config.check_batch(4).is_ok());
        let refused = config.check_batch(2).unwrap_err().message;
        assert!(
            refused.contains("max_batch_size 4 refused")
                && refused.contains("top decode batch is 2"),
            "{refused}"
        );
    }

    #[test]
    fn load_time_refusals_name_the_setting() {
        let dir = Path::new("/m");
        let e = BackendConfig::parse(&sequence_config("TYPE_STRING", ""), dir).unwrap_err();
        assert!(e.message.contains("TYPE_STRING refused"), "{}", e.message);
        let e = BackendConfig::parse(
            &sequence_config("TYPE_UINT64", r#","tempo":{"string_value":"x"}"#),
            dir,
        )
        .unwrap_err();
        assert!(
            e.message.contains("parameter `tempo` refused"),
            "{}",
            e.message
        );
        let no_end = sequence_config("TYPE_UINT64", "")
            .replace("CONTROL_SEQUENCE_END", "CONTROL_SEQUENCE_READY");
        let e = BackendConfig::parse(&no_end, dir).unwrap_err();
        assert!(
            e.message.contains("CONTROL_SEQUENCE_END is missing"),
            "{}",
            e.message
        );
        let two = sequence_config("TYPE_UINT64", "").replace(r#""count":1"#, r#""count":2"#);
        let e = BackendConfig::parse(&two, dir).unwrap_err();
        assert!(
            e.message.contains("instance_group count 2 refused"),
            "{}",
            e.message
        );
        let neither = r#"{"name":"g","parameters":{"artifact":{"string_value":"/a"}}}"#;
        let e = BackendConfig::parse(neither, dir).unwrap_err();
        assert!(e.message.contains("neither mode"), "{}", e.message);
    }
}
