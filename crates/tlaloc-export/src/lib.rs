//! Checkpoint readers (safetensors, GGUF), Llama-family model graphs and the artifact
//! writer.
