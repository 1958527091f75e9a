//! When a sequence stops: after a stop token, an end-of-sequence token (unless the request
//! ignores them), or when its token budget is used up — in that order, so a budget's last
//! token that is also a stop token reports `stop`.

use crate::request::{FinishReason, StopParams};

/// What decides a sequence's stop.
#[derive(Debug, Clone, Copy)]
pub struct StopRule<'a> {
    /// The request's stop tokens.
    pub stop: &'a StopParams,
    /// The model's end-of-sequence tokens.
    pub eos_token_ids: &'a [u32],
    /// Whether the request ignores end-of-sequence tokens.
    pub ignore_eos: bool,
    /// The request's token budget.
    pub max_tokens: usize,
}

impl StopRule<'_> {
    /// Why the sequence ends after emitting `token` as its `generated`-th token, if it does.
    pub fn after(&self, token: u32, generated: usize) -> Option<FinishReason> {
        if self.stop.stop_token_ids.contains(&token)
            || (!self.ignore_eos && self.eos_token_ids.contains(&token))
        {
            Some(FinishReason::Stop)
        } else if generated >= self.max_tokens {
            Some(FinishReason::Length)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_tokens_come_before_the_budget_and_eos_can_be_ignored() {
        let stop = StopParams {
            stop_token_ids: vec![7],
        };
        let rule = StopRule {
            stop: &stop,
            eos_token_ids: &[2],
            ignore_eos: false,
            max_tokens: 3,
        };
        assert_eq!(rule.after(5, 1), None);
        assert_eq!(rule.after(7, 1), Some(FinishReason::Stop));
        assert_eq!(rule.after(2, 1), Some(FinishReason::Stop));
        assert_eq!(rule.after(5, 3), Some(FinishReason::Length));
        assert_eq!(rule.after(7, 3), Some(FinishReason::Stop));
        let ignoring = StopRule {
            ignore_eos: true,
            ..rule
        };
        assert_eq!(ignoring.after(2, 1), None);
        assert_eq!(ignoring.after(7, 1), Some(FinishReason::Stop));
    }
}
