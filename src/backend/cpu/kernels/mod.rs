//! Dot products of weight rows, read in their storage type, with a few activation rows at once.
//!
//! Every format is described here once, by its layout constants, as small integers and scales:
//! - a 32-value block (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) holds integers `v` with `w = d * v + m`, dotted
//!   with [`Act32`] activations;
//! - a 256-value K-quant block (Q4_K, Q5_K, Q6_K) holds unsigned integers `v` with a scale per 16
//!   values, `w = d * sc[g] * v - dc * c[g]`, dotted with [`ActK`] activations, whose per-16 sums
//!   turn the `c` term into one small dot per block.
//!
//! Each instruction set then has one generic decoder and one generic loop per family, generic over
//! the activations' integer type too, so a format costs a few constants rather than a kernel per
//! instruction set and precision. A kernel reads every weight block once and applies it to all its
//! activation rows while it sits in registers.

use super::quantize::{Act32, ActInt, ActK, Order};
use crate::storage::quant::{f16_at, scales_mins_k4, DType, QK, QK_K};

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;
pub(crate) mod scalar;
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
pub(crate) mod wasm;
#[cfg(all(target_arch = "wasm32", target_feature = "relaxed-simd"))]
pub(crate) mod wasm_relaxed;

/// The most activation rows one kernel call takes: their accumulators stay in registers. Nine
/// covers a verification of up to 8 drafted tokens in one pass over the weights.
pub(crate) const MAX_ROWS: usize = 9;

/// `out[j * rows + i] = dot(weight row j, activation row i)` for every weight row `j` laid out back
/// to back in the first argument and `rows` (1..=[`MAX_ROWS`]) activation rows laid out back to
/// back in the second. One call covers many weight rows so that the per-call setup is paid once
/// and the row loop runs inside the kernel's instruction set. Unsafe because the SIMD kernels need
/// their instruction set, which the caller has detected.
pub(crate) type RowsFn<A> = unsafe fn(&[u8], &[A], usize, &mut [f32]);

/// A 32-value block format.
pub(crate) trait Block32 {
    const BYTES: usize;
    /// Offset of the low bits: 16 bytes of nibbles, or 32 signed bytes for Q8_0.
    const QS: usize;
    /// Offset of the 32 fifth bits of the 5-bit formats.
    const QH: Option<usize>;
    /// `m` as a multiple of `d`, or `None` where `m` is stored as an f16 right after `d`.
    const MIN: Option<f32>;
    /// Whole signed bytes (Q8_0) rather than unsigned nibbles.
    const SIGNED: bool = false;

    /// The f16 bits of `d` and of `m` (the latter unused when [`Self::MIN`] is set).
    #[inline(always)]
    fn dm_bits(b: &[u8]) -> u32 {
        u32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }

    /// `m` given `d` and the f16 bits of the stored `m`.
    #[inline(always)]
    fn min(d: f32, stored: f32) -> f32 {
        match Self::MIN {
            Some(k) => k * d,
            None => stored,
        }
    }

    /// Value `j` of a block, the portable way.
    #[inline(always)]
    fn value(b: &[u8], j: usize) -> i32 {
        if Self::SIGNED {
            return b[Self::QS + j] as i8 as i32;
        }
        let nib = (b[Self::QS + j % 16] >> (4 * (j / 16))) & 0xF;
        let high = Self::QH.map_or(0, |qh| {
            let bits = u32::from_le_bytes([b[qh], b[qh + 1], b[qh + 2], b[qh + 3]]);
            ((bits >> j) & 1) << 4
        });
        nib as i32 | high as i32
    }
}

/// The per-block integer scales of a K-quant block (see the module doc).
pub(crate) struct KScales {
    /// f16 bits of `d` (low half) and `dc` (high half).
    pub dc_bits: u32,
    pub sc: [i16; 16],
    pub c: [i16; 16],
}

/// A 256-value K-quant format: Q4_K and Q5_K share a layout (the latter with a fifth bit plane);
/// Q6_K stores 4 low bits in `ql`, 2 high bits in `qh` and a signed scale per 16 values.
pub(crate) trait BlockK {
    const BYTES: usize;
    const SIX: bool = false;
    /// The largest unsigned value and the largest scale magnitude.
    const MAX_V: i32;
    const MAX_SC: i32 = 63;
    /// Offset of the nibbles (Q4_K, Q5_K) or of `ql` (Q6_K).
    const QS: usize;
    /// Offset of the high bits: Q5_K's bit planes, Q6_K's 2-bit pairs.
    const QH: Option<usize>;

    #[inline(always)]
    fn scales(b: &[u8]) -> KScales {
        let mut sc = [0i16; 16];
        let mut c = [0i16; 16];
        if Self::SIX {
            for g in 0..16 {
                sc[g] = b[192 + g] as i8 as i16;
                c[g] = 32 * sc[g];
            }
            let d = u16::from_le_bytes([b[208], b[209]]) as u32;
            KScales { dc_bits: d | d << 16, sc, c }
        } else {
            let (s, m) = scales_mins_k4(b[4..16].try_into().expect("a K-quant block holds 12 scale bytes"));
            for g in 0..16 {
                sc[g] = (s >> (8 * (g / 2))) as u8 as i16;
                c[g] = (m >> (8 * (g / 2))) as u8 as i16;
            }
            KScales { dc_bits: u32::from_le_bytes([b[0], b[1], b[2], b[3]]), sc, c }
        }
    }

    /// Value `j` (unsigned) of a block, the portable way.
    #[inline(always)]
    fn value(b: &[u8], j: usize) -> i32 {
        let (t, l) = (j / 32, j % 32);
        if Self::SIX {
            let (n, u) = (t / 4, t % 4);
            let ql = b[Self::QS + 64 * n + 32 * (u & 1) + l] >> (4 * (u >> 1)) & 0xF;
            let qh = (b[Self::QH.unwrap() + 32 * n + l] >> (2 * u)) & 3;
            return (ql | qh << 4) as i32;
        }
        let nib = (b[Self::QS + 32 * (t / 2) + l] >> (4 * (t & 1))) & 0xF;
        let high = Self::QH.map_or(0, |qh| ((b[qh + l] >> t) & 1) << 4);
        (nib | high) as i32
    }

    /// The largest `|value * scale|`, with Q6_K's values taken unsigned or, when `signed`, less 32.
    #[inline(always)]
    fn max_product(signed: bool) -> i32 {
        if signed { (Self::MAX_V + 1) / 2 * Self::MAX_SC } else { Self::MAX_V * Self::MAX_SC }
    }
}

/// How many 32-value chunks an i32 lane can sum without overflow when it gathers `per_lane`
/// products of at most `max_w` (weight times scale) and `max_q` (activation) per chunk; at most a
/// whole K-quant block.
#[inline(always)]
pub(crate) fn chunks_per_sum(per_lane: i32, max_w: i32, max_q: i32) -> usize {
    ((i32::MAX / (per_lane * max_w * max_q)) as usize).clamp(1, QK_K / QK)
}

/// A float format: one value per element.
pub(crate) trait Float {
    const DTYPE: DType;
    const BYTES: usize;

    /// Element `j`, the portable way.
    #[inline(always)]
    fn value(b: &[u8], j: usize) -> f32 {
        let at = j * Self::BYTES;
        match Self::DTYPE {
            DType::F16 => f16_at(b, at),
            DType::BF16 => f32::from_bits((u16::from_le_bytes([b[at], b[at + 1]]) as u32) << 16),
            _ => f32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]),
        }
    }
}

macro_rules! formats {
    ($($name:ident: $tr:ident { $($c:ident: $t:ty = $v:expr),* })*) => {$(
        #[allow(non_camel_case_types)]
        pub(crate) struct $name;
        impl $tr for $name { $(const $c: $t = $v;)* }
    )*};
}

formats! {
    Q4_0: Block32 { BYTES: usize = 18, QS: usize = 2, QH: Option<usize> = None, MIN: Option<f32> = Some(-8.0) }
    Q4_1: Block32 { BYTES: usize = 20, QS: usize = 4, QH: Option<usize> = None, MIN: Option<f32> = None }
    Q5_0: Block32 { BYTES: usize = 22, QS: usize = 6, QH: Option<usize> = Some(2), MIN: Option<f32> = Some(-16.0) }
    Q5_1: Block32 { BYTES: usize = 24, QS: usize = 8, QH: Option<usize> = Some(4), MIN: Option<f32> = None }
    Q8_0: Block32 { BYTES: usize = 34, QS: usize = 2, QH: Option<usize> = None, MIN: Option<f32> = Some(0.0), SIGNED: bool = true }
    Q4K: BlockK { BYTES: usize = 144, QS: usize = 16, QH: Option<usize> = None, MAX_V: i32 = 15 }
    Q5K: BlockK { BYTES: usize = 176, QS: usize = 48, QH: Option<usize> = Some(16), MAX_V: i32 = 31 }
    Q6K: BlockK { BYTES: usize = 210, QS: usize = 0, QH: Option<usize> = Some(128), SIX: bool = true, MAX_V: i32 = 63, MAX_SC: i32 = 128 }
    F32: Float { DTYPE: DType = DType::F32, BYTES: usize = 4 }
    F16: Float { DTYPE: DType = DType::F16, BYTES: usize = 2 }
    BF16: Float { DTYPE: DType = DType::BF16, BYTES: usize = 2 }
}

const _: () = assert!(QK == 32 && QK_K == 256);

/// Applies `kernel` (one weight row against `rows` activation rows) to each weight row of `w`,
/// writing `rows` results per weight row. Inlined into the caller, so the kernel inlines into the
/// loop when the caller has the kernel's instruction set.
#[inline(always)]
pub(crate) fn each_row<A>(w: &[u8], x: &[A], rows: usize, out: &mut [f32], kernel: impl Fn(&[u8], &[A], &mut [f32])) {
    let n = out.len() / rows;
    if n == 0 {
        return;
    }
    for (w, o) in w.chunks_exact(w.len() / n).zip(out.chunks_exact_mut(rows)) {
        kernel(w, x, o);
    }
}

/// Instantiates a kernel generic over `<Format, Activation, const ROWS>` for `rows` activation rows
/// and runs it on every weight row (see [`each_row`]); with `all`, the kernel takes every weight row
/// in one call.
#[cfg(any(target_arch = "x86_64", all(target_arch = "wasm32", target_feature = "simd128")))]
macro_rules! by_rows {
    (all $kernel:ident::<$($g:ty),+>($w:expr, $x:expr, $rows:expr, $out:expr)) => {{
        // SAFETY: the caller runs in the kernel's instruction set (see RowsFn).
        by_rows!(@ $rows, |N| unsafe { $kernel::<$($g),+, N>($w, $x, $out) })
    }};
    ($kernel:ident::<$($g:ty),+>($w:expr, $x:expr, $rows:expr, $out:expr)) => {{
        // SAFETY: the caller runs in the kernel's instruction set (see RowsFn).
        by_rows!(@ $rows, |N| each_row($w, $x, N, $out, |w, x, o| unsafe { $kernel::<$($g),+, N>(w, x, o) }))
    }};
    (@ $rows:expr, |$r:ident| $call:expr) => {{
        macro_rules! run {
            ($n:literal) => {{
                const $r: usize = $n;
                $call
            }};
        }
        match $rows {
            1 => run!(1),
            2 => run!(2),
            3 => run!(3),
            4 => run!(4),
            5 => run!(5),
            6 => run!(6),
            7 => run!(7),
            8 => run!(8),
            9 => run!(9),
            _ => unreachable!("at most MAX_ROWS activation rows per call"),
        }
    }};
}
#[cfg(any(target_arch = "x86_64", all(target_arch = "wasm32", target_feature = "simd128")))]
pub(crate) use by_rows;

/// The kernel of each format of a family, from an instruction set's generic kernels, for
/// activations of integer type `$t`.
macro_rules! select {
    (q32<$t:ty>: $dtype:expr, $k:ident) => {
        match $dtype {
            DType::Q4_0 => Some($k::<Q4_0, $t> as RowsFn<Act32<$t>>),
            DType::Q4_1 => Some($k::<Q4_1, $t> as RowsFn<Act32<$t>>),
            DType::Q5_0 => Some($k::<Q5_0, $t> as RowsFn<Act32<$t>>),
            DType::Q5_1 => Some($k::<Q5_1, $t> as RowsFn<Act32<$t>>),
            DType::Q8_0 => Some($k::<Q8_0, $t> as RowsFn<Act32<$t>>),
            _ => None,
        }
    };
    (qk<$t:ty>: $dtype:expr, $k:ident) => {
        match $dtype {
            DType::Q4K => Some($k::<Q4K, $t> as RowsFn<ActK<$t>>),
            DType::Q5K => Some($k::<Q5K, $t> as RowsFn<ActK<$t>>),
            DType::Q6K => Some($k::<Q6K, $t> as RowsFn<ActK<$t>>),
            _ => None,
        }
    };
    (float: $dtype:expr, $k:ident) => {
        match $dtype {
            DType::F32 => Some($k::<F32> as RowsFn<f32>),
            DType::F16 => Some($k::<F16> as RowsFn<f32>),
            DType::BF16 => Some($k::<BF16> as RowsFn<f32>),
            _ => None,
        }
    };
}
pub(crate) use select;

/// The kernels of one instruction set; `None` where it has none for a format. Quantized formats
/// have one kernel for 8-bit activations and one for 16-bit activations (`_16`).
pub(crate) struct Kernels {
    pub q32: fn(DType) -> Option<RowsFn<Act32<i8>>>,
    pub q32_16: fn(DType) -> Option<RowsFn<Act32<i16>>>,
    pub qk: fn(DType) -> Option<RowsFn<ActK<i8>>>,
    pub qk_16: fn(DType) -> Option<RowsFn<ActK<i16>>>,
    /// The orders `qk` and `qk_16` read each 32 activations in.
    pub qk_order: Order,
    pub qk_16_order: Order,
    pub float: fn(DType) -> Option<RowsFn<f32>>,
}

/// An instruction set's kernels for every format, as [`Kernels`] wants them.
macro_rules! kernels {
    ($q32:ident, $qk:ident, $order:expr, $float:expr) => {
        Kernels {
            q32: |d| select!(q32<i8>: d, $q32),
            q32_16: |d| select!(q32<i16>: d, $q32),
            qk: |d| select!(qk<i8>: d, $qk),
            qk_16: |d| select!(qk<i16>: d, $qk),
            qk_order: Order::Natural,
            qk_16_order: $order,
            float: $float,
        }
    };
}
pub(crate) use kernels;
