//! Llama 2 and 3.x (and SmolLM2, which shares the layout). Llama 3's RoPE frequency scaling
//! comes from the file: GGUF's `rope_freqs` factors, or config.json's `rope_scaling`.

use super::{Arch, Family, BASE};

pub(super) const FAMILY: Family =
    Family { arch: Arch::Llama, gguf: "llama", hf: &["llama"], gguf_interleaved_qk: true, ..BASE };

/// The `llama3` rope type's per-frequency divisors for a `rotary_dim`-wide rotation: long
/// wavelengths are slowed by `factor`, short ones kept, and the band between blended.
pub fn llama3_factors(
    rotary_dim: usize,
    theta: f32,
    factor: f64,
    low_freq_factor: f64,
    high_freq_factor: f64,
    original_context: f64,
) -> Vec<f32> {
    let low_wavelen = original_context / low_freq_factor;
    let high_wavelen = original_context / high_freq_factor;
    (0..rotary_dim / 2)
        .map(|i| {
            let freq = (theta as f64).powf(-2.0 * i as f64 / rotary_dim as f64);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                factor as f32
            } else {
                let smooth = (original_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                (1.0 / ((1.0 - smooth) / factor + smooth)) as f32
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama3_factors_keep_short_wavelengths_and_slow_long_ones() {
        // Llama 3.2's settings.
        let f = llama3_factors(64, 500000.0, 32.0, 1.0, 4.0, 8192.0);
        assert_eq!(f.len(), 32);
        assert_eq!(f[0], 1.0);
        assert_eq!(f[31], 32.0);
        assert!(f.windows(2).all(|w| w[0] <= w[1]), "{f:?}");
        assert!(f.iter().any(|&x| x > 1.0 && x < 32.0), "a blended band: {f:?}");
    }
}
