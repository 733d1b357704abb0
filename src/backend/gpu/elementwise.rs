//! Gated activations, residual add, row selection and a grammar's token masks.

use crate::backend::{Activation, Allowed};
use crate::error::Result;

use super::buffers::Meta;
use super::encoder::f;
use super::pipelines::{wgsl, Shader, GATE};
use super::{groups, shape_check, GpuBackend, Tensor};

const ELEMENTWISE: Shader = Shader { name: "elementwise", source: wgsl!("elementwise"), includes: &[GATE], snippets: &[] };

impl GpuBackend {
    pub(super) fn glu_rows(&self, gate: &Tensor, up: &Tensor, act: Activation) -> Result<Tensor> {
        shape_check(gate.rows * gate.cols == up.rows * up.cols, "glu")?;
        let out = self.tensor(gate.rows, gate.cols)?;
        let n = gate.rows * gate.cols;
        let (a, b) = act.sigmoid_coefficients();
        let kernel = self.kernel(&ELEMENTWISE, "glu", &[])?;
        self.dispatch(&kernel, &[n as u32, 0, f(a), f(b)], &[gate.bind(1), up.bind(2), out.bind(4)], groups(n, 256)?)?;
        Ok(out)
    }

    pub(super) fn add_rows(&self, x: &mut Tensor, y: &Tensor) -> Result<()> {
        shape_check(x.rows * x.cols == y.rows * y.cols, "add")?;
        let n = x.rows * x.cols;
        let kernel = self.kernel(&ELEMENTWISE, "add_assign", &[])?;
        self.dispatch(&kernel, &[n as u32, 0, 0, 0], &[y.bind(1), x.bind(4)], groups(n, 256)?)
    }

    pub(super) fn gather_rows(&self, x: &Tensor, rows: &[u32]) -> Result<Tensor> {
        shape_check(rows.iter().all(|&r| (r as usize) < x.rows), "select_rows")?;
        let out = self.tensor(rows.len(), x.cols)?;
        let n = rows.len() * x.cols;
        let idx = self.meta(Meta::Rows, rows, |r| r.to_vec())?;
        let kernel = self.kernel(&ELEMENTWISE, "select_rows", &[])?;
        self.dispatch(
            &kernel,
            &[n as u32, x.cols as u32, 0, 0],
            &[x.bind(1), (3, &idx, idx.size()), out.bind(4)],
            groups(n, 256)?,
        )?;
        Ok(out)
    }

    /// The bitsets go up as they are (a row of Qwen's vocabulary: 19 KB); only the masked
    /// logits stay, on the device.
    pub(super) fn mask_rows(&self, x: &mut Tensor, allowed: &Allowed) -> Result<()> {
        shape_check(allowed.rows() == x.rows && allowed.cols() == x.cols, "mask")?;
        let bits: Vec<u8> = allowed.bits().iter().flat_map(|w| w.to_le_bytes()).collect();
        let bits = Tensor { buf: self.pool.upload(&self.device, &bits)?, rows: x.rows, cols: allowed.words() };
        let n = x.rows * x.cols;
        let kernel = self.kernel(&ELEMENTWISE, "mask", &[])?;
        self.dispatch(&kernel, &[n as u32, x.cols as u32, 0, 0], &[bits.bind(3), x.bind(4)], groups(n, 256)?)
    }
}
