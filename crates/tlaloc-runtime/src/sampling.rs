//! Choosing the next token from a row of logits: penalties, temperature, top-k, top-p, min-p,
//! a seeded random draw, and log-probabilities.
//!
//! Greedy rows with no penalties use the argmax the program computed in the graph, so their
//! logits never leave the device; everything else here runs on the host over one `[V]` row.
//!
//! Order of processing (vLLM's): repetition penalty (positive logits divided, negative ones
//! multiplied, for every token seen in the prompt or the output), then presence and frequency
//! penalties (subtracted for tokens of the output), then `logit_bias` (added), then a request's
//! token constraint (tokens outside its mask set to `-inf`), then temperature, then top-k, top-p and min-p
//! on the renormalised distribution, then a draw. Returned log-probabilities are the
//! log-softmax of the *processed* logits: after penalties and temperature, before the top-k /
//! top-p / min-p cut (so every token has a finite log-probability, and a greedy row reports the
//! model's distribution with penalties applied).
//!
//! The generator is ChaCha8 (`rand_chacha`), seeded per request: the same seed and the same
//! logits give the same tokens. An unseeded request takes its seed from std's per-process random
//! hasher keys, which saves a dependency on an OS-entropy crate for one `u64`.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};

use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};
use thiserror::Error;

use crate::constraint::TokenMask;

/// How one request chooses its tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy (argmax); otherwise logits are divided by it.
    pub temperature: f32,
    /// Keep only the `k` most likely tokens; `None` keeps all.
    pub top_k: Option<usize>,
    /// Keep the smallest set of most likely tokens whose mass reaches `p`; 1 keeps all.
    pub top_p: f32,
    /// Drop tokens whose probability is under `min_p` times the most likely one's; 0 keeps all.
    pub min_p: f32,
    /// Seed of the request's generator; `None` draws one.
    pub seed: Option<u64>,
    /// Divides positive / multiplies negative logits of tokens seen in prompt or output; 1 is off.
    pub repetition_penalty: f32,
    /// Subtracted once from the logit of every token the output holds; 0 is off.
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per occurrence in the output; 0 is off.
    pub frequency_penalty: f32,
    /// Added to the logits of these tokens before sampling, greedy rows too (OpenAI's
    /// `logit_bias`: each in [-100, 100]; -100 bans a token in practice, +100 forces it).
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self::greedy()
    }
}

/// A sampling parameter out of range, named.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("sampling parameter `{field}` = {value} refused: {accepted}")]
pub struct InvalidSamplingParam {
    /// The field, as named in the OpenAI API.
    pub field: &'static str,
    /// The value given.
    pub value: String,
    /// What would be accepted.
    pub accepted: &'static str,
}

impl SamplingParams {
    /// Argmax decoding with no penalties.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            top_k: None,
            top_p: 1.0,
            min_p: 0.0,
            seed: None,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
        }
    }

    /// Checks every field's range; the error names the field.
    pub fn validate(&self) -> Result<(), InvalidSamplingParam> {
        let bad = |field, value: f32, accepted| InvalidSamplingParam {
            field,
            value: value.to_string(),
            accepted,
        };
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(bad(
                "temperature",
                self.temperature,
                "a finite number >= 0 (0 is greedy)",
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(bad("top_p", self.top_p, "a number in (0, 1]"));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(bad("min_p", self.min_p, "a number in [0, 1]"));
        }
        if self.top_k == Some(0) {
            return Err(InvalidSamplingParam {
                field: "top_k",
                value: "0".into(),
                accepted: "a count >= 1, or none for no limit",
            });
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return Err(bad(
                "repetition_penalty",
                self.repetition_penalty,
                "a finite number > 0 (1 is off)",
            ));
        }
        if !(-2.0..=2.0).contains(&self.presence_penalty) {
            return Err(bad(
                "presence_penalty",
                self.presence_penalty,
                "a number in [-2, 2]",
            ));
        }
        if !(-2.0..=2.0).contains(&self.frequency_penalty) {
            return Err(bad(
                "frequency_penalty",
                self.frequency_penalty,
                "a number in [-2, 2]",
            ));
        }
        if let Some(&(token, bias)) = self
            .logit_bias
            .iter()
            .find(|(_, b)| !(b.is_finite() && (-100.0..=100.0).contains(b)))
        {
            return Err(InvalidSamplingParam {
                field: "logit_bias",
                value: format!("{{{token}: {bias}}}"),
                accepted: "token ids mapped to biases in [-100, 100]",
            });
        }
        Ok(())
    }

    /// Whether the token is the argmax of the raw logits, which the program computes itself.
    pub fn uses_in_graph_argmax(&self) -> bool {
        self.temperature == 0.0 && !self.has_penalties() && self.logit_bias.is_empty()
    }

    fn has_penalties(&self) -> bool {
        self.repetition_penalty != 1.0
            || self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
    }
}

/// The token chosen for one row, with log-probabilities when asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    /// The token id.
    pub token: u32,
    /// Its log-probability under the processed distribution (when logprobs were asked for).
    pub logprob: Option<f32>,
    /// The `n` most likely tokens and their log-probabilities, most likely first.
    pub top_logprobs: Vec<(u32, f32)>,
}

/// One request's sampling state: its parameters, generator and the token counts that penalties
/// need, kept up to date as tokens are appended.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha8Rng,
    prompt_tokens: std::collections::HashSet<u32>,
    output_counts: HashMap<u32, u32>,
    scratch: Vec<f32>,
    order: Vec<u32>,
}

impl Sampler {
    /// A sampler for a request whose prompt is `prompt`.
    pub fn new(params: SamplingParams, prompt: &[u32]) -> Self {
        let seed = params.seed.unwrap_or_else(|| {
            std::collections::hash_map::RandomState::new()
                .build_hasher()
                .finish()
        });
        let prompt_tokens = if params.repetition_penalty != 1.0 {
            prompt.iter().copied().collect()
        } else {
            Default::default()
        };
        Self {
            params,
            rng: ChaCha8Rng::seed_from_u64(seed),
            prompt_tokens,
            output_counts: HashMap::new(),
            scratch: Vec::new(),
            order: Vec::new(),
        }
    }

    /// The request's parameters.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Records a generated token (for presence, frequency and repetition penalties).
    pub fn observe(&mut self, token: u32) {
        *self.output_counts.entry(token).or_insert(0) += 1;
    }

    /// Chooses a token from `logits` (one row, `[V]`); `top_n` asks for that many top
    /// log-probabilities (`Some(0)` for the chosen token's alone).
    pub fn sample(&mut self, logits: &[f32], top_n: Option<usize>) -> Sampled {
        self.sample_within(logits, top_n, None)
    }

    /// [`Sampler::sample`] restricted to the tokens `mask` allows: the others are set to
    /// `-inf` after penalties and bias, before temperature and the draw (greedy takes the
    /// argmax of what is left; log-probabilities are those of the masked distribution).
    pub fn sample_within(
        &mut self,
        logits: &[f32],
        top_n: Option<usize>,
        mask: Option<&TokenMask>,
    ) -> Sampled {
        let mut values = std::mem::take(&mut self.scratch);
        values.clear();
        values.extend_from_slice(logits);
        self.apply_penalties(&mut values);
        if let Some(mask) = mask {
            mask.apply(&mut values);
        }

        let greedy = self.params.temperature == 0.0;
        if !greedy {
            let inv = 1.0 / self.params.temperature;
            values.iter_mut().for_each(|v| *v *= inv);
        }
        let log_norm = top_n.map(|_| log_sum_exp(&values));

        let token = if greedy {
            argmax(&values)
        } else {
            self.draw(&values)
        };
        let mut sampled = Sampled {
            token,
            logprob: None,
            top_logprobs: Vec::new(),
        };
        if let (Some(n), Some(log_norm)) = (top_n, log_norm) {
            sampled.logprob = Some(values[token as usize] - log_norm);
            sampled.top_logprobs = top_n_of(&values, n)
                .into_iter()
                .map(|i| (i, values[i as usize] - log_norm))
                .collect();
        }
        self.scratch = values;
        sampled
    }

    /// Log-probabilities for a token chosen elsewhere (the in-graph argmax) from its row.
    pub fn logprobs_of(&mut self, logits: &[f32], token: u32, top_n: usize) -> Sampled {
        let mut values = std::mem::take(&mut self.scratch);
        values.clear();
        values.extend_from_slice(logits);
        self.apply_penalties(&mut values);
        if self.params.temperature != 0.0 {
            let inv = 1.0 / self.params.temperature;
            values.iter_mut().for_each(|v| *v *= inv);
        }
        let log_norm = log_sum_exp(&values);
        let sampled = Sampled {
            token,
            logprob: values.get(token as usize).map(|v| v - log_norm),
            top_logprobs: top_n_of(&values, top_n)
                .into_iter()
                .map(|i| (i, values[i as usize] - log_norm))
                .collect(),
        };
        self.scratch = values;
        sampled
    }

    fn apply_penalties(&self, values: &mut [f32]) {
        let p = &self.params;
        if p.repetition_penalty != 1.0 {
            let output_only = self
                .output_counts
                .keys()
                .filter(|t| !self.prompt_tokens.contains(t));
            for &token in self.prompt_tokens.iter().chain(output_only) {
                if let Some(v) = values.get_mut(token as usize) {
                    *v = if *v > 0.0 {
                        *v / p.repetition_penalty
                    } else {
                        *v * p.repetition_penalty
                    };
                }
            }
        }
        if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
            for (&token, &count) in &self.output_counts {
                if let Some(v) = values.get_mut(token as usize) {
                    *v -= p.presence_penalty + p.frequency_penalty * count as f32;
                }
            }
        }
        for &(token, bias) in &p.logit_bias {
            if let Some(v) = values.get_mut(token as usize) {
                *v += bias;
            }
        }
    }

    /// Draws from softmax(values) restricted by top-k, top-p and min-p.
    fn draw(&mut self, values: &[f32]) -> u32 {
        let max = values.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        if !max.is_finite() {
            return argmax(values);
        }
        let order = &mut self.order;
        order.clear();
        order.extend(0..values.len() as u32);
        let by_value_desc = |a: &u32, b: &u32| values[*b as usize].total_cmp(&values[*a as usize]);
        if let Some(k) = self.params.top_k
            && k < order.len()
        {
            order.select_nth_unstable_by(k - 1, by_value_desc);
            order.truncate(k);
        }
        let weight = |i: u32| ((values[i as usize] - max) as f64).exp();

        if self.params.min_p > 0.0 {
            // p_i >= min_p * p_max  <=>  exp(v_i - max) >= min_p (the max has weight 1).
            let floor = self.params.min_p as f64;
            order.retain(|&i| weight(i) >= floor);
        }
        if self.params.top_p < 1.0 {
            nucleus(order, self.params.top_p as f64, weight, by_value_desc);
        }

        let total: f64 = order.iter().map(|&i| weight(i)).sum();
        let u = (self.rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
        let mut threshold = u * total;
        for &i in order.iter() {
            threshold -= weight(i);
            if threshold < 0.0 {
                return i;
            }
        }
        *order
            .last()
            .expect("the most likely token always survives the cuts")
    }
}

/// Cuts `order` to the smallest most-likely prefix whose weight reaches `top_p` of the total,
/// sorted most likely first. Instead of sorting the whole vocabulary, it selects the best `k`
/// (linear time), growing `k` until they hold the mass, and sorts only those.
fn nucleus(
    order: &mut Vec<u32>,
    top_p: f64,
    weight: impl Fn(u32) -> f64,
    by_value_desc: impl Fn(&u32, &u32) -> std::cmp::Ordering,
) {
    let total: f64 = order.iter().map(|&i| weight(i)).sum();
    let target = top_p * total;
    let mut k = 64.min(order.len());
    loop {
        if k < order.len() {
            order.select_nth_unstable_by(k - 1, &by_value_desc);
        }
        let head_mass: f64 = order[..k].iter().map(|&i| weight(i)).sum();
        if head_mass >= target || k == order.len() {
            break;
        }
        k = (k * 8).min(order.len());
    }
    order.truncate(k);
    order.sort_unstable_by(&by_value_desc);
    let mut mass = 0.0;
    for (n, &i) in order.iter().enumerate() {
        mass += weight(i);
        if mass >= target {
            order.truncate(n + 1);
            return;
        }
    }
}

/// Index of the largest value (the first on ties, as XLA's argmax).
pub fn argmax(values: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in values.iter().enumerate() {
        if *v > values[best] {
            best = i;
        }
    }
    best as u32
}

fn log_sum_exp(values: &[f32]) -> f32 {
    let max = values.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return max;
    }
    let sum: f64 = values.iter().map(|v| ((v - max) as f64).exp()).sum();
    max + sum.ln() as f32
}

fn top_n_of(values: &[f32], n: usize) -> Vec<u32> {
    let n = n.min(values.len());
    if n == 0 {
        return Vec::new();
    }
    let mut order: Vec<u32> = (0..values.len() as u32).collect();
    let by_value_desc = |a: &u32, b: &u32| {
        values[*b as usize]
            .total_cmp(&values[*a as usize])
            .then(a.cmp(b))
    };
    order.select_nth_unstable_by(n - 1, by_value_desc);
    order.truncate(n);
    order.sort_unstable_by(by_value_desc);
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fixed, unsorted logits row with distinct values (a reference distribution).
    fn logits() -> Vec<f32> {
        (0..50)
            .map(|i| ((i * 37 % 50) as f32) * 0.13 - 2.0)
            .collect()
    }

    fn softmax(values: &[f32]) -> Vec<f64> {
        let max = values.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let w: Vec<f64> = values.iter().map(|v| ((v - max) as f64).exp()).collect();
        let s: f64 = w.iter().sum();
        w.into_iter().map(|x| x / s).collect()
    }

    fn histogram(params: SamplingParams, logits: &[f32], draws: usize) -> Vec<usize> {
        let mut sampler = Sampler::new(params, &[]);
        let mut counts = vec![0; logits.len()];
        for _ in 0..draws {
            counts[sampler.sample(logits, None).token as usize] += 1;
        }
        counts
    }

    fn entropy(counts: &[usize]) -> f64 {
        let n: usize = counts.iter().sum();
        counts
            .iter()
            .filter(|&&c| c > 0)
            .map(|&c| {
                let p = c as f64 / n as f64;
                -p * p.ln()
            })
            .sum()
    }

    fn seeded(seed: u64) -> SamplingParams {
        SamplingParams {
            temperature: 1.0,
            seed: Some(seed),
            ..SamplingParams::greedy()
        }
    }

    #[test]
    fn temperature_one_matches_softmax_frequencies() {
        let l = logits();
        let draws = 40_000;
        let counts = histogram(seeded(7), &l, draws);
        let p = softmax(&l);
        for (i, &c) in counts.iter().enumerate() {
            let expected = p[i] * draws as f64;
            let sd = (draws as f64 * p[i] * (1.0 - p[i])).sqrt();
            assert!(
                (c as f64 - expected).abs() <= 5.0 * sd + 2.0,
                "token {i}: {c} draws, softmax expects {expected:.1} ± {sd:.1}"
            );
        }
    }

    #[test]
    fn lower_temperature_lowers_entropy() {
        let l = logits();
        let cold = entropy(&histogram(
            SamplingParams {
                temperature: 0.5,
                ..seeded(1)
            },
            &l,
            20_000,
        ));
        let warm = entropy(&histogram(
            SamplingParams {
                temperature: 1.5,
                ..seeded(1)
            },
            &l,
            20_000,
        ));
        assert!(
            cold < warm,
            "entropy at T=0.5 {cold} not below T=1.5 {warm}"
        );
    }

    #[test]
    fn top_k_never_samples_outside_the_k_best() {
        let l = logits();
        let k = 5;
        let counts = histogram(
            SamplingParams {
                top_k: Some(k),
                temperature: 3.0,
                ..seeded(3)
            },
            &l,
            5_000,
        );
        let mut best: Vec<usize> = (0..l.len()).collect();
        best.sort_by(|a, b| l[*b].total_cmp(&l[*a]));
        for (i, &c) in counts.iter().enumerate() {
            if best[..k].contains(&i) {
                assert!(c > 0, "top-{k} token {i} never drawn at T=3");
            } else {
                assert_eq!(c, 0, "token {i} is outside the top {k} but was drawn");
            }
        }
    }

    #[test]
    fn top_p_keeps_the_smallest_set_reaching_the_mass() {
        let l = logits();
        let p = softmax(&l);
        let mut order: Vec<usize> = (0..l.len()).collect();
        order.sort_by(|a, b| p[*b].total_cmp(&p[*a]));
        let top_p = 0.6;
        let mut mass = 0.0;
        let mut nucleus = Vec::new();
        for &i in &order {
            nucleus.push(i);
            mass += p[i];
            if mass >= top_p {
                break;
            }
        }
        let counts = histogram(
            SamplingParams {
                top_p: top_p as f32,
                ..seeded(5)
            },
            &l,
            20_000,
        );
        for (i, &c) in counts.iter().enumerate() {
            if nucleus.contains(&i) {
                assert!(c > 0, "token {i} in the nucleus never drawn");
            } else {
                assert_eq!(c, 0, "token {i} outside the {top_p} nucleus was drawn");
            }
        }
    }

    #[test]
    fn the_nucleus_of_a_large_vocabulary_equals_the_full_sort() {
        // A vocabulary far larger than the first selection, with a peaked and a flat tail.
        let values: Vec<f32> = (0..20_000u32)
            .map(|i| ((i.wrapping_mul(2_654_435_761) % 10_007) as f32) / 900.0)
            .collect();
        let max = values.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let weight = |i: u32| ((values[i as usize] - max) as f64).exp();
        let by_value_desc = |a: &u32, b: &u32| {
            values[*b as usize]
                .total_cmp(&values[*a as usize])
                .then(a.cmp(b))
        };
        for top_p in [0.01, 0.3, 0.9, 0.999] {
            let mut sorted: Vec<u32> = (0..values.len() as u32).collect();
            sorted.sort_by(by_value_desc);
            let total: f64 = sorted.iter().map(|&i| weight(i)).sum();
            let mut mass = 0.0;
            let keep = sorted
                .iter()
                .position(|&i| {
                    mass += weight(i);
                    mass >= top_p * total
                })
                .unwrap()
                + 1;
            let mut order: Vec<u32> = (0..values.len() as u32).collect();
            nucleus(&mut order, top_p, weight, by_value_desc);
            assert_eq!(order, sorted[..keep], "top_p {top_p}");
        }
    }

    #[test]
    fn min_p_drops_tokens_under_the_threshold() {
        let l = logits();
        let p = softmax(&l);
        let p_max = p.iter().copied().fold(0.0, f64::max);
        let min_p = 0.3;
        let counts = histogram(SamplingParams { min_p, ..seeded(9) }, &l, 20_000);
        for (i, &c) in counts.iter().enumerate() {
            if p[i] >= min_p as f64 * p_max {
                assert!(c > 0, "token {i} above the min-p threshold never drawn");
            } else {
                assert_eq!(c, 0, "token {i} under the min-p threshold was drawn");
            }
        }
    }

    #[test]
    fn same_seed_same_tokens_other_seed_other_tokens() {
        let l = logits();
        let run = |seed| {
            let mut s = Sampler::new(seeded(seed), &[]);
            (0..64)
                .map(|_| s.sample(&l, None).token)
                .collect::<Vec<_>>()
        };
        assert_eq!(run(42), run(42));
        assert_ne!(run(42), run(43));
    }

    #[test]
    fn greedy_takes_the_argmax_and_penalties_move_it() {
        let mut l = vec![0.0f32; 8];
        l[3] = 2.0;
        l[5] = 1.5;
        let mut plain = Sampler::new(SamplingParams::greedy(), &[]);
        assert_eq!(plain.sample(&l, None).token, 3);

        let mut rep = Sampler::new(
            SamplingParams {
                repetition_penalty: 2.0,
                ..SamplingParams::greedy()
            },
            &[3],
        );
        assert!(!rep.params().uses_in_graph_argmax());
        // 2.0 / 2 = 1.0 < 1.5: the seen token loses.
        assert_eq!(rep.sample(&l, None).token, 5);

        let mut freq = Sampler::new(
            SamplingParams {
                frequency_penalty: 0.3,
                ..SamplingParams::greedy()
            },
            &[],
        );
        freq.observe(3);
        assert_eq!(freq.sample(&l, None).token, 3, "2.0 - 0.3 > 1.5");
        freq.observe(3);
        assert_eq!(freq.sample(&l, None).token, 5, "2.0 - 0.6 < 1.5");
    }

    #[test]
    fn repetition_penalty_multiplies_negative_logits_once() {
        let l = vec![-1.0f32, -2.0, -3.0];
        let mut s = Sampler::new(
            SamplingParams {
                repetition_penalty: 4.0,
                ..SamplingParams::greedy()
            },
            &[0],
        );
        s.observe(0);
        // Token 0 is in prompt and output; penalised once: -4 < -2.
        let out = s.sample(&l, Some(3));
        assert_eq!(out.token, 1);
        let lp0 = out.top_logprobs.iter().find(|(t, _)| *t == 0).unwrap().1;
        let expected = softmax(&[-4.0, -2.0, -3.0])[0].ln() as f32;
        assert!((lp0 - expected).abs() < 1e-5, "{lp0} vs {expected}");
    }

    #[test]
    fn logprobs_are_the_log_softmax_sorted() {
        let l = logits();
        let reference = softmax(&l);
        let mut s = Sampler::new(SamplingParams::greedy(), &[]);
        let out = s.sample(&l, Some(4));
        assert_eq!(out.top_logprobs.len(), 4);
        assert_eq!(out.top_logprobs[0].0, out.token);
        for w in out.top_logprobs.windows(2) {
            assert!(w[0].1 >= w[1].1);
        }
        for &(t, lp) in &out.top_logprobs {
            assert!((lp as f64 - reference[t as usize].ln()).abs() < 1e-5);
        }
        let again = s.logprobs_of(&l, out.token, 4);
        assert_eq!(again, out);
    }

    #[test]
    fn out_of_range_parameters_are_refused_by_name() {
        let cases = [
            (
                SamplingParams {
                    temperature: -1.0,
                    ..Default::default()
                },
                "temperature",
            ),
            (
                SamplingParams {
                    top_p: 0.0,
                    ..Default::default()
                },
                "top_p",
            ),
            (
                SamplingParams {
                    min_p: 1.5,
                    ..Default::default()
                },
                "min_p",
            ),
            (
                SamplingParams {
                    top_k: Some(0),
                    ..Default::default()
                },
                "top_k",
            ),
            (
                SamplingParams {
                    repetition_penalty: 0.0,
                    ..Default::default()
                },
                "repetition_penalty",
            ),
            (
                SamplingParams {
                    presence_penalty: 3.0,
                    ..Default::default()
                },
                "presence_penalty",
            ),
            (
                SamplingParams {
                    frequency_penalty: f32::NAN,
                    ..Default::default()
                },
                "frequency_penalty",
            ),
        ];
        for (params, field) in cases {
            let err = params.validate().unwrap_err();
            assert_eq!(err.field, field);
            assert!(err.to_string().contains(field));
        }
        assert!(SamplingParams::greedy().validate().is_ok());
    }
}
