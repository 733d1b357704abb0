//! Sampling's read-back where it keeps the whole vocabulary ([`crate::backend::Backend::draw`]):
//! each row's token and one probability, 8 bytes, instead of the row.

use std::future::Future;

use crate::backend::draw::{Draw, Drawn};
use crate::error::Result;

use super::buffers::u32_bytes;
use super::encoder::f;
use super::pipelines::{wgsl, Shader, ORDER, WORKGROUP_SUM};
use super::{groups, GpuBackend, Tensor};

const DRAW: Shader = Shader { name: "draw", source: wgsl!("draw"), includes: &[ORDER, WORKGROUP_SUM], snippets: &[] };

impl GpuBackend {
    pub(super) fn draw_rows(&self, x: &Tensor, draw: &Draw) -> impl Future<Output = Result<Vec<Drawn>>> {
        let started = draw.check(x.rows, x.cols).and_then(|()| self.record_draw(x, draw));
        async move {
            let words: Vec<u32> =
                started?.await?.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
            Ok(words.chunks_exact(2).map(|w| Drawn { token: w[0], p_at: f32::from_bits(w[1]) }).collect())
        }
    }

    fn record_draw(&self, x: &Tensor, draw: &Draw) -> Result<impl Future<Output = Result<Vec<u8>>>> {
        let out = self.tensor(x.rows, 2)?;
        let words = draw.packed();
        let side = Tensor { buf: self.pool.upload(&self.device, &u32_bytes(&words))?, rows: 1, cols: words.len() };
        let params = [x.rows as u32, x.cols as u32, f(draw.temperature), draw.seed as u32, (draw.seed >> 32) as u32];
        let binds = [x.bind(1), out.bind(3), side.bind(4)];
        self.dispatch(&self.kernel(&DRAW, "draw", &[])?, &params, &binds, groups(x.rows, 1)?)?;
        Ok(self.download(out.buf.buffer(), out.bytes()))
    }
}
