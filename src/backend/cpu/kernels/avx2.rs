//! x86-64 kernels for AVX2 + FMA + F16C: weight values are decoded to 32 bytes in a register. With
//! 8-bit activations they are multiplied with 32 activation bytes by `maddubs` (unsigned weights
//! times signed activations, summed in pairs to i16), then widened by `madd` with the scale or
//! with ones; with 16-bit activations a K-quant's values are widened and scaled at once by two
//! `maddubs` against their scale bytes (even positions, then odd ones, as the activations are laid
//! out for them), less 32 for Q6_K, whose stored offset that removes; each activation row then
//! costs two `madd`s. Weights are prefetched ahead of use.

// Kernels index several per-row arrays by the same row.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::*;
use crate::model::quant::scales_mins_k4;

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
const PREFETCH_AHEAD: usize = 2048;

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

/// How 32 weight values meet 32 activations of one integer type.
trait Dot: ActInt {
    /// 32 weight values as the dot wants them.
    type W: Copy;
    /// The 32 values of a 32-value block, signed where `signed`, in order.
    unsafe fn weights32(v: __m256i, signed: bool) -> Self::W;
    /// 32 unsigned values of a K-quant block; the first 16 take scale byte `lo` of `sc`, the last
    /// 16 byte `hi` (see [`scale_bytes`]). Where `less32`, each value is taken less 32: Q6_K's
    /// stored offset, which then needs no correction and halves the products' magnitude.
    unsafe fn weights_k(v: __m256i, sc: __m256i, lo: usize, hi: usize, less32: bool) -> Self::W;
    /// Whether [`Dot::weights_k`] takes `less32`.
    const LESS32: bool;
    /// Partial sums of a run of chunks, kept apart until [`Dot::total`] where that saves adds.
    type Acc: Copy;
    const ZERO: Self::Acc;
    /// How many products each i32 lane of an `Acc` gathers per chunk (the parts of an `Acc` meet
    /// only in f32).
    const PER_LANE: i32;
    /// `acc` plus the 32 products with the activations at `q`.
    unsafe fn dot_acc(w: Self::W, q: *const Self, acc: Self::Acc) -> Self::Acc;
    /// How many i32 parts an `Acc` has.
    const PARTS: i32;
    /// Like [`Dot::dot_acc`], with every product gathered in the first part and the others left
    /// as they are: fewer registers per row, each lane gathering `PARTS` times as many products.
    unsafe fn dot_acc_one(w: Self::W, q: *const Self, acc: Self::Acc) -> Self::Acc;
    /// Eight partial sums of everything `acc` gathered, in f32.
    unsafe fn total(acc: Self::Acc) -> __m256;
    /// [`Dot::total`] of an `acc` that only [`Dot::dot_acc_one`] added to.
    unsafe fn total_one(acc: Self::Acc) -> __m256;
    /// `v`, made to depend on `acc` (see [`after`]).
    unsafe fn after(v: __m256i, acc: &Self::Acc) -> __m256i;

    /// Eight partial sums of the 32 products with the activations at `q`, in f32.
    #[inline(always)]
    unsafe fn dot(w: Self::W, q: *const Self) -> __m256 {
        Self::total(Self::dot_acc(w, q, Self::ZERO))
    }
}

/// Bytes for `maddubs`, which multiplies unsigned by signed: a signed weight's sign moves onto
/// its activation. The scale (or ones) widens the pair sums in `madd`.
#[derive(Clone, Copy)]
struct Bytes {
    v: __m256i,
    sign: Option<__m256i>,
    sc: __m256i,
}

impl Dot for i8 {
    type W = Bytes;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn weights32(v: __m256i, signed: bool) -> Bytes {
        let sc = _mm256_set1_epi16(1);
        match signed {
            true => Bytes { v: _mm256_sign_epi8(v, v), sign: Some(v), sc },
            false => Bytes { v, sign: None, sc },
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn weights_k(v: __m256i, sc: __m256i, lo: usize, hi: usize, less32: bool) -> Bytes {
        debug_assert!(!less32, "maddubs takes unsigned weights");
        // The scale byte in the high byte of each 16-bit lane, shifted down with its sign.
        let sc = _mm256_srai_epi16(_mm256_shuffle_epi8(sc, spread(lo, hi, [false, true])), 8);
        Bytes { v, sign: None, sc }
    }

    const LESS32: bool = false;

    type Acc = __m256i;
    const ZERO: __m256i = unsafe { std::mem::transmute([0u8; 32]) };
    const PER_LANE: i32 = 4;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_acc(w: Bytes, q: *const i8, acc: __m256i) -> __m256i {
        let q = load(q as *const u8);
        let q = w.sign.map_or(q, |s| _mm256_sign_epi8(q, s));
        _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w.v, q), w.sc))
    }

    const PARTS: i32 = 1;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_acc_one(w: Bytes, q: *const i8, acc: __m256i) -> __m256i {
        Self::dot_acc(w, q, acc)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn total(acc: __m256i) -> __m256 {
        _mm256_cvtepi32_ps(acc)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn total_one(acc: __m256i) -> __m256 {
        Self::total(acc)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn after(v: __m256i, acc: &__m256i) -> __m256i {
        after(v, *acc)
    }
}

/// 16-bit lanes for `madd` with 16-bit activations.
impl Dot for i16 {
    type W = [__m256i; 2];

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn weights32(v: __m256i, signed: bool) -> [__m256i; 2] {
        let (lo, hi) = (_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        match signed {
            true => [_mm256_cvtepi8_epi16(lo), _mm256_cvtepi8_epi16(hi)],
            false => [_mm256_cvtepu8_epi16(lo), _mm256_cvtepu8_epi16(hi)],
        }
    }

    /// Widened and scaled at once by `maddubs` against the scale in every other byte: the values
    /// at even positions, then those at odd positions ([`Order::EvenOdd`]).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn weights_k(v: __m256i, sc: __m256i, lo: usize, hi: usize, less32: bool) -> [__m256i; 2] {
        let spread = |at| _mm256_shuffle_epi8(sc, spread(lo, hi, at));
        let (even, odd) = (spread([true, false]), spread([false, true]));
        let w = [_mm256_maddubs_epi16(v, even), _mm256_maddubs_epi16(v, odd)];
        if !less32 {
            return w;
        }
        // 32 times each lane's scale: the odd spread holds it in the high byte, 256 times over.
        let offset = _mm256_srai_epi16(odd, 3);
        w.map(|w| _mm256_sub_epi16(w, offset))
    }

    const LESS32: bool = true;

    /// The products of even and of odd positions gather apart, up to f32: two short chains of
    /// adds rather than one through both `madd`s, each of half the magnitude.
    type Acc = [__m256i; 2];
    const ZERO: [__m256i; 2] = unsafe { std::mem::transmute([0u8; 64]) };
    const PER_LANE: i32 = 2;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_acc(w: [__m256i; 2], q: *const i16, acc: [__m256i; 2]) -> [__m256i; 2] {
        [
            _mm256_add_epi32(acc[0], _mm256_madd_epi16(w[0], load(q as *const u8))),
            _mm256_add_epi32(acc[1], _mm256_madd_epi16(w[1], load(q.add(16) as *const u8))),
        ]
    }

    const PARTS: i32 = 2;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_acc_one(w: [__m256i; 2], q: *const i16, acc: [__m256i; 2]) -> [__m256i; 2] {
        let even = _mm256_madd_epi16(w[0], load(q as *const u8));
        let odd = _mm256_madd_epi16(w[1], load(q.add(16) as *const u8));
        [_mm256_add_epi32(acc[0], _mm256_add_epi32(even, odd)), acc[1]]
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn total(acc: [__m256i; 2]) -> __m256 {
        _mm256_add_ps(_mm256_cvtepi32_ps(acc[0]), _mm256_cvtepi32_ps(acc[1]))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn total_one(acc: [__m256i; 2]) -> __m256 {
        _mm256_cvtepi32_ps(acc[0])
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn after(v: __m256i, acc: &[__m256i; 2]) -> __m256i {
        after(after(v, acc[0]), acc[1])
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q32_rows<F: Block32, T: Dot, const R: usize>(w: &[u8], x: &[Act32<T>], out: &mut [f32]) {
    let nb = w.len() / F::BYTES;
    debug_assert_eq!(x.len(), R * nb);
    let mut acc = [_mm256_setzero_ps(); R];
    let mut mins = [0.0f32; R];
    for b in 0..nb {
        let p = w.as_ptr().add(b * F::BYTES);
        prefetch(p.wrapping_add(PREFETCH_AHEAD), F::BYTES);
        let (d, m) = f16x2(F::dm_bits(std::slice::from_raw_parts(p, 4)));
        let m = F::min(d, m);
        let v = T::weights32(values32::<F>(p), F::SIGNED);
        for i in 0..R {
            let a = x.get_unchecked(i * nb + b);
            acc[i] = _mm256_fmadd_ps(T::dot(v, a.qs.as_ptr()), _mm256_set1_ps(d * a.d), acc[i]);
            if !F::SIGNED {
                mins[i] += m * a.s;
            }
        }
    }
    for i in 0..R {
        out[i] = hsum(acc[i]) + mins[i];
    }
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

/// Weight rows that take each tile of activations in turn.
const TILE_ROWS: usize = 8;

/// The K-quant kernel over many weight rows (see [`RowsFn`]), [`TILE_ROWS`] at a time. With more
/// than one activation row it runs over K in tiles that fit [`L1_ACTIVATIONS`], each tile taken by
/// every row of the group in turn, and prefetches weights two rows below, which it reads a little
/// later. A row's sums still gather block after block in one order, so results do not depend on
/// the tiling: a decode's and a batch's agree to the bit.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn qk_rows<F: BlockK, T: Dot, const R: usize>(w: &[u8], x: &[ActK<T>], out: &mut [f32]) {
    let n = out.len() / R;
    let nb = x.len() / R;
    let row_bytes = nb * F::BYTES;
    debug_assert!(nb > 0 && w.len() == n * row_bytes);
    // One row's activations are read once per weight row alongside weights from memory, which
    // bound a decode; tiling would only break up its weights' stream.
    let tiles = if R == 1 { 1 } else { (R * nb * std::mem::size_of::<ActK<T>>()).div_ceil(L1_ACTIVATIONS) };
    let tile = nb.div_ceil(tiles);
    let ahead = if tile == nb { PREFETCH_AHEAD } else { 2 * row_bytes };
    for (wg, og) in w.chunks(TILE_ROWS * row_bytes).zip(out.chunks_mut(TILE_ROWS * R)) {
        let mut acc = [[_mm256_setzero_ps(); R]; TILE_ROWS];
        let acc = &mut acc[..wg.len() / row_bytes];
        for t0 in (0..nb).step_by(tile) {
            qk_tile::<F, T, R>(wg.as_ptr(), row_bytes, x, nb, t0..(t0 + tile).min(nb), ahead, acc);
        }
        for (acc, o) in acc.iter().zip(og.chunks_exact_mut(R)) {
            for i in 0..R {
                o[i] = hsum(acc[i]);
            }
        }
    }
}

/// For each weight row `j` from `w` on (`row_bytes` apart), adds its blocks `blocks` dotted with
/// each of the `R` activation rows (of `nb` blocks each) to `acc[j]`, prefetching weights `ahead`
/// bytes on. A function of its own: inlined into the tiling loops, the block loop lost registers
/// and spilled (llvm-mca, Q6_K at five rows: 105 cycles per block against 94).
#[inline(never)]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn qk_tile<F: BlockK, T: Dot, const R: usize>(
    w: *const u8,
    row_bytes: usize,
    x: &[ActK<T>],
    nb: usize,
    blocks: std::ops::Range<usize>,
    ahead: usize,
    acc: &mut [[__m256; R]],
) {
    for (j, acc) in acc.iter_mut().enumerate() {
        *acc = qk_blocks::<F, T, R>(w.add(j * row_bytes), x, nb, blocks.clone(), ahead, *acc);
    }
}

/// `acc` plus blocks `blocks` of weight row `w` dotted with each of the `R` activation rows.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn qk_blocks<F: BlockK, T: Dot, const R: usize>(
    w: *const u8,
    x: &[ActK<T>],
    nb: usize,
    blocks: std::ops::Range<usize>,
    ahead: usize,
    mut acc: [__m256; R],
) -> [__m256; R] {
    // Q6_K's values less their offset where the activations' type allows it.
    let less32 = F::SIX && T::LESS32;
    let max_w = F::max_product(less32);
    // One sum per row where it lasts half a block without overflowing: with five rows, the
    // parts' registers are what pushes the weights out to the stack.
    let span_one = chunks_per_sum(T::PER_LANE * T::PARTS, max_w, T::MAX);
    let one_part = span_one >= QK_K / 32 / 2;
    let span = if one_part { span_one } else { chunks_per_sum(T::PER_LANE, max_w, T::MAX) };
    for b in blocks {
        let p = w.add(b * F::BYTES);
        prefetch(p.wrapping_add(ahead), F::BYTES);
        let s = scales::<F>(p);
        let mut sums = [T::ZERO; R];
        let mut sc = scale_bytes::<F>(p, s);
        // Unrolled, so that each chunk's shifts and scale shuffles are constants.
        chunks!(t => {
            let v = T::weights_k(chunk_k::<F>(p, t), sc, scale_at::<F>(t, 0), scale_at::<F>(t, 1), less32);
            for i in 0..R {
                let q = x.get_unchecked(i * nb + b).qs.as_ptr().add(32 * t);
                sums[i] = if one_part { T::dot_acc_one(v, q, sums[i]) } else { T::dot_acc(v, q, sums[i]) };
                if R > 1 {
                    sc = T::after(sc, &sums[i]);
                }
            }
            if (t + 1).is_multiple_of(span) {
                // The offsets' term joins the block's last sums: a.d * (d * sums - dc * Σ c * bsums).
                let offsets = (t + 1 == QK_K / 32 && !less32).then(|| Offsets::new::<F>(p, s));
                for i in 0..R {
                    let a = x.get_unchecked(i * nb + b);
                    let total = if one_part { T::total_one(sums[i]) } else { T::total(sums[i]) };
                    let ad = _mm256_broadcast_ss(&a.d);
                    acc[i] = match offsets {
                        Some(c) => _mm256_fmadd_ps(_mm256_fmsub_ps(total, scale_d(s), c.dot::<F, T>(a)), ad, acc[i]),
                        None => _mm256_fmadd_ps(total, _mm256_mul_ps(scale_d(s), ad), acc[i]),
                    };
                    sums[i] = T::ZERO;
                }
            }
        });
    }
    acc
}

/// Eight weights from element `j` on, as f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn float8<F: Float>(w: *const u8, j: usize) -> __m256 {
    let p = w.add(j * F::BYTES);
    match F::DTYPE {
        DType::F16 => _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)),
        DType::BF16 => _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i)),
            16,
        )),
        _ => _mm256_loadu_ps(p as *const f32),
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn float_rows<F: Float, const R: usize>(w: &[u8], x: &[f32], out: &mut [f32]) {
    let k = w.len() / F::BYTES;
    debug_assert_eq!(x.len(), R * k);
    let mut acc = [_mm256_setzero_ps(); R];
    let main = k / 8 * 8;
    for c in 0..k / 8 {
        let wv = float8::<F>(w.as_ptr(), 8 * c);
        for i in 0..R {
            acc[i] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x.as_ptr().add(i * k + 8 * c)), acc[i]);
        }
    }
    for i in 0..R {
        let tail: f32 = (main..k).map(|j| F::value(w, j) * x[i * k + j]).sum();
        out[i] = hsum(acc[i]) + tail;
    }
}

/// `dot(a, b)` of two f32 slices of equal length.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut out = [0.0];
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    // SAFETY: a is n f32 in bytes, and b holds n values for the one row.
    unsafe { float_rows::<F32, 1>(std::slice::from_raw_parts(a.as_ptr() as *const u8, 4 * n), b, &mut out) };
    out[0]
}

/// `y += a * x` over the common length's whole 8-lane vectors; returns how many values that was,
/// leaving the rest to the caller.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn axpy(y: &mut [f32], a: f32, x: &[f32]) -> usize {
    let main = y.len().min(x.len()) / 8 * 8;
    let av = _mm256_set1_ps(a);
    for j in (0..main).step_by(8) {
        // SAFETY: j + 8 <= main, within both slices.
        unsafe {
            let yp = y.as_mut_ptr().add(j);
            _mm256_storeu_ps(yp, _mm256_fmadd_ps(av, _mm256_loadu_ps(x.as_ptr().add(j)), _mm256_loadu_ps(yp)));
        }
    }
    main
}

/// `e^x` for eight lanes, to within a few ulp of f32 for `x` in [-87, 88] (clamped there, which
/// keeps `2^n` a normal number): `2^n * e^r` with `r = x - n ln 2` in [-0.35, 0.35], where a
/// degree-7 Taylor polynomial is off by under 1e-8.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn exp8(x: __m256) -> __m256 {
    let x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0)), _mm256_set1_ps(88.0));
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)));
    // ln 2 in two parts, so that n * ln 2 is subtracted without rounding away r's low bits.
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_145_75), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428_606_8e-6), r);
    let mut p = _mm256_set1_ps(1.0 / 5040.0);
    for c in [1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let two_n = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127))));
    _mm256_mul_ps(p, two_n)
}

/// `out = silu(g) * u = g / (1 + e^-g) * u` over the common length's whole 8-lane vectors;
/// returns how many values that was, leaving the rest to the caller.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn silu_mul(g: &[f32], u: &[f32], out: &mut [f32]) -> usize {
    let main = out.len().min(g.len()).min(u.len()) / 8 * 8;
    let one = _mm256_set1_ps(1.0);
    for j in (0..main).step_by(8) {
        // SAFETY: j + 8 <= main, within all three slices.
        unsafe {
            let gv = _mm256_loadu_ps(g.as_ptr().add(j));
            let e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv));
            let s = _mm256_div_ps(gv, _mm256_add_ps(one, e));
            _mm256_storeu_ps(out.as_mut_ptr().add(j), _mm256_mul_ps(s, _mm256_loadu_ps(u.as_ptr().add(j))));
        }
    }
    main
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q32<F: Block32, T: Dot>(w: &[u8], x: &[Act32<T>], rows: usize, out: &mut [f32]) {
    by_rows!(q32_rows::<F, T>(w, x, rows, out))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn qk<F: BlockK, T: Dot>(w: &[u8], x: &[ActK<T>], rows: usize, out: &mut [f32]) {
    by_rows!(all qk_rows::<F, T>(w, x, rows, out))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn float<F: Float>(w: &[u8], x: &[f32], rows: usize, out: &mut [f32]) {
    by_rows!(float_rows::<F>(w, x, rows, out))
}

pub(crate) const KERNELS: Kernels = kernels!(q32, qk, Order::EvenOdd, |d| select!(float: d, float));

/// Whether this CPU runs these kernels.
pub(crate) fn detected() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
}
