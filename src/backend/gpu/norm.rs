//! RMSNorm.

use crate::error::Result;

use super::encoder::f;
use super::pipelines::{wgsl, Shader};
use super::{groups, shape_check, GpuBackend, Tensor, Weight};

const NORM: Shader = Shader { name: "norm", source: wgsl!("norm"), includes: &[], snippets: &[] };

impl GpuBackend {
    /// Each group of `w`'s length of consecutive values is a row to the kernel.
    pub(super) fn rms_norm_rows(&self, x: &Tensor, w: &Weight, eps: f32) -> Result<Tensor> {
        let n = w.rows() * w.cols();
        shape_check(n > 0 && x.cols.is_multiple_of(n), "rms_norm")?;
        let (wbuf, at) = w.vector(n, "rms_norm")?;
        // Only projections and their biases are loaded together (Transformer::new).
        shape_check(at == 0, "rms_norm of a weight loaded together with others")?;
        let out = self.tensor(x.rows, x.cols)?;
        let kernel = self.kernel(&NORM, "rms_norm", &[])?;
        let rows = x.rows * (x.cols / n);
        self.dispatch(
            &kernel,
            &[rows as u32, n as u32, f(eps)],
            &[x.bind(1), (2, wbuf, wbuf.size()), out.bind(3)],
            groups(rows, 1)?,
        )?;
        Ok(out)
    }
}
