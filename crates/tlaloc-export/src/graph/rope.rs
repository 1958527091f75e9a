//! RoPE cos/sin tables, computed at export time exactly as transformers computes them, so that
//! every rope variant (default, linear, llama3) is a pair of weight slots gathered by position
//! and no sine or cosine appears in the graph.
//!
//! transformers builds `inv_freq` in f32 (`1 / theta ** (arange(0, d, 2) / d)`), rescales it for
//! linear and llama3 scaling in f32, forms `freqs = inv_freq * position` in f32 and takes
//! `cos`/`sin` of those f32 angles. The same steps are taken here in f32; only the final
//! `cos`/`sin` are evaluated in f64 and rounded, which is the correctly rounded f32 result.

use crate::config::RopeScaling;

/// The per-pair inverse frequencies (`head_dim / 2` of them) after scaling.
pub fn inv_freq(theta: f64, head_dim: usize, scaling: &RopeScaling) -> Vec<f32> {
    let half = head_dim / 2;
    let base = theta as f32;
    let default: Vec<f32> = (0..half)
        .map(|i| {
            let exponent = (2 * i) as f32 / head_dim as f32;
            1.0f32 / base.powf(exponent)
        })
        .collect();
    match *scaling {
        RopeScaling::None => default,
        RopeScaling::Linear { factor } => default.iter().map(|f| f / factor as f32).collect(),
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => {
            let factor = factor as f32;
            let low = low_freq_factor as f32;
            let high = high_freq_factor as f32;
            let old_context = original_max_position_embeddings as f32;
            let low_freq_wavelen = old_context / low;
            let high_freq_wavelen = old_context / high;
            default
                .iter()
                .map(|&f| {
                    let wavelen = 2.0 * std::f32::consts::PI / f;
                    let scaled = if wavelen > low_freq_wavelen {
                        f / factor
                    } else {
                        f
                    };
                    let medium = wavelen >= high_freq_wavelen && wavelen <= low_freq_wavelen;
                    if medium {
                        let smooth = (old_context / wavelen - low) / (high - low);
                        (1.0 - smooth) * scaled / factor + smooth * scaled
                    } else {
                        scaled
                    }
                })
                .collect()
        }
    }
}

/// `(cos, sin)` tables of `[positions, head_dim]` f32, row-major, in transformers' layout
/// (`cat(freqs, freqs)` along the last dim).
pub fn tables(
    theta: f64,
    head_dim: usize,
    scaling: &RopeScaling,
    positions: usize,
) -> (Vec<f32>, Vec<f32>) {
    let inv = inv_freq(theta, head_dim, scaling);
    let half = head_dim / 2;
    let mut cos = Vec::with_capacity(positions * head_dim);
    let mut sin = Vec::with_capacity(positions * head_dim);
    for p in 0..positions {
        let row: Vec<f32> = inv.iter().map(|&f| f * p as f32).collect();
        for _ in 0..2 {
            for &angle in &row[..half] {
                cos.push(f64::from(angle).cos() as f32);
                sin.push(f64::from(angle).sin() as f32);
            }
        }
    }
    (cos, sin)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_rope_first_pair_is_position_angle() {
        let (cos, sin) = tables(10000.0, 8, &RopeScaling::None, 3);
        // inv_freq[0] = 1, so row p starts with cos(p) and its second half repeats the first.
        assert_eq!(cos[2 * 8], 2f64.cos() as f32);
        assert_eq!(sin[8 + 4], 1f64.sin() as f32);
        assert_eq!(cos[8..12], cos[12..16]);
    }

    #[test]
    fn linear_scaling_divides_frequencies() {
        let plain = inv_freq(10000.0, 16, &RopeScaling::None);
        let linear = inv_freq(10000.0, 16, &RopeScaling::Linear { factor: 4.0 });
        for (p, l) in plain.iter().zip(&linear) {
            assert_eq!(*l, p / 4.0);
        }
    }
}
