//! RMSNorm.

use crate::error::Result;

use super::encoder::f;
use super::pipelines::NORM;
use super::{groups, GpuBackend, Tensor, Weight};

impl GpuBackend {
    pub(super) fn rms_norm_rows(&self, x: &Tensor, w: &Weight, eps: f32) -> Result<Tensor> {
        let wbuf = w.vector(x.cols, "rms_norm")?;
        let out = self.tensor(x.rows, x.cols)?;
        let kernel = self.kernel(&NORM, "rms_norm", &[])?;
        self.dispatch(
            &kernel,
            &[x.rows as u32, x.cols as u32, f(eps)],
            &[x.bind(1), (2, wbuf, wbuf.size()), out.bind(3)],
            groups(x.rows, 1)?,
        )?;
        Ok(out)
    }
}
