//! Token constraints and `logit_bias` through the engine: on the toy artifact on every plugin
//! (whose logits are `-|v - next|`, so the reference of a masked or biased argmax is computed
//! here from `reference_next`), and over the fake model with decode chains on (a constrained
//! row must leave the chain, or the in-graph argmax would ignore its mask).

use tlaloc_pjrt::testing::test_plugin_paths;
use tlaloc_runtime::{
    CompileMode, Constraint, ConstraintError, Engine, FinishReason, GenerateRequest,
    SamplingParams, TokenConstraint, TokenMask,
};

use crate::fake::{self, FakeModel, grid};
use crate::model_runs::options;
use crate::toy::{self, reference_next};

/// Allows the tokens `allowed(step)` at each step; finished after `finish_after` tokens.
struct ByStep<F> {
    allowed: F,
    step: usize,
    finish_after: Option<usize>,
    committed: Vec<u32>,
}

impl<F: Fn(usize) -> Vec<u32> + Send> TokenConstraint for ByStep<F> {
    fn next_mask(&mut self) -> Result<TokenMask, ConstraintError> {
        Ok(TokenMask::only(&(self.allowed)(self.step)))
    }

    fn commit(&mut self, token: u32) -> Result<(), ConstraintError> {
        if !(self.allowed)(self.step).contains(&token) {
            return Err(ConstraintError(format!("token {token} was not allowed")));
        }
        self.committed.push(token);
        self.step += 1;
        Ok(())
    }

    fn is_finished(&self) -> bool {
        self.finish_after.is_some_and(|n| self.step >= n)
    }
}

fn by_step(
    allowed: impl Fn(usize) -> Vec<u32> + Send + 'static,
    finish_after: Option<usize>,
) -> Constraint {
    Constraint::new(ByStep {
        allowed,
        step: 0,
        finish_after,
        committed: Vec::new(),
    })
}

fn multiples_of_three() -> Vec<u32> {
    (0..toy::VOCAB as u32).filter(|t| t % 3 == 0).collect()
}

/// The toy's greedy tokens when only multiples of 3 are allowed: the allowed token nearest the
/// model's next token (never a tie: a token is 1 or 2 from the nearest multiple of 3, and 2
/// from the other side only when it is 1 away here, so the nearest is unique).
fn reference_multiples_of_three(prompt: &[u32], max_tokens: usize) -> Vec<u32> {
    let allowed = multiples_of_three();
    let mut tokens = prompt.to_vec();
    for _ in 0..max_tokens {
        let next = reference_next(&tokens) as i64;
        let best = *allowed
            .iter()
            .min_by_key(|&&t| (t as i64 - next).abs())
            .unwrap();
        tokens.push(best);
    }
    tokens[prompt.len()..].to_vec()
}

/// The toy's first greedy token with `bias` added to its logits `-|v - next|`.
fn reference_biased_first(prompt: &[u32], bias: &[(u32, f32)]) -> u32 {
    let next = reference_next(prompt) as f32;
    let mut logits: Vec<f32> = (0..toy::VOCAB).map(|v| -(v as f32 - next).abs()).collect();
    for &(t, b) in bias {
        logits[t as usize] += b;
    }
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let best: Vec<usize> = (0..logits.len()).filter(|&v| logits[v] == max).collect();
    assert_eq!(best.len(), 1, "the biased reference must have one argmax");
    best[0] as u32
}

const PROMPT: [u32; 5] = [3, 14, 15, 9, 26];

#[test]
fn a_constrained_decode_emits_only_allowed_tokens_greedy_and_sampled_on_every_plugin() {
    let (_tmp, dir) = toy::temp(32);
    let max_tokens = 12;
    for plugin in test_plugin_paths() {
        let engine = Engine::load(&dir, options(&plugin, None, CompileMode::Eager)).unwrap();
        let unconstrained = toy::reference_generate(&PROMPT, max_tokens);
        let expected = reference_multiples_of_three(&PROMPT, max_tokens);
        assert_ne!(
            unconstrained, expected,
            "the mask must matter for this prompt"
        );
        let greedy = engine
            .generate_blocking(GenerateRequest {
                constraint: Some(by_step(|_| multiples_of_three(), None)),
                logprobs: Some(2),
                ..GenerateRequest::greedy(PROMPT.to_vec(), max_tokens)
            })
            .unwrap();
        assert_eq!(greedy.token_ids, expected, "{}", plugin.display());
        assert_eq!(greedy.finish_reason, FinishReason::Length);
        for top in &greedy.top_logprobs {
            // Masked tokens have no probability: the two best are both allowed.
            assert!(top.iter().all(|(t, _)| t % 3 == 0), "{top:?}");
        }

        let sampled = engine
            .generate_blocking(GenerateRequest {
                sampling: SamplingParams {
                    temperature: 1.5,
                    seed: Some(7),
                    ..SamplingParams::greedy()
                },
                constraint: Some(by_step(|_| multiples_of_three(), None)),
                ..GenerateRequest::greedy(PROMPT.to_vec(), 24)
            })
            .unwrap();
        assert_eq!(sampled.token_ids.len(), 24);
        assert!(
            sampled.token_ids.iter().all(|t| t % 3 == 0),
            "{}: {:?}",
            plugin.display(),
            sampled.token_ids
        );

        // A constraint that finishes ends the request with `stop`.
        let finished = engine
            .generate_blocking(GenerateRequest {
                constraint: Some(by_step(|_| multiples_of_three(), Some(4))),
                ..GenerateRequest::greedy(PROMPT.to_vec(), max_tokens)
            })
            .unwrap();
        assert_eq!(finished.token_ids, expected[..4]);
        assert_eq!(finished.finish_reason, FinishReason::Stop);
        engine.shutdown();
    }
}

#[test]
fn logit_bias_moves_the_greedy_choice_on_every_plugin() {
    let (_tmp, dir) = toy::temp(32);
    let argmax = reference_next(&PROMPT);
    assert!(argmax > 0 && (argmax as usize) < toy::VOCAB - 1);
    // -100 on the argmax, a small push to its right neighbour breaks the tie between the two.
    let ban = vec![(argmax, -100.0), (argmax + 1, 0.25)];
    let banned_to = reference_biased_first(&PROMPT, &ban);
    assert_eq!(banned_to, argmax + 1);
    for plugin in test_plugin_paths() {
        let engine = Engine::load(&dir, options(&plugin, None, CompileMode::Eager)).unwrap();
        let biased = |logit_bias: Vec<(u32, f32)>, max_tokens| {
            engine
                .generate_blocking(GenerateRequest {
                    sampling: SamplingParams {
                        logit_bias,
                        ..SamplingParams::greedy()
                    },
                    ..GenerateRequest::greedy(PROMPT.to_vec(), max_tokens)
                })
                .unwrap()
                .token_ids
        };
        assert_eq!(
            biased(ban.clone(), 1),
            vec![banned_to],
            "{}",
            plugin.display()
        );
        // +100 forces a token at every step, whatever the model's next token.
        assert_eq!(
            biased(vec![(7, 100.0)], 10),
            vec![7; 10],
            "{}",
            plugin.display()
        );
        engine.shutdown();
    }
}

#[test]
fn constrained_rows_leave_the_decode_chain_and_get_their_tokens() {
    let script: Vec<u32> = vec![5, 17, 3, 90, 41, 41, 8, 0, 66, 12];
    let engine =
        Engine::start(FakeModel::new(grid(&[1, 2, 4], &[4, 16], &[32, 64]), 4, 64).with_chain(8))
            .unwrap();
    let prompt: Vec<u32> = vec![1, 2, 3];
    let unconstrained = fake::reference_generate(&prompt, script.len(), &[]);
    assert_ne!(unconstrained, script);
    let forced = script.clone();
    // A constrained row batched with a chained unconstrained one.
    let (_, free) = engine
        .submit(GenerateRequest::greedy(prompt.clone(), 20))
        .unwrap();
    let got = engine
        .generate_blocking(GenerateRequest {
            constraint: Some(by_step(move |step| vec![forced[step]], Some(script.len()))),
            ..GenerateRequest::greedy(prompt.clone(), 20)
        })
        .unwrap();
    assert_eq!(got.token_ids, script);
    assert_eq!(got.finish_reason, FinishReason::Stop);
    let (free_ids, _) = crate::streams::collect_ids(free);
    assert_eq!(free_ids, fake::reference_generate(&prompt, 20, &[]));
    engine.shutdown();
}

#[test]
fn logit_bias_out_of_range_or_vocabulary_is_refused_by_name() {
    let engine = Engine::start(FakeModel::new(grid(&[1], &[4], &[32]), 4, 16)).unwrap();
    for (bias, says) in [
        (vec![(1, 101.0)], "logit_bias"),
        (vec![(1, f32::NAN)], "logit_bias"),
        (vec![(fake::VOCAB as u32, 1.0)], "logit_bias token id 97"),
    ] {
        let refused = engine
            .submit(GenerateRequest {
                sampling: SamplingParams {
                    logit_bias: bias,
                    ..SamplingParams::greedy()
                },
                ..GenerateRequest::greedy(vec![1], 1)
            })
            .expect_err("refused");
        assert!(refused.to_string().contains(says), "{refused}");
    }
    engine.shutdown();
}
