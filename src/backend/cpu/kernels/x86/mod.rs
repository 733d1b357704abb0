//! x86-64 kernels, in three sets chosen at run time by CPU features: AVX2 (with FMA and F16C),
//! AVX-VNNI (256-bit VNNI without AVX-512) and AVX-512 VNNI (with AVX-512F/BW/VL: 32 vector
//! registers instead of 16, which a batch of rows runs short of, and the 16-bit-activation dot on
//! 512-bit vectors).
//!
//! Weight values are decoded to 32 bytes in a register, the same way in every set (this module).
//! With 8-bit activations they are multiplied with 32 activation bytes by `maddubs` (unsigned
//! weights times signed activations, summed in pairs to i16), then by the scale into i32 sums by
//! `dpwssd`; an unscaled 32-value block takes `dpbusd` in one step. With 16-bit activations a
//! K-quant's values are widened and scaled at once by two `maddubs` against their scale bytes (even
//! positions, then odd ones, as the activations are laid out for them), less 32 for Q6_K, whose
//! stored offset that removes; each activation row then costs two `dpwssd`s. The AVX-512 set decodes
//! two chunks of a K-quant block into one 512-bit vector ([`chunk_pair_k`]): with 16-bit
//! activations it takes both chunks' even positions in one `maddubs` and `dpwssd`, their odd ones
//! in another; with 8-bit ones, both chunks in one `maddubs` and one `dpwssd` per row. VNNI does
//! each of those multiply-adds in one instruction where AVX2 takes two or three ([`integer`]).
//! Weights are prefetched ahead of use.

// Kernels index several per-row arrays by the same row.
#![allow(clippy::needless_range_loop)]

pub(crate) mod float;
mod integer;

use std::arch::asm;
use std::arch::x86_64::*;

use super::*;
use crate::storage::quant::scales_mins_k4;

/// Both f16 halves of `bits` as f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn f16x2(bits: u32) -> (f32, f32) {
    let v = _mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32));
    (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// How far ahead of the block being dotted the kernels ask for weights: at one activation row the
/// decode is quick enough that the hardware prefetcher alone leaves the memory bus idle at times.
/// 8 KB covers the memory's latency at a decode's pace; at 2 KB a row of Q4_K 8,960 values long
/// read from memory took 1.5x the time it takes in cache (one thread, Zen 5), where rows of 1,536
/// did not: the hardware prefetcher follows a long stream of short rows, not a long row alone.
const PREFETCH_AHEAD: usize = 8192;

/// Asks for the cache lines of the `len` bytes at `p` (which need not be valid memory) to be loaded.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn prefetch(p: *const u8, len: usize) {
    for line in (0..len).step_by(64) {
        // A prefetch never faults, whatever the address.
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(line) as *const i8);
    }
}

/// 32 unaligned bytes at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

/// Values 0..16 from the low nibbles and 16..32 from the high nibbles of the 16 bytes at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibbles(p: *const u8) -> __m256i {
    let q = _mm_loadu_si128(p as *const __m128i);
    let lo = _mm_and_si128(q, _mm_set1_epi8(0xF));
    let hi = _mm_and_si128(_mm_srli_epi16(q, 4), _mm_set1_epi8(0xF));
    _mm256_set_m128i(hi, lo)
}

/// 0x10 in byte `j` where bit `j` of the 32 bits at `p` is set.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fifth_bits(p: *const u8) -> __m256i {
    let bits = _mm256_set1_epi32((p as *const i32).read_unaligned());
    let spread = _mm256_set_epi64x(0x0303_0303_0303_0303, 0x0202_0202_0202_0202, 0x0101_0101_0101_0101, 0);
    let bytes = _mm256_shuffle_epi8(bits, spread);
    let mask = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, mask), mask);
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

/// The 32 values of a 32-value block (signed for Q8_0, unsigned otherwise).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn values32<F: Block32>(b: *const u8) -> __m256i {
    if F::SIGNED {
        return load(b.add(F::QS));
    }
    let v = nibbles(b.add(F::QS));
    match F::QH {
        Some(qh) => _mm256_or_si256(v, fifth_bits(b.add(qh))),
        None => v,
    }
}

/// Values `32 t..32 t + 32` (unsigned) of a K-quant block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn chunk_k<F: BlockK>(b: *const u8, t: usize) -> __m256i {
    let low4 = _mm256_set1_epi8(0xF);
    if F::SIX {
        let (n, u) = (t / 4, t % 4);
        let ql = load(b.add(F::QS + 64 * n + 32 * (u & 1)));
        let ql = _mm256_and_si256(_mm256_srl_epi16(ql, _mm_cvtsi32_si128(4 * (u as i32 >> 1))), low4);
        let qh = load(b.add(F::QH.unwrap() + 32 * n));
        let qh = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * u as i32)), _mm256_set1_epi8(3));
        return _mm256_or_si256(ql, _mm256_slli_epi16(qh, 4));
    }
    let q = load(b.add(F::QS + 32 * (t / 2)));
    let v = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(4 * (t as i32 & 1))), low4);
    match F::QH {
        Some(qh) => {
            let bit = _mm256_set1_epi8(1 << t);
            let set = _mm256_cmpeq_epi8(_mm256_and_si256(load(b.add(qh)), bit), bit);
            _mm256_or_si256(v, _mm256_and_si256(set, _mm256_set1_epi8(0x10)))
        }
        None => v,
    }
}

/// Values `32 t..32 t + 64` (unsigned) of a K-quant block, `t` even: chunk `t` in the low 256 bits,
/// chunk `t + 1` in the high (both as [`chunk_k`] gives them), each pair of chunks read from the
/// bytes they share: the same nibbles (Q4_K, Q5_K) or 64 bytes in a row (Q6_K's low bits).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn chunk_pair_k<F: BlockK>(b: *const u8, t: usize) -> __m512i {
    debug_assert!(t.is_multiple_of(2));
    let low4 = _mm512_set1_epi8(0xF);
    // Per 16-bit lane: the first chunk's shift in the low 256 bits, the second's in the high.
    let shifts = |first: i16, second: i16| _mm512_inserti64x4::<1>(_mm512_set1_epi16(first), _mm256_set1_epi16(second));
    if F::SIX {
        let (n, u) = (t / 4, t % 4);
        let ql = _mm512_loadu_si512(b.add(F::QS + 64 * n) as *const _);
        let ql = _mm512_and_si512(_mm512_srl_epi16(ql, _mm_cvtsi32_si128(4 * (u as i32 >> 1))), low4);
        let qh = _mm512_broadcast_i64x4(load(b.add(F::QH.unwrap() + 32 * n)));
        let qh = _mm512_srlv_epi16(qh, shifts(2 * u as i16, 2 * u as i16 + 2));
        let qh = _mm512_and_si512(qh, _mm512_set1_epi8(3));
        return _mm512_or_si512(ql, _mm512_slli_epi16::<4>(qh));
    }
    let q = _mm512_broadcast_i64x4(load(b.add(F::QS + 32 * (t / 2))));
    let v = _mm512_and_si512(_mm512_srlv_epi16(q, shifts(0, 4)), low4);
    match F::QH {
        Some(qh) => {
            let bits = _mm512_broadcast_i64x4(load(b.add(qh)));
            let bit = _mm512_inserti64x4::<1>(_mm512_set1_epi8(1 << t), _mm256_set1_epi8(1 << (t + 1)));
            // The fifth bit's place is clear in `v`, so adding it sets it.
            _mm512_mask_add_epi8(v, _mm512_test_epi8_mask(bits, bit), v, _mm512_set1_epi8(0x10))
        }
        None => v,
    }
}

/// The scales of a K-quant block as the kernels apply them, `w = d * sc * v - dc * c`, packed
/// in general registers: vector registers are what a batch runs short of, so each part is
/// widened into one only where it is used.
#[derive(Clone, Copy)]
struct Scales {
    /// f16 bits of `d` (low half) and `dc` (high half); Q6_K has only `d`.
    dc_bits: u32,
    /// Q4_K's and Q5_K's 8 scale bytes (one per 32 values) and 8 min bytes; Q6_K reads its 16
    /// signed scales (one per 16 values) from the block as they are stored.
    sc: u64,
    m: u64,
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scales<F: BlockK>(p: *const u8) -> Scales {
    if F::SIX {
        return Scales { dc_bits: (p.add(208) as *const u16).read_unaligned() as u32, sc: 0, m: 0 };
    }
    let (sc, m) = scales_mins_k4(&*(p.add(4) as *const [u8; 12]));
    Scales { dc_bits: (p as *const u32).read_unaligned(), sc, m }
}

/// The scale bytes of block `p` (signed), the same in both 128-bit halves, picked by [`scale_at`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scale_bytes<F: BlockK>(p: *const u8, s: Scales) -> __m256i {
    match F::SIX {
        true => _mm256_broadcastsi128_si256(_mm_loadu_si128(p.add(192) as *const __m128i)),
        false => _mm256_set1_epi64x(s.sc as i64),
    }
}

/// `d` in every lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn scale_d(s: Scales) -> __m256 {
    _mm256_set1_ps(f16x2(s.dc_bits).0)
}

/// `dc * c` of a block's offsets in f32: one lane per 32 values (dotted with `bsums32`) where a
/// format has one offset per 32 (Q4_K, Q5_K), else one per 16 in two vectors (Q6_K, with `bsums`).
#[derive(Clone, Copy)]
struct Offsets([__m256; 2]);

impl Offsets {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn new<F: BlockK>(p: *const u8, s: Scales) -> Offsets {
        let (d, dc) = f16x2(s.dc_bits);
        if F::SIX {
            // Q6_K stores its values plus 32: the offset of each 16 is 32 times its scale.
            let sc = _mm_loadu_si128(p.add(192) as *const __m128i);
            let dc = _mm256_set1_ps(32.0 * d);
            let c = [_mm256_cvtepi8_epi32(sc), _mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8))];
            return Offsets(c.map(|c| _mm256_mul_ps(_mm256_cvtepi32_ps(c), dc)));
        }
        let c = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(s.m as i64)));
        Offsets([_mm256_mul_ps(c, _mm256_set1_ps(dc)), _mm256_setzero_ps()])
    }

    /// Eight partial sums of the offsets' term of activation block `a`, before its scale `a.d`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot<F: BlockK, T>(self, a: &ActK<T>) -> __m256 {
        let [c0, c1] = self.0;
        if F::SIX {
            let bs = a.bsums.as_ptr();
            return _mm256_fmadd_ps(c0, _mm256_loadu_ps(bs), _mm256_mul_ps(c1, _mm256_loadu_ps(bs.add(8))));
        }
        _mm256_mul_ps(c0, _mm256_loadu_ps(a.bsums32.as_ptr()))
    }
}

/// Which byte of [`scale_bytes`] scales half `h` (0 or 1) of the 32 values `32 t..32 t + 32`.
#[inline(always)]
fn scale_at<F: BlockK>(t: usize, h: usize) -> usize {
    if F::SIX { 2 * t + h } else { t }
}

/// A byte shuffle of [`scale_bytes`] that puts scale byte `lo` (in the low 128 bits) or `hi` (in
/// the high 128 bits) into the bytes of each 16-bit lane that `at` marks, and zero into the others.
/// Called with constants, so it folds to a constant.
#[inline(always)]
fn spread(lo: usize, hi: usize, at: [bool; 2]) -> __m256i {
    let bytes: [i8; 32] = std::array::from_fn(|j| match at[j % 2] {
        true => (if j < 16 { lo } else { hi }) as i8,
        false => i8::MIN,
    });
    // SAFETY: any 32 bytes are a valid __m256i.
    unsafe { std::mem::transmute::<[i8; 32], __m256i>(bytes) }
}

/// [`spread`] for chunks `t` (in the low 256 bits) and `t + 1` (in the high) of a 512-bit step.
/// Called with constants, so it folds to a constant.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn spread_pair<F: BlockK>(t: usize, at: [bool; 2]) -> __m512i {
    let first = _mm512_castsi256_si512(spread(scale_at::<F>(t, 0), scale_at::<F>(t, 1), at));
    _mm512_inserti64x4::<1>(first, spread(scale_at::<F>(t + 1, 0), scale_at::<F>(t + 1, 1), at))
}

/// `v`, as if computed from `x` too, at no cost: no instruction emitted. The K-quant kernel passes
/// its scales through this after each chunk's sums, so that the next chunk's weights are decoded
/// only once every row has taken the current ones. Left to itself the compiler may instead run one
/// row through all of a block's chunks, then the next, which keeps 16 decoded weights alive at
/// once and spills them.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn after(mut v: __m256i, x: __m256i) -> __m256i {
    std::arch::asm!("/* {0} {1} */", inout(ymm_reg) v, in(ymm_reg) x, options(pure, nomem, nostack, preserves_flags));
    v
}

/// `$body` once for each of the 8 chunks of 32 values of a K-quant block, with `$t` the chunk as
/// a literal.
macro_rules! chunks {
    ($t:ident => $body:block) => {
        const _: () = assert!(QK_K / 32 == 8);
        chunks!(@ $t $body 0 1 2 3 4 5 6 7)
    };
    (@ $t:ident $body:block $($n:literal)*) => {
        $({
            let $t: usize = $n;
            $body
        })*
    };
}

/// Activation bytes a batch keeps in L1 while several weight rows read them: most of an x86 L1
/// data cache (32 KB or more), leaving room for the weights passing through. A batch's activations
/// for a long row outgrow L1 (five rows of 8,960 16-bit values take 112 KB with their sums); read
/// back from L2 for every weight row, they bound the kernel by L2's bandwidth, not its arithmetic.
const L1_ACTIVATIONS: usize = 24 << 10;

/// Weight rows that take each tile of activations in turn: 32 rather than 8 loads each tile into L1
/// a quarter as often (2-4% less time for five and nine rows of 1,536 x 8,960 at 16 bits).
const TILE_ROWS: usize = 32;

/// `acc + Σ` pairs of i16 products, as `vpdpwssd` computes it, in two AVX2 instructions.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn dpwssd_avx2(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
    _mm256_add_epi32(acc, _mm256_madd_epi16(a, b))
}

/// `acc + Σ` quads of unsigned-by-signed byte products, as `vpdpbusd` computes it, in three AVX2
/// instructions; exact where each pair of products fits i16 (see [`integer`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn dpbusd_avx2(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
    _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1)))
}

pub(crate) mod avx2 {
    super::integer::integer_kernels!("avx2,fma,f16c", dpwssd: dpwssd_avx2, dpbusd: dpbusd_avx2, width: narrow, pair_rows: 0);
}

// The VNNI multiply-adds are written as `asm!`: with the intrinsics, LLVM's generic x86-64 tuning
// splits most `vpdpwssd`s back into `vpmaddwd` + `vpaddd` (two instructions instead of one)
// wherever that shortens a chain of adds, which undid most of what VNNI saves.

/// Defines `$name(acc, a, b)`: the one instruction `$insn` on registers of class `$reg`, in a
/// function compiled for `$features`.
macro_rules! multiply_add {
    ($(#[$doc:meta])* $name:ident($ty:ty, $reg:ident): $features:literal, $insn:literal) => {
        $(#[$doc])*
        #[inline]
        #[target_feature(enable = $features)]
        fn $name(mut acc: $ty, a: $ty, b: $ty) -> $ty {
            // SAFETY: an instruction of this function's target features, on registers alone.
            unsafe { asm!($insn, inout($reg) acc, in($reg) a, in($reg) b, options(pure, nomem, nostack)) };
            acc
        }
    };
}

multiply_add!(
    /// `vpdpwssd` on 256-bit vectors, VEX-encoded (AVX-VNNI).
    dpwssd_vex(__m256i, ymm_reg): "avx2,fma,f16c,avxvnni", "{{vex}} vpdpwssd {0}, {1}, {2}"
);
multiply_add!(
    /// `vpdpbusd` on 256-bit vectors, VEX-encoded (AVX-VNNI).
    dpbusd_vex(__m256i, ymm_reg): "avx2,fma,f16c,avxvnni", "{{vex}} vpdpbusd {0}, {1}, {2}"
);
multiply_add!(
    /// `vpdpbusd` on 256-bit vectors, EVEX-encoded.
    dpbusd_evex(__m256i, zmm_reg): "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni", "vpdpbusd {0:y}, {1:y}, {2:y}"
);
multiply_add!(
    /// `vpdpwssd` on 512-bit vectors.
    dpwssd_512(__m512i, zmm_reg): "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni", "vpdpwssd {0}, {1}, {2}"
);

pub(crate) mod avx_vnni {
    super::integer::integer_kernels!("avx2,fma,f16c,avxvnni", dpwssd: dpwssd_vex, dpbusd: dpbusd_vex, width: narrow, pair_rows: 3);
}

pub(crate) mod avx512_vnni {
    super::integer::integer_kernels!(
        "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
        dpwssd: dpwssd_512,
        dpbusd: dpbusd_evex,
        width: wide,
        pair_rows: MAX_ROWS
    );
}

/// Whether this CPU runs the AVX2 set, which every other x86 set builds on.
pub(crate) fn avx2_detected() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
}

/// Whether this CPU runs the AVX-VNNI set.
pub(crate) fn avx_vnni_detected() -> bool {
    avx2_detected() && is_x86_feature_detected!("avxvnni")
}

/// Whether this CPU runs the AVX-512 VNNI set.
pub(crate) fn avx512_vnni_detected() -> bool {
    avx2_detected()
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
}
