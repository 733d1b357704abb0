//! RoPE at explicit positions.

use crate::backend::{rope_table, Rope};
use crate::error::Result;

use super::buffers::Meta;
use super::pipelines::{wgsl, Shader};
use super::{groups, shape_check, GpuBackend, Tensor};

const ROPE: Shader = Shader { name: "rope", source: wgsl!("rope"), includes: &[], snippets: &[] };

/// The key of a RoPE table: what [`rope_table`] computes it from.
fn key(positions: &[u32], rope: &Rope) -> Vec<u32> {
    let factors = rope.factors.unwrap_or(&[]);
    [rope.rotary_dim as u32, rope.theta.to_bits(), rope.freq_scale.to_bits(), rope.attn_factor.to_bits()]
        .into_iter()
        .chain([factors.len() as u32])
        .chain(factors.iter().map(|f| f.to_bits()))
        .chain(positions.iter().copied())
        .collect()
}

/// The `(cos, sin)` table of [`rope_table`] as the shader reads it, from its [`key`].
fn table(key: &[u32]) -> Vec<u32> {
    let f = |i: usize| f32::from_bits(key[i]);
    let n_factors = key[4] as usize;
    let factors: Vec<f32> = key[5..5 + n_factors].iter().map(|&b| f32::from_bits(b)).collect();
    let rope = Rope {
        head_dim: key[0] as usize,
        rotary_dim: key[0] as usize,
        theta: f(1),
        freq_scale: f(2),
        attn_factor: f(3),
        factors: (n_factors > 0).then_some(&factors[..]),
    };
    let positions = &key[5 + n_factors..];
    rope_table(positions, &rope).into_iter().flat_map(|(cos, sin)| [cos.to_bits(), sin.to_bits()]).collect()
}

impl GpuBackend {
    /// RoPE of `x` and, in the same pass, of `y` where given (a layer's Q and K) at the same
    /// positions.
    pub(super) fn rope_rows(&self, x: &mut Tensor, y: Option<&mut Tensor>, positions: &[u32], rope: &Rope) -> Result<()> {
        let fits = |t: &Tensor| positions.len() == t.rows && t.cols.is_multiple_of(rope.head_dim);
        shape_check(rope.valid() && fits(x) && y.as_deref().is_none_or(fits), "rope")?;
        let tab = self.meta(Meta::Rope, &key(positions, rope), table)?;
        let half = rope.rotary_dim / 2;
        let pairs = |t: &Tensor| t.rows * (t.cols / rope.head_dim) * half;
        let cols_y = y.as_deref().map_or(0, |y| y.cols);
        let params = [x.rows as u32, x.cols as u32, half as u32, rope.head_dim as u32, cols_y as u32];
        let mut binds = vec![x.bind(1), (2, &tab, tab.size())];
        let (entry, n) = match &y {
            Some(y) => {
                binds.push(y.bind(3));
                ("rope_pair", pairs(x) + pairs(y))
            }
            None => ("rope", pairs(x)),
        };
        let kernel = self.kernel(&ROPE, entry, &[])?;
        self.dispatch(&kernel, &params, &binds, groups(n, 64)?)
    }
}
