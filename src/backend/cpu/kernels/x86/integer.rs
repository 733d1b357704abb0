//! The integer kernels of an x86-64 kernel set, written once and compiled for each set's
//! instructions: `#[target_feature]` takes only a literal, and a helper inlines into its caller only
//! where the caller has every feature the helper was compiled for, so the loops that call a set's
//! multiply-adds are instantiated per set by [`integer_kernels!`]. The decoders they call, which
//! need only AVX2, are shared (see the parent module).
//!
//! The sets differ in two multiply-adds: `dpwssd` (`acc + Σ` pairs of i16 products, `vpdpwssd`
//! with VNNI, `vpmaddwd` + `vpaddd` without) and `dpbusd` (`acc + Σ` quads of unsigned-by-signed
//! byte products, `vpdpbusd` with VNNI, `vpmaddubsw` + `vpmaddwd` by ones + `vpaddd` without).
//! Every operand the kernels pass keeps each pair of byte products within i16 and each sum within
//! i32, where the two forms compute the same integers, so every set gives the same bits.

/// Defines `KERNELS` for the set whose target features are `$features`, with its two
/// multiply-adds (see the module doc) and the width of its K-quant dots: `narrow` on 256-bit
/// vectors, or `wide` on 512-bit ones (AVX-512 only), whose `dpwssd` then takes 512-bit vectors
/// and `dpbusd` (for 32-value blocks) 256-bit ones; and up to how many activation rows its
/// K-quant kernel takes weight rows in pairs (`pair_rows`, see `PAIR_ROWS`).
macro_rules! integer_kernels {
    ($features:literal, dpwssd: $dpwssd:path, dpbusd: $dpbusd:path, width: $width:ident, pair_rows: $pair_rows:expr) => {
        use std::arch::x86_64::*;

        use super::float::float;
        use super::*;

        /// How 32 weight values meet 32 activations of one integer type.
        trait Dot: ActInt {
            /// 32 weight values as the dot wants them.
            type W: Copy;
            /// The 32 values of a 32-value block, signed where `signed`, in order.
            unsafe fn weights32(v: __m256i, signed: bool) -> Self::W;
            /// A K-quant block's weights as one step of its dot takes them: [`Dot::STEP`] chunks of 32.
            type WK: Copy;
            /// How many chunks of 32 values [`Dot::weights_k`] decodes at once.
            const STEP: usize;
            /// The unsigned values of chunks `t..t + STEP` of K-quant block `p`, scaled by the scale bytes
            /// `sc` of the block (see [`scale_bytes`] and [`scale_at`]). Where `less32`, each value is
            /// taken less 32: Q6_K's stored offset, which then needs no correction and halves the
            /// products' magnitude.
            unsafe fn weights_k<F: BlockK>(p: *const u8, t: usize, sc: __m256i, less32: bool) -> Self::WK;
            /// Whether [`Dot::weights_k`] takes `less32`.
            const LESS32: bool;
            /// Whether the K-quant kernel may take weight rows in pairs with this activation type (see
            /// [`PAIR_ROWS`]): at 16 bits each activation load then serves two rows' multiply-adds; at
            /// 8 bits, with half the loads to share, pairs measured even for Q4_K and 3-9% slower for
            /// Q6_K at two and three rows (Zen 5, one thread, AVX-512 and AVX-VNNI sets alike).
            const PAIRS: bool = false;
            /// Partial sums of a run of chunks, kept apart until [`Dot::total`] where that saves adds.
            type Acc: Copy;
            const ZERO: Self::Acc;
            /// How many products each i32 lane of an `Acc` gathers per chunk (the parts of an `Acc` meet
            /// only in f32).
            const PER_LANE: i32;
            /// `acc` plus the products of a step's weights with the activations at `q`.
            unsafe fn dot_acc(w: Self::WK, q: *const Self, acc: Self::Acc) -> Self::Acc;
            /// How many i32 parts an `Acc` has.
            const PARTS: i32;
            /// Like [`Dot::dot_acc`], with every product gathered in the first part and the others left
            /// as they are: fewer registers per row, each lane gathering `PARTS` times as many products.
            /// Where an `Acc` is one register, the same as [`Dot::dot_acc`].
            #[inline(always)]
            unsafe fn dot_acc_one(w: Self::WK, q: *const Self, acc: Self::Acc) -> Self::Acc {
                Self::dot_acc(w, q, acc)
            }
            /// Eight partial sums of everything `acc` gathered, in f32.
            unsafe fn total(acc: Self::Acc) -> __m256;
            /// [`Dot::total`] of an `acc` that only [`Dot::dot_acc_one`] added to; the same where an
            /// `Acc` is one register.
            #[inline(always)]
            unsafe fn total_one(acc: Self::Acc) -> __m256 {
                Self::total(acc)
            }
            /// `v`, made to depend on `acc` (see [`after`]).
            unsafe fn after(v: __m256i, acc: &Self::Acc) -> __m256i;

            /// Eight partial sums of the 32 products of a 32-value block's weights with the activations
            /// at `q`, in f32.
            unsafe fn dot(w: Self::W, q: *const Self) -> __m256;
        }

        /// A 32-value block's values as unsigned bytes for `dpbusd`, which multiplies unsigned by signed:
        /// a signed weight's sign moves onto its activation.
        #[derive(Clone, Copy)]
        struct Bytes {
            v: __m256i,
            sign: Option<__m256i>,
        }

        impl Bytes {
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn new(v: __m256i, signed: bool) -> Bytes {
                match signed {
                    true => Bytes { v: _mm256_sign_epi8(v, v), sign: Some(v) },
                    false => Bytes { v, sign: None },
                }
            }

            /// Eight partial sums of the 32 products with the 8-bit activations at `q`, in f32.
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn dot(self, q: *const i8) -> __m256 {
                let q = load(q as *const u8);
                let q = self.sign.map_or(q, |s| _mm256_sign_epi8(q, s));
                _mm256_cvtepi32_ps($dpbusd(_mm256_setzero_si256(), self.v, q))
            }
        }

        /// Up to how many activation rows the K-quant kernel takes weight rows two at a time (from
        /// two on), each activation load serving both. With 32 vector registers the second weight
        /// row's sums fit beside the first's (at 16 bits, 1,536 x 8,960 on a Zen 5, one thread: 17%
        /// less time at three activation rows, 12% at five, 10-18% at nine). With 16 they spill: AVX2
        /// ran 9-12% slower from two rows on, AVX-VNNI faster up to three and slower from five. A
        /// decode keeps one weight row: it waits on memory, and two short rows at once read as two
        /// streams where one long one runs on (Q4_K 8,960 x 1,536 from memory 1.8x slower).
        const PAIR_ROWS: usize = $pair_rows;

        /// Whether `R` activation rows of type `T` take weight rows in pairs (see [`PAIR_ROWS`]).
        const fn pairs<T: Dot, const R: usize>() -> bool {
            T::PAIRS && R > 1 && R <= PAIR_ROWS
        }

        super::integer::integer_kernels!(@i8 $width, $features, $dpwssd, $dpbusd);
        super::integer::integer_kernels!(@i16 $width, $features, $dpwssd);

        #[inline]
        #[target_feature(enable = $features)]
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

        /// The K-quant kernel over many weight rows (see [`RowsFn`]), [`TILE_ROWS`] at a time. With more
        /// than one activation row it runs over K in tiles that fit [`L1_ACTIVATIONS`], each tile taken by
        /// every row of the group in turn (or pair of rows, see [`PAIR_ROWS`]), and prefetches weights two
        /// passes below, which it reads a little later. A row's sums still gather block after block in one
        /// order, so results do not depend on the tiling: a decode's and a batch's agree to the bit.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn qk_rows<F: BlockK, T: Dot, const R: usize>(w: &[u8], x: &[ActK<T>], out: &mut [f32]) {
            let n = out.len() / R;
            let nb = x.len() / R;
            let row_bytes = nb * F::BYTES;
            debug_assert!(nb > 0 && w.len() == n * row_bytes);
            // One row's activations are read once per weight row alongside weights from memory, which
            // bound a decode; tiling would only break up its weights' stream.
            let tiles = if R == 1 { 1 } else { (R * nb * std::mem::size_of::<ActK<T>>()).div_ceil(L1_ACTIVATIONS) };
            let tile = nb.div_ceil(tiles);
            // A tiled pass prefetches its tile two passes below: four rows where rows go in pairs (at two,
            // seven to nine rows of Q6_K 8960 x 1536 from memory took 1.2x the time of one row a pass).
            let ahead = if tile == nb { PREFETCH_AHEAD } else if pairs::<T, R>() { 4 * row_bytes } else { 2 * row_bytes };
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
        #[target_feature(enable = $features)]
        unsafe fn qk_tile<F: BlockK, T: Dot, const R: usize>(
            w: *const u8,
            row_bytes: usize,
            x: &[ActK<T>],
            nb: usize,
            blocks: std::ops::Range<usize>,
            ahead: usize,
            acc: &mut [[__m256; R]],
        ) {
            let mut j = 0;
            if pairs::<T, R>() {
                while j + 2 <= acc.len() {
                    let rows = [w.add(j * row_bytes), w.add((j + 1) * row_bytes)];
                    [acc[j], acc[j + 1]] = qk_blocks::<F, T, R, 2>(rows, x, nb, blocks.clone(), ahead, [acc[j], acc[j + 1]]);
                    j += 2;
                }
            }
            for j in j..acc.len() {
                [acc[j]] = qk_blocks::<F, T, R, 1>([w.add(j * row_bytes)], x, nb, blocks.clone(), ahead, [acc[j]]);
            }
        }

        /// `acc[k]` plus blocks `blocks` of weight row `w[k]` dotted with each of the `R` activation rows,
        /// for `W` weight rows side by side: each activation load then serves `W` rows. The per-row
        /// arrays are filled by loops, not `std::array::from_fn`: a closure does not inherit this
        /// function's target features, so the decoders and multiply-adds it calls were not inlined
        /// (2.5-5x slower).
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn qk_blocks<F: BlockK, T: Dot, const R: usize, const W: usize>(
            w: [*const u8; W],
            x: &[ActK<T>],
            nb: usize,
            blocks: std::ops::Range<usize>,
            ahead: usize,
            mut acc: [[__m256; R]; W],
        ) -> [[__m256; R]; W] {
            // Q6_K's values less their offset where the activations' type allows it.
            let less32 = F::SIX && T::LESS32;
            let max_w = F::max_product(less32);
            // One sum per row where it lasts half a block without overflowing: with five rows, the
            // parts' registers are what pushes the weights out to the stack.
            let span_one = chunks_per_sum(T::PER_LANE * T::PARTS, max_w, T::MAX);
            let one_part = span_one >= QK_K / 32 / 2;
            let span = if one_part { span_one } else { chunks_per_sum(T::PER_LANE, max_w, T::MAX) };
            // A sum gathers whole steps, and a step of two chunks keeps them apart by chunk rather than
            // by parity, so its halves must meet in i32 as one part does: at 16 bits every K-quant sums
            // 4 or 8 chunks in one part.
            debug_assert!(span.is_multiple_of(T::STEP) && (T::STEP == 1 || one_part));
            for b in blocks {
                let mut p = w;
                for p in &mut p {
                    *p = p.add(b * F::BYTES);
                    prefetch(p.wrapping_add(ahead), F::BYTES);
                }
                let mut s = [scales::<F>(p[0]); W];
                let mut sc = [scale_bytes::<F>(p[0], s[0]); W];
                for k in 1..W {
                    s[k] = scales::<F>(p[k]);
                    sc[k] = scale_bytes::<F>(p[k], s[k]);
                }
                let mut sums = [[T::ZERO; W]; R];
                // Unrolled, so that each chunk's shifts and scale shuffles are constants.
                chunks!(t => {
                    if t.is_multiple_of(T::STEP) {
                        let mut v = [T::weights_k::<F>(p[0], t, sc[0], less32); W];
                        for k in 1..W {
                            v[k] = T::weights_k::<F>(p[k], t, sc[k], less32);
                        }
                        for i in 0..R {
                            let q = x.get_unchecked(i * nb + b).qs.as_ptr().add(32 * t);
                            for k in 0..W {
                                let sum = sums[i][k];
                                sums[i][k] = if one_part { T::dot_acc_one(v[k], q, sum) } else { T::dot_acc(v[k], q, sum) };
                                if R > 1 {
                                    sc[k] = T::after(sc[k], &sums[i][k]);
                                }
                            }
                        }
                    }
                    if (t + 1).is_multiple_of(span) {
                        for k in 0..W {
                            // The offsets' term joins the block's last sums: a.d * (d * sums - dc * Σ c * bsums).
                            let offsets = (t + 1 == QK_K / 32 && !less32).then(|| Offsets::new::<F>(p[k], s[k]));
                            for i in 0..R {
                                let a = x.get_unchecked(i * nb + b);
                                let total = if one_part { T::total_one(sums[i][k]) } else { T::total(sums[i][k]) };
                                let ad = _mm256_broadcast_ss(&a.d);
                                acc[k][i] = match offsets {
                                    Some(c) => _mm256_fmadd_ps(_mm256_fmsub_ps(total, scale_d(s[k]), c.dot::<F, T>(a)), ad, acc[k][i]),
                                    None => _mm256_fmadd_ps(total, _mm256_mul_ps(scale_d(s[k]), ad), acc[k][i]),
                                };
                                sums[i][k] = T::ZERO;
                            }
                        }
                    }
                });
            }
            acc
        }

        #[target_feature(enable = $features)]
        unsafe fn q32<F: Block32, T: Dot>(w: &[u8], x: &[Act32<T>], rows: usize, out: &mut [f32]) {
            by_rows!(q32_rows::<F, T>(w, x, rows, out))
        }

        #[target_feature(enable = $features)]
        unsafe fn qk<F: BlockK, T: Dot>(w: &[u8], x: &[ActK<T>], rows: usize, out: &mut [f32]) {
            by_rows!(all qk_rows::<F, T>(w, x, rows, out))
        }

        pub(crate) const KERNELS: Kernels = kernels!(q32, qk, I16_ORDER, |d| select!(float: d, float));
    };
    (@i8 narrow, $features:literal, $dpwssd:path, $dpbusd:path) => {
        impl Dot for i8 {
            type W = Bytes;

            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn weights32(v: __m256i, signed: bool) -> Bytes {
                Bytes::new(v, signed)
            }

            /// The chunk's values, and the scale of each pair of them in its 16-bit lane: `maddubs` sums
            /// the pairs' products, `dpwssd` scales them.
            type WK = [__m256i; 2];
            const STEP: usize = 1;

            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn weights_k<F: BlockK>(p: *const u8, t: usize, sc: __m256i, less32: bool) -> [__m256i; 2] {
                debug_assert!(!less32, "maddubs takes unsigned weights");
                // The scale byte in the high byte of each 16-bit lane, shifted down with its sign.
                let at = spread(scale_at::<F>(t, 0), scale_at::<F>(t, 1), [false, true]);
                [chunk_k::<F>(p, t), _mm256_srai_epi16(_mm256_shuffle_epi8(sc, at), 8)]
            }

            const LESS32: bool = false;

            type Acc = __m256i;
            const ZERO: __m256i = unsafe { std::mem::transmute([0u8; 32]) };
            const PER_LANE: i32 = 4;

            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn dot_acc(w: [__m256i; 2], q: *const i8, acc: __m256i) -> __m256i {
                $dpwssd(acc, _mm256_maddubs_epi16(w[0], load(q as *const u8)), w[1])
            }

            const PARTS: i32 = 1;

            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn dot(w: Bytes, q: *const i8) -> __m256 {
                w.dot(q)
            }

            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn total(acc: __m256i) -> __m256 {
                _mm256_cvtepi32_ps(acc)
            }

            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn after(v: __m256i, acc: &__m256i) -> __m256i {
                after(v, *acc)
            }
        }
    };
    (@i8 wide, $features:literal, $dpwssd:path, $dpbusd:path) => {
        /// 8-bit activations: a 32-value block as in the narrow form, on 256-bit vectors; a K-quant step
        /// takes two chunks, decoded into one 512-bit vector and met by one 64-byte load of
        /// activations (in their natural order), one `maddubs` and one `vpdpwssd` by the scales per
        /// row. Lanes 0..8 of a sum gather what the narrow form's lanes gather from the first chunk,
        /// lanes 8..16 from the second, and the halves meet in i32 before f32, so both forms give the
        /// same bits.
        impl Dot for i8 {
            type W = Bytes;

            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn weights32(v: __m256i, signed: bool) -> Bytes {
                Bytes::new(v, signed)
            }

            /// Both chunks' values, and the scale of each pair of them in its 16-bit lane.
            type WK = [__m512i; 2];
            const STEP: usize = 2;

            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn weights_k<F: BlockK>(p: *const u8, t: usize, sc: __m256i, less32: bool) -> [__m512i; 2] {
                debug_assert!(!less32, "maddubs takes unsigned weights");
                let sc = _mm512_broadcast_i32x4(_mm256_castsi256_si128(sc));
                // The scale byte in the high byte of each 16-bit lane, shifted down with its sign: chunk
                // t's in the low 256 bits, chunk t + 1's in the high.
                let sc = _mm512_srai_epi16::<8>(_mm512_shuffle_epi8(sc, spread_pair::<F>(t, [false, true])));
                [chunk_pair_k::<F>(p, t), sc]
            }

            const LESS32: bool = false;

            type Acc = __m512i;
            const ZERO: __m512i = unsafe { std::mem::transmute([0u8; 64]) };
            const PER_LANE: i32 = 4;

            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn dot_acc(w: [__m512i; 2], q: *const i8, acc: __m512i) -> __m512i {
                $dpwssd(acc, _mm512_maddubs_epi16(w[0], _mm512_loadu_si512(q as *const _)), w[1])
            }

            const PARTS: i32 = 1;

            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn dot(w: Bytes, q: *const i8) -> __m256 {
                w.dot(q)
            }

            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn total(acc: __m512i) -> __m256 {
                let (first, second) = (_mm512_castsi512_si256(acc), _mm512_extracti64x4_epi64::<1>(acc));
                _mm256_cvtepi32_ps(_mm256_add_epi32(first, second))
            }

            /// `v` as it is: with 32 vector registers the pin is not needed (see the 16-bit form).
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn after(v: __m256i, _acc: &__m512i) -> __m256i {
                v
            }
        }
    };
    (@i16 narrow, $features:literal, $dpwssd:path) => {
        const I16_ORDER: Order = Order::EvenOdd;

        /// 16-bit lanes for `dpwssd` with 16-bit activations.
        impl Dot for i16 {
            type W = [__m256i; 2];

            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn weights32(v: __m256i, signed: bool) -> [__m256i; 2] {
                let (lo, hi) = (_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
                match signed {
                    true => [_mm256_cvtepi8_epi16(lo), _mm256_cvtepi8_epi16(hi)],
                    false => [_mm256_cvtepu8_epi16(lo), _mm256_cvtepu8_epi16(hi)],
                }
            }

            type WK = [__m256i; 2];
            const STEP: usize = 1;

            /// Widened and scaled at once by `maddubs` against the scale in every other byte: the values
            /// at even positions, then those at odd positions ([`Order::EvenOdd`]).
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn weights_k<F: BlockK>(p: *const u8, t: usize, sc: __m256i, less32: bool) -> [__m256i; 2] {
                let v = chunk_k::<F>(p, t);
                let (lo, hi) = (scale_at::<F>(t, 0), scale_at::<F>(t, 1));
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
            const PAIRS: bool = true;

            /// The products of even and of odd positions gather apart, up to f32: two short chains of
            /// adds rather than one through both `madd`s, each of half the magnitude.
            type Acc = [__m256i; 2];
            const ZERO: [__m256i; 2] = unsafe { std::mem::transmute([0u8; 64]) };
            const PER_LANE: i32 = 2;

            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn dot_acc(w: [__m256i; 2], q: *const i16, acc: [__m256i; 2]) -> [__m256i; 2] {
                [
                    $dpwssd(acc[0], w[0], load(q as *const u8)),
                    $dpwssd(acc[1], w[1], load(q.add(16) as *const u8)),
                ]
            }

            const PARTS: i32 = 2;

            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn dot_acc_one(w: [__m256i; 2], q: *const i16, acc: [__m256i; 2]) -> [__m256i; 2] {
                let even = $dpwssd(acc[0], w[0], load(q as *const u8));
                [$dpwssd(even, w[1], load(q.add(16) as *const u8)), acc[1]]
            }

            /// With no sum to add to, the plain multiply-adds: a VNNI one would need a zeroed register.
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn dot(w: [__m256i; 2], q: *const i16) -> __m256 {
                let even = _mm256_madd_epi16(w[0], load(q as *const u8));
                let odd = _mm256_madd_epi16(w[1], load(q.add(16) as *const u8));
                _mm256_add_ps(_mm256_cvtepi32_ps(even), _mm256_cvtepi32_ps(odd))
            }

            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn total(acc: [__m256i; 2]) -> __m256 {
                _mm256_add_ps(_mm256_cvtepi32_ps(acc[0]), _mm256_cvtepi32_ps(acc[1]))
            }

            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn total_one(acc: [__m256i; 2]) -> __m256 {
                _mm256_cvtepi32_ps(acc[0])
            }

            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn after(v: __m256i, acc: &[__m256i; 2]) -> __m256i {
                after(after(v, acc[0]), acc[1])
            }
        }
    };
    (@i16 wide, $features:literal, $dpwssd:path) => {
        const I16_ORDER: Order = Order::EvenOddPairs;

        /// 16-bit activations on 512-bit vectors. A 32-value block's weights are one vector of 16-bit
        /// lanes, met by one 64-byte load of activations and one `vpdpwssd` per row. A K-quant step
        /// takes two chunks ([`Order::EvenOddPairs`]): their 64 values decoded into one vector, scaled
        /// into the two chunks' even positions by one `maddubs` and their odd positions by another,
        /// each met by a 64-byte load and a `vpdpwssd` per row. Lanes 0..8 of a sum gather what the
        /// narrow form's lanes gather from the first chunk, lanes 8..16 from the second, and the
        /// halves meet in i32 before f32, so both forms give the same bits.
        impl Dot for i16 {
            type W = __m512i;

            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn weights32(v: __m256i, signed: bool) -> __m512i {
                match signed {
                    true => _mm512_cvtepi8_epi16(v),
                    false => _mm512_cvtepu8_epi16(v),
                }
            }

            type WK = [__m512i; 2];
            const STEP: usize = 2;

            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn weights_k<F: BlockK>(p: *const u8, t: usize, sc: __m256i, less32: bool) -> [__m512i; 2] {
                let sc = _mm512_broadcast_i32x4(_mm256_castsi256_si128(sc));
                let spread = |at| _mm512_shuffle_epi8(sc, spread_pair::<F>(t, at));
                let (even, odd) = (spread([true, false]), spread([false, true]));
                let v = chunk_pair_k::<F>(p, t);
                let w = [_mm512_maddubs_epi16(v, even), _mm512_maddubs_epi16(v, odd)];
                if !less32 {
                    return w;
                }
                // 32 times each lane's scale: the odd spread holds it in the high byte, 256 times over.
                let offset = _mm512_srai_epi16::<3>(odd);
                w.map(|w| _mm512_sub_epi16(w, offset))
            }

            const LESS32: bool = true;
            const PAIRS: bool = true;

            type Acc = __m512i;
            const ZERO: __m512i = unsafe { std::mem::transmute([0u8; 64]) };
            const PER_LANE: i32 = 2;

            /// The even positions of both chunks, then the odd ones: the activations at `q` are laid out so.
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn dot_acc(w: [__m512i; 2], q: *const i16, acc: __m512i) -> __m512i {
                let even = $dpwssd(acc, w[0], _mm512_loadu_si512(q as *const _));
                $dpwssd(even, w[1], _mm512_loadu_si512(q.add(32) as *const _))
            }

            /// The two halves gather what the narrow form's two parts gather; they meet in
            /// [`Dot::total_one`].
            const PARTS: i32 = 2;

            /// With no sum to add to, the plain multiply-add: a VNNI one would need a zeroed register.
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn dot(w: __m512i, q: *const i16) -> __m256 {
                Self::total(_mm512_madd_epi16(w, _mm512_loadu_si512(q as *const _)))
            }

            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn total(acc: __m512i) -> __m256 {
                let (even, odd) = (_mm512_castsi512_si256(acc), _mm512_extracti64x4_epi64::<1>(acc));
                _mm256_add_ps(_mm256_cvtepi32_ps(even), _mm256_cvtepi32_ps(odd))
            }

            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn total_one(acc: __m512i) -> __m256 {
                let (even, odd) = (_mm512_castsi512_si256(acc), _mm512_extracti64x4_epi64::<1>(acc));
                _mm256_cvtepi32_ps(_mm256_add_epi32(even, odd))
            }

            /// `v` as it is: with 32 vector registers a block's decoded weights fit without the
            /// order that the pin imposes, and the pin cost 2-4% at five rows (Q4_K and Q5_K).
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn after(v: __m256i, _acc: &__m512i) -> __m256i {
                v
            }
        }
    };
}
pub(super) use integer_kernels;
