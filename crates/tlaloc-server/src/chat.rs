//! The model's own chat template (Jinja, from the artifact's tokenizer files) rendered with
//! minijinja, with the Python string and dict methods Hugging Face templates call
//! (`minijinja-contrib`'s pycompat), the `raise_exception` function they use to refuse a
//! conversation, and `strftime_now` (Llama 3 templates print today's date). `strftime_now` is
//! written here for the few specifiers templates use (a date library for one function is more
//! than it needs); any other specifier is refused by name.

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

/// One message as the template sees it (as transformers' `apply_chat_template` passes it:
/// keys a message does not have are absent, since templates test `'tool_calls' in message`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct TemplateMessage {
    /// `system`, `user`, `assistant`, `tool`.
    pub role: String,
    /// The text.
    pub content: String,
    /// The sender's name, when sent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// An assistant turn's calls: `{"id", "type", "function": {"name", "arguments"}}`, the
    /// arguments as an object (templates print them with `tojson`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<serde_json::Value>>,
    /// The call a tool message answers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
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
        env.add_function("strftime_now", |format: String| -> Result<Value, Error> {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            strftime(&format, now).map(Value::from)
        });
        env.add_template_owned(NAME, source)
            .map_err(|e| ChatTemplateError::Parse(e.to_string()))?;
        Ok(Self {
            env,
            bos_token,
            eos_token,
        })
    }

    /// Renders `messages`, ending with the assistant's turn opener when `add_generation_prompt`;
    /// `tools` (`{"type": "function", "function": {...}}` each) is `none` to the template when
    /// the request declares none, as in transformers.
    pub fn render(
        &self,
        messages: &[TemplateMessage],
        tools: Option<&[serde_json::Value]>,
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        let template = self
            .env
            .get_template(NAME)
            .map_err(|e| ChatTemplateError::Parse(e.to_string()))?;
        template
            .render(context! {
                messages => messages,
                tools => tools,
                add_generation_prompt => add_generation_prompt,
                bos_token => self.bos_token,
                eos_token => self.eos_token,
            })
            .map_err(|e| ChatTemplateError::Render(e.to_string()))
    }
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// Year, month (1-12) and day of a count of days since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Formats UTC `unix_seconds` with Python's `%d %m %y %Y %b %B %H %M %S %%`.
fn strftime(format: &str, unix_seconds: u64) -> Result<String, Error> {
    let secs = unix_seconds as i64;
    let (year, month, day) = civil_from_days(secs.div_euclid(86_400));
    let in_day = secs.rem_euclid(86_400);
    let name = MONTHS[month as usize - 1];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('y') => out.push_str(&format!("{:02}", year.rem_euclid(100))),
            Some('Y') => out.push_str(&year.to_string()),
            Some('b') => out.push_str(&name[..3]),
            Some('B') => out.push_str(name),
            Some('H') => out.push_str(&format!("{:02}", in_day / 3600)),
            Some('M') => out.push_str(&format!("{:02}", in_day / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", in_day % 60)),
            Some('%') => out.push('%'),
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!(
                        "strftime_now: specifier %{} refused; supported: %d %m %y %Y %b %B %H %M %S %%",
                        other.map(String::from).unwrap_or_default()
                    ),
                ));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Dates checked against Python's `time.strftime(fmt, time.gmtime(t))`.
    #[test]
    fn strftime_agrees_with_python_on_known_instants() {
        let cases = [
            (0, "%d %b %Y %H:%M:%S", "01 Jan 1970 00:00:00"),
            (951_782_400, "%Y-%m-%d %B", "2000-02-29 February"),
            (
                1_735_689_599,
                "%d %B %y %H:%M:%S %%",
                "31 December 24 23:59:59 %",
            ),
            (4_107_542_400, "%d %b %Y", "01 Mar 2100"),
        ];
        for (t, fmt, expected) in cases {
            assert_eq!(strftime(fmt, t).unwrap(), expected, "{t} {fmt}");
        }
        let refused = strftime("%j", 0).unwrap_err().to_string();
        assert!(refused.contains("%j"), "{refused}");
    }

    #[test]
    fn raise_exception_refuses_by_the_templates_own_message() {
        let template = ChatTemplate::new(
            "{% if messages[0].role != 'user' %}{{ raise_exception('Conversations must start with a user turn') }}{% endif %}ok".into(),
            String::new(),
            String::new(),
        )
        .unwrap();
        let m = |role: &str| TemplateMessage {
            role: role.into(),
            content: "x".into(),
            ..Default::default()
        };
        assert_eq!(template.render(&[m("user")], None, true).unwrap(), "ok");
        let refused = template
            .render(&[m("assistant")], None, true)
            .unwrap_err()
            .to_string();
        assert!(refused.contains("must start with a user turn"), "{refused}");
    }
}
