//! Storage types of weights, exactly as ggml defines them, and their reference dequantization.
//!
//! A block of `block_size()` values occupies `block_bytes()` bytes. The fast kernels in
//! `backend::cpu` compute on these blocks directly; the functions here are the f32 reference they
//! are tested against.

use crate::error::{Error, Result};
use half::{bf16, f16};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q4K,
    Q5K,
    Q6K,
}

pub const QK: usize = 32;
pub const QK_K: usize = 256;

impl DType {
    pub const ALL: [DType; 11] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q4K,
        DType::Q5K,
        DType::Q6K,
    ];

    /// Each type with the ggml type id stored in GGUF tensor infos.
    const GGML_IDS: [(DType, u32); 11] = [
        (DType::F32, 0),
        (DType::F16, 1),
        (DType::Q4_0, 2),
        (DType::Q4_1, 3),
        (DType::Q5_0, 6),
        (DType::Q5_1, 7),
        (DType::Q8_0, 8),
        (DType::Q4K, 12),
        (DType::Q5K, 13),
        (DType::Q6K, 14),
        (DType::BF16, 30),
    ];

    /// The type of a ggml type id stored in GGUF tensor infos.
    pub fn from_ggml(id: u32) -> Result<Self> {
        Self::GGML_IDS
            .iter()
            .find(|&&(_, i)| i == id)
            .map(|&(d, _)| d)
            .ok_or_else(|| Error::Unsupported(format!("ggml tensor type {id}")))
    }

    /// The ggml type id of this type, as GGUF tensor infos store it.
    pub fn ggml_id(self) -> u32 {
        Self::GGML_IDS.iter().find(|&&(d, _)| d == self).map(|&(_, i)| i).expect("every type has a ggml id")
    }

    pub fn block_size(self) -> usize {
        match self {
            DType::F32 | DType::F16 | DType::BF16 => 1,
            DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::Q8_0 => QK,
            DType::Q4K | DType::Q5K | DType::Q6K => QK_K,
        }
    }

    pub fn block_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Q4_0 => 18,
            DType::Q4_1 => 20,
            DType::Q5_0 => 22,
            DType::Q5_1 => 24,
            DType::Q8_0 => 34,
            DType::Q4K => 144,
            DType::Q5K => 176,
            DType::Q6K => 210,
        }
    }

    /// Bytes taken by `n` values, or an error when `n` is not a whole number of blocks or overflows.
    pub fn bytes_for(self, n: usize) -> Result<usize> {
        if n % self.block_size() != 0 {
            return Err(Error::invalid_model(format!(
                "{n} values of {self:?} are not a whole number of {}-value blocks",
                self.block_size()
            )));
        }
        (n / self.block_size())
            .checked_mul(self.block_bytes())
            .ok_or_else(|| Error::invalid_model("tensor size overflows"))
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::Q4_0 => "q4_0",
            DType::Q4_1 => "q4_1",
            DType::Q5_0 => "q5_0",
            DType::Q5_1 => "q5_1",
            DType::Q8_0 => "q8_0",
            DType::Q4K => "q4_k",
            DType::Q5K => "q5_k",
            DType::Q6K => "q6_k",
        }
    }
}

#[inline]
pub(crate) fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

impl std::str::FromStr for DType {
    type Err = Error;

    /// A name as [`DType::name`] gives it, in any case.
    fn from_str(s: &str) -> Result<Self> {
        let names = || DType::ALL.map(DType::name).join(", ");
        DType::ALL
            .into_iter()
            .find(|d| d.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| Error::InvalidArgument(format!("unknown weight type '{s}' (one of {})", names())))
    }
}

/// The 6-bit scale and min of sub-block `j` of a Q4_K/Q5_K block's packed 12-byte scales.
#[inline]
pub(crate) fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// All eight 6-bit scales and mins of a Q4_K/Q5_K block's packed 12-byte scales at once, as the
/// bytes of two little-endian words: [`scale_min_k4`] for every sub-block in a few word operations,
/// for the kernels that unpack them once per block.
#[inline(always)]
pub(crate) fn scales_mins_k4(q: &[u8; 12]) -> (u64, u64) {
    let word = |i: usize| u32::from_le_bytes([q[i], q[i + 1], q[i + 2], q[i + 3]]);
    let (a, b, c) = (word(0), word(4), word(8));
    const LOW6: u32 = 0x3F3F_3F3F;
    const LOW4: u32 = 0x0F0F_0F0F;
    // Sub-blocks 4..8 keep their low four bits in `c` and their top two in the spare bits of `a`
    // (scales) and `b` (mins).
    let top = |w: u32| ((w >> 6) & 0x0303_0303) << 4;
    let scales = (a & LOW6) as u64 | (((c & LOW4) | top(a)) as u64) << 32;
    let mins = (b & LOW6) as u64 | ((((c >> 4) & LOW4) | top(b)) as u64) << 32;
    (scales, mins)
}

/// Dequantize `out.len()` values (a whole number of blocks) from `src`.
pub fn dequantize(dtype: DType, src: &[u8], out: &mut [f32]) {
    let bs = dtype.block_size();
    let bb = dtype.block_bytes();
    debug_assert_eq!(out.len() % bs, 0);
    debug_assert!(src.len() >= out.len() / bs * bb);
    for (blk, y) in src.chunks_exact(bb).zip(out.chunks_exact_mut(bs)) {
        dequantize_block(dtype, blk, y);
    }
}

fn dequantize_block(dtype: DType, b: &[u8], y: &mut [f32]) {
    match dtype {
        DType::F32 => y[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        DType::F16 => y[0] = f16_at(b, 0),
        DType::BF16 => y[0] = bf16::from_le_bytes([b[0], b[1]]).to_f32(),
        DType::Q4_0 => {
            let d = f16_at(b, 0);
            let qs = &b[2..18];
            for j in 0..16 {
                y[j] = ((qs[j] & 0xF) as i32 - 8) as f32 * d;
                y[j + 16] = ((qs[j] >> 4) as i32 - 8) as f32 * d;
            }
        }
        DType::Q4_1 => {
            let (d, m) = (f16_at(b, 0), f16_at(b, 2));
            let qs = &b[4..20];
            for j in 0..16 {
                y[j] = (qs[j] & 0xF) as f32 * d + m;
                y[j + 16] = (qs[j] >> 4) as f32 * d + m;
            }
        }
        DType::Q5_0 | DType::Q5_1 => {
            let (d, m, off) = if dtype == DType::Q5_0 {
                (f16_at(b, 0), -16.0 * f16_at(b, 0), 2)
            } else {
                (f16_at(b, 0), f16_at(b, 2), 4)
            };
            let qh = u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]]);
            let qs = &b[off + 4..off + 20];
            for j in 0..16 {
                let h0 = ((qh >> j) << 4) & 0x10;
                let h1 = (qh >> (j + 12)) & 0x10;
                y[j] = ((qs[j] as u32 & 0xF) | h0) as f32 * d + m;
                y[j + 16] = ((qs[j] as u32 >> 4) | h1) as f32 * d + m;
            }
        }
        DType::Q8_0 => {
            let d = f16_at(b, 0);
            for j in 0..32 {
                y[j] = b[2 + j] as i8 as f32 * d;
            }
        }
        DType::Q4K | DType::Q5K => {
            let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
            let scales = &b[4..16];
            let (qh, qs) = if dtype == DType::Q5K {
                (Some(&b[16..48]), &b[48..176])
            } else {
                (None, &b[16..144])
            };
            for j in 0..4 {
                let (sc1, m1) = scale_min_k4(2 * j, scales);
                let (sc2, m2) = scale_min_k4(2 * j + 1, scales);
                let (d1, m1) = (d * sc1 as f32, dmin * m1 as f32);
                let (d2, m2) = (d * sc2 as f32, dmin * m2 as f32);
                let q = &qs[32 * j..32 * j + 32];
                for l in 0..32 {
                    let (mut lo, mut hi) = ((q[l] & 0xF) as u32, (q[l] >> 4) as u32);
                    if let Some(qh) = qh {
                        lo |= ((qh[l] >> (2 * j)) as u32 & 1) << 4;
                        hi |= ((qh[l] >> (2 * j + 1)) as u32 & 1) << 4;
                    }
                    y[64 * j + l] = d1 * lo as f32 - m1;
                    y[64 * j + 32 + l] = d2 * hi as f32 - m2;
                }
            }
        }
        DType::Q6K => {
            let d = f16_at(b, 208);
            for n in 0..2 {
                let ql = &b[64 * n..64 * n + 64];
                let qh = &b[128 + 32 * n..128 + 32 * n + 32];
                let sc = &b[192 + 8 * n..192 + 8 * n + 8];
                let y = &mut y[128 * n..128 * n + 128];
                for l in 0..32 {
                    let is = l / 16;
                    let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
                    let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                    let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                    let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                    y[l] = d * (sc[is] as i8) as f32 * q1 as f32;
                    y[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
                    y[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
                    y[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_names_parse_back_and_unknown_ones_are_errors() {
        for d in DType::ALL {
            assert_eq!(d.name().parse::<DType>().unwrap(), d);
            assert_eq!(d.name().to_uppercase().parse::<DType>().unwrap(), d);
        }
        let err = "q3_k".parse::<DType>().unwrap_err().to_string();
        assert!(err.contains("unknown weight type 'q3_k'") && err.contains("q4_k"), "{err}");
    }

    #[test]
    fn ggml_ids_read_back() {
        for d in DType::ALL {
            assert_eq!(DType::from_ggml(d.ggml_id()).unwrap(), d);
        }
        assert!(DType::from_ggml(4).is_err(), "Q4_2 was removed from ggml");
    }

    #[test]
    fn k4_scales_unpack_word_wise_as_byte_wise() {
        let mut seed = 0x9E37_79B9u32;
        for _ in 0..1000 {
            let q: [u8; 12] = std::array::from_fn(|_| {
                seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (seed >> 24) as u8
            });
            let (scales, mins) = scales_mins_k4(&q);
            for j in 0..8 {
                let byte = |w: u64| (w >> (8 * j)) as u8;
                assert_eq!((byte(scales), byte(mins)), scale_min_k4(j, &q), "sub-block {j} of {q:?}");
            }
        }
    }

    fn h(x: f32) -> [u8; 2] {
        f16::from_f32(x).to_le_bytes()
    }

    fn deq(dtype: DType, block: &[u8]) -> Vec<f32> {
        assert_eq!(block.len(), dtype.block_bytes());
        let mut y = vec![0.0; dtype.block_size()];
        dequantize(dtype, block, &mut y);
        y
    }

    #[test]
    fn plain_floats() {
        assert_eq!(deq(DType::F32, &1.5f32.to_le_bytes()), [1.5]);
        assert_eq!(deq(DType::F16, &h(-2.25)), [-2.25]);
        assert_eq!(deq(DType::BF16, &bf16::from_f32(3.0).to_le_bytes()), [3.0]);
    }

    #[test]
    fn q4_0_and_q4_1() {
        // Byte j holds value j in its low nibble and value j + 16 in its high nibble.
        let mut b = h(0.5).to_vec();
        b.extend((0..16u8).map(|j| (15 - j) << 4 | j));
        let y = deq(DType::Q4_0, &b);
        assert_eq!(y[0], (0.0 - 8.0) * 0.5);
        assert_eq!(y[3], (3.0 - 8.0) * 0.5);
        assert_eq!(y[16], (15.0 - 8.0) * 0.5);
        assert_eq!(y[31], (0.0 - 8.0) * 0.5);

        let mut b = [h(0.5), h(-1.0)].concat();
        b.extend((0..16u8).map(|j| (15 - j) << 4 | j));
        let y = deq(DType::Q4_1, &b);
        assert_eq!(y[5], 5.0 * 0.5 - 1.0);
        assert_eq!(y[17], 14.0 * 0.5 - 1.0);
    }

    #[test]
    fn q5_0_and_q5_1() {
        // qh bit j is the 5th bit of value j; bit j + 16 that of value j + 16.
        let qh: u32 = (1 << 2) | (1 << 18);
        let mut b = h(0.25).to_vec();
        b.extend(qh.to_le_bytes());
        b.extend([0x31u8; 16]); // low nibble 1, high nibble 3
        let y = deq(DType::Q5_0, &b);
        assert_eq!(y[0], (1.0 - 16.0) * 0.25);
        assert_eq!(y[2], (17.0 - 16.0) * 0.25);
        assert_eq!(y[16], (3.0 - 16.0) * 0.25);
        assert_eq!(y[18], (19.0 - 16.0) * 0.25);

        let mut b = [h(0.25), h(2.0)].concat();
        b.extend(qh.to_le_bytes());
        b.extend([0x31u8; 16]);
        let y = deq(DType::Q5_1, &b);
        assert_eq!(y[2], 17.0 * 0.25 + 2.0);
        assert_eq!(y[18], 19.0 * 0.25 + 2.0);
        assert_eq!(y[1], 1.0 * 0.25 + 2.0);
    }

    #[test]
    fn q8_0() {
        let mut b = h(0.5).to_vec();
        b.extend((0..32).map(|j| (j as i8 - 16) as u8));
        let y = deq(DType::Q8_0, &b);
        assert_eq!(y[0], -8.0);
        assert_eq!(y[31], 7.5);
    }

    use crate::storage::quantize::pack_scale_min_k4 as k_scales;

    #[test]
    fn q4_k_and_q5_k() {
        let sc = [1, 2, 3, 4, 5, 6, 7, 40];
        let m = [0, 1, 2, 3, 4, 5, 6, 50];
        let mut b = [h(0.5), h(0.25)].concat();
        b.extend(k_scales(sc, m));
        // Every byte: low nibble 3 (first sub-block of each pair), high nibble 9 (second).
        b.extend([0x93u8; 128]);
        let y = deq(DType::Q4K, &b);
        for s in 0..8 {
            let q = if s % 2 == 0 { 3.0 } else { 9.0 };
            let want = 0.5 * sc[s] as f32 * q - 0.25 * m[s] as f32;
            assert_eq!(y[32 * s], want, "sub-block {s}");
            assert_eq!(y[32 * s + 31], want, "sub-block {s}");
        }

        let mut b = [h(0.5), h(0.25)].concat();
        b.extend(k_scales(sc, m));
        // qh byte l bit s = high bit of value l of sub-block s: set it for sub-blocks 1 and 6, l = 0.
        let mut qh = [0u8; 32];
        qh[0] = (1 << 1) | (1 << 6);
        b.extend(qh);
        b.extend([0x93u8; 128]);
        let y = deq(DType::Q5K, &b);
        assert_eq!(y[32], 0.5 * 2.0 * (9.0 + 16.0) - 0.25 * 1.0);
        assert_eq!(y[33], 0.5 * 2.0 * 9.0 - 0.25 * 1.0);
        assert_eq!(y[192], 0.5 * 7.0 * (3.0 + 16.0) - 0.25 * 6.0);
        assert_eq!(y[0], 0.5 * 1.0 * 3.0);
    }

    #[test]
    fn q6_k() {
        let mut b = vec![0u8; 210];
        // Value 0: low 4 bits from ql[0] low nibble, high 2 bits from qh[0] bits 0-1.
        b[0] = 0x0A; // value 0 low nibble 10; value 64 low nibble 0
        b[128] = 0b10; // value 0 high bits 2 -> q = 10 + 32 - 32 = 10
        b[64 + 32] = 0xF0; // half 2: value 128 + 96 + 32 = 224's low nibble lives in ql[96] high nibble
        b[128 + 32] = 0b11 << 6; // qh[32] bits 6-7: high bits of value 224
        for (i, s) in (192..208).zip([2i8, -3, 4, 5, 6, 7, 8, 9, 1, 1, 1, 1, 1, 1, -2, 1]) {
            b[i] = s as u8;
        }
        b[208..210].copy_from_slice(&h(0.5));
        let y = deq(DType::Q6K, &b);
        assert_eq!(y[0], 0.5 * 2.0 * 10.0);
        assert_eq!(y[1], 0.5 * 2.0 * -32.0);
        // Value 224 = second half, last quarter, l = 0 -> scale 8 + 6 = 14.
        assert_eq!(y[224], 0.5 * -2.0 * (15.0 + 48.0 - 32.0));
    }

    #[test]
    fn sizes_are_checked() {
        assert_eq!(DType::Q4K.bytes_for(512).unwrap(), 288);
        assert!(DType::Q4K.bytes_for(100).is_err());
        assert!(DType::F32.bytes_for(usize::MAX).is_err());
        assert!(DType::from_ggml(99).is_err());
    }
}
