//! Rotate-half RoPE at explicit positions.

use crate::error::Result;

use super::buffers::Meta;
use super::pipelines::ROPE;
use super::{groups, shape_check, GpuBackend, Tensor};

/// `[position][i] = (cos, sin)` of `position * theta^(-2i / head_dim)`, computed as the CPU
/// backend does so both rotate by bit-identical angles.
fn table(key: &[u32]) -> Vec<u32> {
    let (head_dim, theta, positions) = (key[0] as usize, f32::from_bits(key[1]), &key[2..]);
    let half = head_dim / 2;
    let inv_freq: Vec<f32> = (0..half).map(|i| 1.0 / theta.powf(2.0 * i as f32 / head_dim as f32)).collect();
    positions
        .iter()
        .flat_map(|&pos| {
            inv_freq.iter().flat_map(move |f| {
                let (sin, cos) = (pos as f32 * f).sin_cos();
                [cos.to_bits(), sin.to_bits()]
            })
        })
        .collect()
}

impl GpuBackend {
    pub(super) fn rope_rows(&self, x: &mut Tensor, positions: &[u32], head_dim: usize, theta: f32) -> Result<()> {
        shape_check(
            positions.len() == x.rows && head_dim.is_multiple_of(2) && head_dim > 0 && x.cols.is_multiple_of(head_dim),
            "rope",
        )?;
        let key: Vec<u32> = [head_dim as u32, theta.to_bits()].into_iter().chain(positions.iter().copied()).collect();
        let tab = self.meta(Meta::Rope, &key, table)?;
        let kernel = self.kernel(&ROPE, "rope", &[])?;
        self.dispatch(
            &kernel,
            &[x.rows as u32, x.cols as u32, (head_dim / 2) as u32],
            &[x.bind(1), (2, &tab, tab.size())],
            groups(x.rows * x.cols / 2, 64)?,
        )
    }
}
