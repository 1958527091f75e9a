//! A scripted model for route tests: a row's next token is the `seqLens`-th token of a fixed
//! sentence (cycled), so what any request generates is known from its prompt length alone, and
//! the reference text is the tokenizer's own decoding of those ids. Logits put all mass on
//! that token, so sampling and log-probabilities agree with greedy decoding.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tlaloc_runtime::{
    Engine, EngineHandle, ExecutorError, Ladder, LadderPoint, ModelExecutor, ModelShape,
    StepInputs, StepOutput, StepTimings,
};
use tlaloc_server::{AppState, ModelText, ServerConfig, SharedState};

pub const BLOCK_SIZE: usize = 16;
pub const NUM_BLOCKS: usize = 33;
pub const MAX_CONTEXT: usize = 128;
pub const SENTENCE: &str =
    " The quick brown fox jumps over the lazy dog, and the café owner says hello. Then";

pub fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn fixture(name: &str) -> PathBuf {
    workspace()
        .join("tests/data/fixtures/tiny-llama-tied")
        .join(name)
}

pub fn model_text() -> ModelText {
    let template = std::fs::read_to_string(fixture("chat_template.jinja"))
        .expect("the tiny-llama-tied fixture is in the repository");
    ModelText::new(
        &fixture("tokenizer.json"),
        Some(template),
        "<|im_start|>".into(),
        "<|im_end|>".into(),
    )
    .expect("the fixture's tokenizer and template load")
}

/// The sentence's ids under the fixture's tokenizer.
pub fn sentence_ids(text: &ModelText) -> Vec<u32> {
    text.codec.encode(SENTENCE, false).expect("encode")
}

/// The ids the fake generates after a prompt of `prompt_len` tokens.
pub fn reference_ids(sentence: &[u32], prompt_len: usize, count: usize) -> Vec<u32> {
    (prompt_len..prompt_len + count)
        .map(|p| sentence[p % sentence.len()])
        .collect()
}

#[derive(Debug)]
pub struct ScriptedModel {
    shape: ModelShape,
    sentence: Vec<u32>,
    step_delay: Duration,
    /// Steps that succeed before every later one fails (as a device error would).
    fail_after: Option<usize>,
    steps: usize,
}

impl ModelExecutor for ScriptedModel {
    fn shape(&self) -> &ModelShape {
        &self.shape
    }

    fn step(
        &mut self,
        entry: &LadderPoint,
        inputs: &StepInputs,
    ) -> Result<StepOutput, ExecutorError> {
        std::thread::sleep(self.step_delay);
        self.steps += 1;
        if self.fail_after.is_some_and(|n| self.steps > n) {
            return Err(ExecutorError::Device {
                entry: *entry,
                message: "scripted device failure".into(),
            });
        }
        let vocab = self.shape.vocab_size;
        let next: Vec<i32> = inputs
            .seq_lens
            .iter()
            .map(|&len| self.sentence[len as usize % self.sentence.len()] as i32)
            .collect();
        let logits = inputs.want_logits.then(|| {
            let mut l = vec![0.0f32; entry.batch * vocab];
            for (row, &t) in next.iter().enumerate() {
                l[row * vocab + t as usize] = 30.0;
            }
            l
        });
        Ok(StepOutput {
            next_tokens: next,
            logits,
            timings: StepTimings::default(),
        })
    }
}

/// Decode at each of `decode_batches`, one prefill chunk of 16, contexts 64 and MAX_CONTEXT.
pub fn ladder(decode_batches: &[usize]) -> Ladder {
    Ladder {
        max_batch: *decode_batches.last().expect("a batch bucket"),
        max_context: MAX_CONTEXT,
        block_size: BLOCK_SIZE,
        batch_buckets: decode_batches.to_vec(),
        context_buckets: vec![64, MAX_CONTEXT],
        prefill_chunks: vec![16],
        prefill_batch_buckets: vec![1],
    }
}

pub struct Harness {
    pub state: SharedState,
    pub engine: EngineHandle,
    pub sentence: Vec<u32>,
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.engine.shutdown();
    }
}

pub fn harness(config: ServerConfig, decode_batches: &[usize], step_delay: Duration) -> Harness {
    harness_failing(config, decode_batches, step_delay, None)
}

pub fn harness_failing(
    config: ServerConfig,
    decode_batches: &[usize],
    step_delay: Duration,
    fail_after: Option<usize>,
) -> Harness {
    let scripted = scripted_engine(decode_batches, step_delay, fail_after);
    let state = AppState::new(config, scripted.text);
    state.set_engine(scripted.engine.clone());
    Harness {
        state: Arc::clone(&state),
        engine: scripted.engine,
        sentence: scripted.sentence,
    }
}

/// A started engine over the scripted model, and the text side it was built for.
pub struct Scripted {
    pub text: ModelText,
    pub engine: EngineHandle,
    pub sentence: Vec<u32>,
}

pub fn scripted_engine(
    decode_batches: &[usize],
    step_delay: Duration,
    fail_after: Option<usize>,
) -> Scripted {
    let text = model_text();
    let sentence = sentence_ids(&text);
    let model = ScriptedModel {
        shape: ModelShape {
            vocab_size: text.codec.vocab_size(),
            block_size: BLOCK_SIZE,
            num_blocks: NUM_BLOCKS,
            ladder: ladder(decode_batches),
            eos_token_ids: vec![text.codec.token_id("<|im_end|>").expect("eos")],
            weight_bytes: 0,
            kv_bytes_per_token: 0,
        },
        sentence: sentence.clone(),
        step_delay,
        fail_after,
        steps: 0,
    };
    let engine = Engine::start(model).expect("the scripted engine starts");
    Scripted {
        text,
        engine,
        sentence,
    }
}
