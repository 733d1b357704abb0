//! Rotate-half RoPE at explicit positions.

use crate::backend::rope_table;
use crate::error::Result;

use super::buffers::Meta;
use super::pipelines::ROPE;
use super::{groups, shape_check, GpuBackend, Tensor};

/// The `(cos, sin)` table of [`rope_table`] as the shader reads it.
fn table(key: &[u32]) -> Vec<u32> {
    let (head_dim, theta, positions) = (key[0] as usize, f32::from_bits(key[1]), &key[2..]);
    rope_table(positions, head_dim, theta).into_iter().flat_map(|(cos, sin)| [cos.to_bits(), sin.to_bits()]).collect()
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
