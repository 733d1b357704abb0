//! Embedding lookup: rows of the (possibly quantized, possibly split) table.

use crate::error::{Error, Result};

use super::buffers::Meta;
use super::encoder::f;
use super::pipelines::{wgsl, Shader, DEQUANT};
use super::{groups, GpuBackend, Tensor, Weight};

const EMBED: Shader = Shader { name: "embed", source: wgsl!("embed"), includes: &[DEQUANT], snippets: &[] };

impl GpuBackend {
    pub(super) fn embed_rows(&self, table: &Weight, ids: &[u32], scale: f32) -> Result<Tensor> {
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= table.rows()) {
            return Err(Error::InvalidArgument(format!(
                "token id {id} is outside the vocabulary of {} tokens",
                table.rows()
            )));
        }
        let (m, k) = (ids.len(), table.cols());
        let out = self.tensor(m, k)?;
        let ids_buf = self.meta(Meta::TokenIds, ids, |ids| ids.to_vec())?;
        let kernel = self.kernel(&EMBED, "embed", &[("DTYPE", table.dtype().name())])?;
        for part in &table.0.parts {
            let (wbuf, wbytes) = part.bind();
            self.dispatch(
                &kernel,
                &[m as u32, k as u32, part.row0, part.rows, f(scale), part.at],
                &[(1, &ids_buf, ids_buf.size()), (2, wbuf, wbytes), out.bind(3)],
                groups(m * k.div_ceil(4), 64)?,
            )?;
        }
        Ok(out)
    }
}
