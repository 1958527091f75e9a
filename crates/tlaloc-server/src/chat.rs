//! The model's own chat template (Jinja, from the artifact's tokenizer files) rendered with
//! minijinja, with the Python string and dict methods Hugging Face templates call
//! (`minijinja-contrib`'s pycompat) and the `raise_exception` function they use to refuse a
//! conversation.

use minijinja::{Environment, Error, ErrorKind, Value, context};
use serde::Serialize;
use thiserror::Error as ThisError;

/// A template that did not load or did not render.
#[derive(Debug, ThisError)]
pub enum ChatTemplateError {
    /// The template text does not parse.
    #[error("the model's chat template does not parse: {0}")]
    Parse(String),
    /// Rendering failed, or the template refused the conversation.
    #[error("the model's chat template refused the messages: {0}")]
    Render(String),
}

/// One message as the template sees it.
#[derive(Debug, Clone, Serialize)]
pub struct TemplateMessage {
    /// `system`, `user`, `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
}

/// A compiled chat template and the special tokens it may use.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

const NAME: &str = "chat_template";

impl ChatTemplate {
    /// Compiles `source`.
    pub fn new(
        source: String,
        bos_token: String,
        eos_token: String,
    ) -> Result<Self, ChatTemplateError> {
        let mut env = Environment::new();
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        minijinja_contrib::add_to_environment(&mut env);
        // HF renders with trim_blocks and lstrip_blocks.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.add_function(
            "raise_exception",
            |message: String| -> Result<Value, Error> {
                Err(Error::new(ErrorKind::InvalidOperation, message))
            },
        );
        env.add_template_owned(NAME, source)
            .map_err(|e| ChatTemplateError::Parse(e.to_string()))?;
        Ok(Self {
            env,
            bos_token,
            eos_token,
        })
    }

    /// Renders `messages`, ending with the assistant's turn opener when `add_generation_prompt`.
    pub fn render(
        &self,
        messages: &[TemplateMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        let template = self
            .env
            .get_template(NAME)
            .map_err(|e| ChatTemplateError::Parse(e.to_string()))?;
        template
            .render(context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                bos_token => self.bos_token,
                eos_token => self.eos_token,
            })
            .map_err(|e| ChatTemplateError::Render(e.to_string()))
    }
}
