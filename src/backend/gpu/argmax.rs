//! Greedy decoding's read-back: the argmax of each row on the GPU, one u32 per row to the host.

use std::future::Future;

use crate::error::Result;

use super::pipelines::{wgsl, Shader};
use super::{groups, GpuBackend, Tensor};

const ARGMAX: Shader = Shader { name: "argmax", source: wgsl!("argmax"), includes: &[], snippets: &[] };

impl GpuBackend {
    pub(super) fn argmax_rows(&self, x: &Tensor) -> impl Future<Output = Result<Vec<u32>>> {
        let rows = x.rows;
        // An empty row's argmax is 0, as on the CPU.
        let started = if x.cols == 0 { Ok(None) } else { self.record_argmax(x).map(Some) };
        async move {
            match started? {
                None => Ok(vec![0; rows]),
                Some(bytes) => {
                    Ok(bytes.await?.chunks_exact(4).take(rows).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect())
                }
            }
        }
    }

    fn record_argmax(&self, x: &Tensor) -> Result<impl Future<Output = Result<Vec<u8>>>> {
        let out = self.tensor(x.rows, 1)?;
        let kernel = self.kernel(&ARGMAX, "argmax", &[])?;
        self.dispatch(&kernel, &[x.rows as u32, x.cols as u32], &[x.bind(1), out.bind(2)], groups(x.rows, 1)?)?;
        Ok(self.download(out.buf.buffer(), out.bytes()))
    }
}
