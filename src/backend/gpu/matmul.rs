//! `x [m, k] @ W[n, k]^T (+ bias)` with W decoded in the kernel. M = 1 (decode) and small M
//! (verification, tree steps) decode each weight value once for up to 8 activation rows; larger M
//! (prefill) uses the tiled kernel. A weight split into parts is one dispatch per part, each
//! writing its own columns of the output. The pass can also add its output to a residual or gate
//! it by another tensor (`Epilogue`), sparing the separate kernel and its dispatch; a layer's
//! Q, K and V (or Q and K), loaded together into one buffer, run as one weight whose columns go
//! to three (two) outputs (`matmul_together`); and a gated unit's gate and up projections,
//! loaded together, run as one pass that writes the gated output (`gated_together`).

use std::sync::Arc;

use crate::backend::{all_ok, Activation};
use crate::error::{Error, Result};
use crate::storage::quant::DType;

use super::encoder::f;
use super::pipelines::{wgsl, Shader, DEQUANT, GATE};
use super::weights::{Part, Parts};
use super::{groups, shape_check, GpuBackend, Tensor, Weight};

/// The matmul's kernels; the units (units.wgsl) are its own.
const MATMUL: Shader = Shader {
    name: "matmul",
    source: wgsl!("matmul"),
    includes: &[DEQUANT, wgsl!("units"), GATE],
    snippets: &[
        ("@outs_one", wgsl!("outs_one")),
        ("@outs_two", wgsl!("outs_two")),
        ("@outs_three", wgsl!("outs_three")),
        ("@sums_workgroup", wgsl!("sums_workgroup")),
        ("@sums_subgroup", wgsl!("sums_subgroup")),
        ("@x_vec4", wgsl!("x_vec4")),
        ("@x_scalar", wgsl!("x_scalar")),
    ],
};

/// Activation rows up to which the split-K kernel beats the tiled one.
const SMALL_M: usize = 64;
const TILE: usize = 32;
/// Weight rows per `matmul_rows` workgroup: each activation value loaded serves this many rows.
const NR: usize = 4;
/// Activation rows per `matmul_rows` workgroup. Each thread keeps NR x MT accumulators in
/// registers; wider tiles spill them (on lavapipe one 64-row pass costs over three times eight
/// 8-row passes), so batches above 8 rows take one pass over the weight per 8 rows.
const MAX_MT: usize = 8;
/// The most threads of a `matmul_rows` workgroup: their NR x MT partial sums must fit the 16 KiB
/// of workgroup memory every WebGPU device has.
const MAX_WG: u32 = 64;
/// `matmul_rows` threads on a CPU adapter that reports no subgroup size.
const CPU_VECTOR_LANES: u32 = 4;

/// What the matmul does with each output value (matmul.wgsl's `store`).
pub(super) enum Epilogue<'a> {
    /// Writes it.
    Store,
    /// Adds it to what the output holds: a residual connection.
    Add,
    /// Writes `act(gate) * value`: the up projection of a gated unit, given its gate projection.
    Gate(&'a Tensor, Activation),
    /// Writes `act(gate) * up`, W being a gated unit's gate and up projections one after the
    /// other: both projections and the gating in one pass (matmul.wgsl's PAIRED).
    Paired(Activation),
}

/// Threads per `matmul_rows` workgroup for the options, whether the adapter computes on the CPU
/// and its subgroup size where the adapter reports one fixed size (whether or not the device
/// reduces within subgroups). A CPU runs a subgroup as the lanes of its vectors: a one-subgroup
/// workgroup walks K in several times the steps of 64 threads and, with subgroups, its sums end
/// within the subgroup with no second stage over workgroup memory (half the time of the Q8_0
/// output head on lavapipe). A CPU adapter that reports no size (a browser's fallback adapter,
/// SwiftShader) gets 4 threads, a 128-bit vector's f32 lanes: there 64 threads cost 2-6x as much
/// as 4 (docs/measurements.md, "Decode workgroups on SwiftShader"). A GPU keeps 64 threads.
pub(super) fn matvec_threads(asked: Option<u32>, cpu_adapter: bool, fixed_subgroup: Option<u32>) -> Result<u32> {
    match (asked, fixed_subgroup) {
        (Some(n), _) if !(1..=MAX_WG).contains(&n) => {
            Err(Error::InvalidArgument(format!("matmul workgroup threads must be 1 to {MAX_WG}, not {n}")))
        }
        (Some(n), _) => Ok(n),
        (None, _) if !cpu_adapter => Ok(MAX_WG),
        (None, Some(lanes)) if lanes > MAX_WG => Ok(MAX_WG),
        (None, Some(lanes)) if lanes > 0 => Ok(lanes),
        (None, _) => Ok(CPU_VECTOR_LANES),
    }
}

/// The unit in which `matmul_rows` takes a weight row (units.wgsl): 16 values of a K-quant
/// block, whose scales are decoded once for them (on lavapipe Q4_K's matvec takes 0.6x the time of
/// four-value units); 16 values of a 4- or 5-bit 32-value block, the low and high nibbles of two
/// words, its scale fields read once (1.1-1.15x faster there than 8 values from one word); four
/// values of Q8_0 and the float types, where larger units
/// gained nothing there (docs/measurements.md, "Units of the decode matmul" and "Where a decode's
/// time goes, and vector loads of the activations").
fn unit(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 | DType::Q8_0 => "4",
        _ => dtype.name(),
    }
}

impl GpuBackend {
    /// How `matmul_rows` adds up its threads' partial dots (a snippet's name, see pipelines.rs).
    fn sums(&self) -> &'static str {
        if self.subgroups() { "@sums_subgroup" } else { "@sums_workgroup" }
    }

    pub(super) fn matmul_weight(&self, x: &Tensor, w: &Weight, bias: Option<&Weight>) -> Result<Tensor> {
        let out = self.tensor(x.rows, w.rows())?;
        self.matmul_into(x, w, bias, &out, Epilogue::Store)?;
        Ok(out)
    }

    /// `x @ w^T (+ bias)` into `out` (`[x.rows, w.rows]`), as `epilogue` says.
    pub(super) fn matmul_into(&self, x: &Tensor, w: &Weight, bias: Option<&Weight>, out: &Tensor, epilogue: Epilogue) -> Result<()> {
        self.record_matmul(x, w, bias, &[out], epilogue)
    }

    /// [`GpuBackend::matmul`] of `x` by two or three weights in one dispatch, where they were
    /// loaded together ([`GpuBackend::upload_together`]), their biases too or none of them: `None`
    /// where they were not.
    pub(super) fn matmul_together<const N: usize>(&self, x: &Tensor, ws: [(&Weight, Option<&Weight>); N]) -> Result<Option<[Tensor; N]>> {
        if !(2..=3).contains(&N) {
            return Ok(None);
        }
        let Some(w) = side_by_side(&ws.map(|(w, _)| w)) else { return Ok(None) };
        let bias = match ws.map(|(_, b)| b) {
            b if b.iter().all(Option::is_none) => None,
            b => match b.into_iter().collect::<Option<Vec<_>>>().and_then(|b| side_by_side(&b)) {
                Some(bias) => Some(bias),
                None => return Ok(None),
            },
        };
        let outs = all_ok(ws.map(|(w, _)| self.tensor(x.rows, w.rows())))?;
        self.record_matmul(x, &w, bias.as_ref(), &outs.each_ref(), Epilogue::Store)?;
        Ok(Some(outs))
    }

    /// [`GpuBackend::gated_matmul`] in one dispatch, where the gate and up projections were loaded
    /// together and the batch takes `matmul_rows`: `None` elsewhere (the tiled kernel of a prefill
    /// runs them as two passes).
    pub(super) fn gated_together(&self, x: &Tensor, gate: &Weight, up: &Weight, act: Activation) -> Result<Option<Tensor>> {
        if x.rows > SMALL_M || gate.rows() != up.rows() {
            return Ok(None);
        }
        let Some(w) = side_by_side(&[gate, up]) else { return Ok(None) };
        let out = self.tensor(x.rows, up.rows())?;
        self.record_matmul(x, &w, None, &[&out], Epilogue::Paired(act))?;
        Ok(Some(out))
    }

    /// `x @ w^T (+ bias)` into `outs`: one tensor `[x.rows, w.rows]`, as `epilogue` says, or where
    /// `w` is two or three weights one after the other, stored in as many (outs_two.wgsl,
    /// outs_three.wgsl); or, for [`Epilogue::Paired`], the gated output, half as wide as `w` is
    /// tall.
    fn record_matmul(&self, x: &Tensor, w: &Weight, bias: Option<&Weight>, outs: &[&Tensor], epilogue: Epilogue) -> Result<()> {
        let out = outs[0];
        let widths: Vec<usize> = outs.iter().map(|o| o.cols).collect();
        let paired = matches!(epilogue, Epilogue::Paired(_));
        let (m, n, k) = (x.rows, widths.iter().sum::<usize>(), w.cols());
        let columns = if paired { 2 * n } else { n };
        shape_check(k == x.cols && outs.iter().all(|o| o.rows == m) && columns == w.rows(), "matmul")?;
        debug_assert!(outs.len() == 1 || matches!(epilogue, Epilogue::Store));
        let bias = bias.map(|b| b.vector(n, "matmul bias")).transpose()?;
        // The codes matmul.wgsl's `store` switches on (PAIRED writes without it).
        let (code, side, (ga, gb)) = match epilogue {
            Epilogue::Store => (0, x, (0.0, 0.0)),
            Epilogue::Add => (1, x, (0.0, 0.0)),
            Epilogue::Gate(gate, act) => {
                shape_check(gate.rows == m && gate.cols == n, "gated matmul")?;
                (2, gate, act.sigmoid_coefficients())
            }
            Epilogue::Paired(act) => (0, x, act.sigmoid_coefficients()),
        };
        let tiled = m > SMALL_M;
        debug_assert!(!(tiled && paired), "the tiled kernel does not pair");
        let (nr, mt) = if tiled { (1, 1) } else { (NR, rows_per_group(m)) };
        // The tiled kernel's 64 threads are fixed; WG sizes only the sums it shares.
        let wg = if tiled { MAX_WG } else { self.matvec_threads };
        let (nr_s, mt_s, wg_s) = (nr.to_string(), mt.to_string(), wg.to_string());
        let kernel = self.kernel(
            &MATMUL,
            if tiled { "matmul_tiled" } else { "matmul_rows" },
            &[
                ("DTYPE", w.dtype().name()),
                ("UNIT", unit(w.dtype())),
                ("NR", &nr_s),
                ("MT", &mt_s),
                ("UNROLLED_MT", &UNROLLED_MT.to_string()),
                ("WG", &wg_s),
                ("SUMS", self.sums()),
                ("X", if k % 4 == 0 { "@x_vec4" } else { "@x_scalar" }),
                ("OUTS", ["@outs_one", "@outs_two", "@outs_three"][outs.len() - 1]),
                ("PAIRED", if paired { "true" } else { "false" }),
                // The tiled kernel computes in f32, whatever the units would.
                ("F", if tiled { "f32" } else { self.arithmetic }),
            ],
        )?;
        // Without a bias the kernel never reads binding 3; x stands in for it.
        let (bias_buf, bias_bytes, bias_at) = match bias {
            Some((b, at)) => (b, b.size(), at),
            None => (x.buf.buffer(), x.bytes(), 0),
        };
        let split1 = widths[0] as u32;
        let split2 = split1 + widths.get(1).copied().unwrap_or(0) as u32;
        for part in &w.0.parts {
            // A paired weight is one part (`side_by_side`), its outputs as many as either half's rows.
            let rows = if paired { n } else { part.rows as usize };
            let wgs = if tiled {
                groups(rows, TILE)? * groups(m, TILE)?
            } else {
                groups(rows, if paired { nr / 2 } else { nr })? * groups(m, mt)?
            };
            let (wbuf, wbytes) = part.bind();
            let params = [
                m as u32, n as u32, k as u32, part.row0, rows as u32, bias.is_some() as u32, code, f(ga), f(gb),
                part.at, bias_at, split1, split2,
            ];
            // Where the epilogue takes no side input, x stands in for it, as for a bias.
            let mut binds = vec![x.bind(1), (2, wbuf, wbytes), (3, bias_buf, bias_bytes), out.bind(4), side.bind(5)];
            binds.extend(outs[1..].iter().zip(6..).map(|(o, at)| o.bind(at)));
            self.dispatch(&kernel, &params, &binds, wgs)?;
        }
        Ok(())
    }
}

/// Up to how many activation rows `matmul_rows` unrolls its loop over a group's rows, which then
/// has no early exit at the batch's end. On lavapipe the exit kept the loop from unrolling, and
/// unrolled a decode's matmul took 0.78-0.84 of the time (the Qwen 0.5B's shapes, every weight
/// type); from four rows on, unrolled, Q6_K's took 1.15x the time and Q4_K's 0.85x, so there the
/// loop keeps its exit (docs/measurements.md, "A loop over a group's rows without an exit").
const UNROLLED_MT: usize = 3;

/// Activation rows per `matmul_rows` workgroup (MT) for a batch of `m`: the batch itself up to
/// [`UNROLLED_MT`] (so that no row is computed for nothing), else a power of two up to [`MAX_MT`].
fn rows_per_group(m: usize) -> usize {
    match m.max(1) {
        m if m <= UNROLLED_MT => m,
        m => m.next_power_of_two().min(MAX_MT),
    }
}

/// The one weight that `ws` make where they lie one after the other in one buffer (as
/// [`GpuBackend::upload_together`] stores them), each whole in one part.
fn side_by_side(ws: &[&Weight]) -> Option<Weight> {
    let parts: Vec<&Part> = ws
        .iter()
        .map(|w| match &w.0.parts[..] {
            [p] => Some(p),
            _ => None,
        })
        .collect::<Option<_>>()?;
    let vectors = ws[0].dtype() == DType::F32 && ws.iter().all(|w| w.rows() == 1 || w.cols() == 1);
    // Where each starts in the buffer: rows of a matrix, values of a vector.
    let len = |w: &Weight| if vectors { w.rows() * w.cols() } else { w.rows() } as u32;
    let adjacent = (1..ws.len()).all(|i| parts[i].buf == parts[i - 1].buf && parts[i].at == parts[i - 1].at + len(ws[i - 1]));
    let alike = ws.iter().all(|w| w.dtype() == ws[0].dtype() && (vectors || w.cols() == ws[0].cols()));
    if !(adjacent && alike) {
        return None;
    }
    let total: usize = ws.iter().map(|w| len(w) as usize).sum();
    let (rows, cols) = if vectors { (1, total) } else { (total, ws[0].cols()) };
    let part = Part { buf: parts[0].buf.clone(), row0: 0, rows: rows as u32, at: parts[0].at };
    Some(Weight(Arc::new(Parts { dtype: ws[0].dtype(), rows, cols, parts: vec![part] })))
}

#[cfg(test)]
mod tests {
    use super::{matvec_threads, rows_per_group, MAX_MT, UNROLLED_MT};

    #[test]
    fn unrolled_groups_hold_the_batch_itself() {
        for (m, mt) in [(0, 1), (1, 1), (2, 2), (3, 3), (4, 4), (5, 8), (8, 8), (9, 8), (64, 8)] {
            assert_eq!(rows_per_group(m), mt, "{m} rows");
        }
        for m in 1..=64 {
            let mt = rows_per_group(m);
            assert!(mt <= MAX_MT && (mt > UNROLLED_MT || m % mt == 0), "{m} rows: groups of {mt}");
        }
    }

    #[test]
    fn matvec_workgroups_are_one_cpu_subgroup_or_64_threads() {
        assert_eq!(matvec_threads(None, true, Some(8)).unwrap(), 8);
        assert_eq!(matvec_threads(None, false, Some(32)).unwrap(), 64);
        assert_eq!(matvec_threads(None, false, None).unwrap(), 64);
        assert_eq!(matvec_threads(None, true, None).unwrap(), 4);
        assert_eq!(matvec_threads(None, true, Some(0)).unwrap(), 4);
        assert_eq!(matvec_threads(None, true, Some(128)).unwrap(), 64);
        assert_eq!(matvec_threads(Some(5), false, None).unwrap(), 5);
        for bad in [0, 65, u32::MAX] {
            assert!(matvec_threads(Some(bad), true, Some(8)).is_err(), "{bad} threads");
        }
    }
}
