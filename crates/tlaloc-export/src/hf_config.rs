//! Writes the Hugging Face `config.json` into an artifact's tokenizer directory, so that
//! directory opens as a model directory in engines that read one (vLLM). What the file says is
//! the artifact crate's (`tlaloc_artifact::hf_config`), derived from the manifest's model; this
//! module only puts it among the tokenizer files, hashed by the manifest like the rest.

use tlaloc_artifact::hf_config::{HF_CONFIG_FILE, hf_config_json};
use tlaloc_artifact::{ArtifactError, ArtifactWriter, Dtype, ManifestModel, TokenizerFile};

/// Writes `tokenizer/config.json` for `model` with weights in `dtype`.
pub fn write_hf_config(
    writer: &mut ArtifactWriter,
    model: &ManifestModel,
    dtype: Dtype,
) -> Result<TokenizerFile, ArtifactError> {
    writer.write_tokenizer_file(HF_CONFIG_FILE, &hf_config_json(model, dtype))
}
