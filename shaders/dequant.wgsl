// Decoding of weights in their ggml storage types. A weight part is bound as `wq`, the raw ggml
// bytes as little-endian u32 words with one spare word at the end, so that a 4-byte read at any
// byte offset stays inside the buffer. ggml blocks are 18, 20, 22, 34, 144 or 210 bytes, so block
// fields are rarely word-aligned: every field is read through the byte-addressed helpers below.
//
// `wload4_<dtype>(e, n)` returns the four values at element index `e` of the part (`e` is a
// multiple of 4 and the four lie in one row, hence in one quant block); only the first `n` of them
// are meaningful, which matters for float rows whose length is not a multiple of 4. The decode
// matmul's units (units.wgsl) read their fields through the same helpers.

fn wbyte(o: u32) -> u32 {
    return (wq[o >> 2u] >> ((o & 3u) << 3u)) & 0xffu;
}

// Four bytes at any byte offset, as one little-endian word.
fn wword(o: u32) -> u32 {
    let s = (o & 3u) << 3u;
    let lo = wq[o >> 2u];
    // A shift by 32 is a shift by 0 in WGSL, so the aligned case cannot share the formula.
    if (s == 0u) {
        return lo;
    }
    return (lo >> s) | (wq[(o >> 2u) + 1u] << (32u - s));
}

// Eight bytes at any byte offset, as two words: three loads where two `wword`s would take four.
fn wword2(o: u32) -> vec2<u32> {
    let a = o >> 2u;
    let w = vec3<u32>(wq[a], wq[a + 1u], wq[a + 2u]);
    let s = (o & 3u) << 3u;
    if (s == 0u) {
        return w.xy;
    }
    return (w.xy >> vec2<u32>(s)) | (w.yz << vec2<u32>(32u - s));
}

// The f16 at an even byte offset.
fn whalf(o: u32) -> f32 {
    return unpack2x16float(wq[o >> 2u] >> ((o & 2u) << 3u)).x;
}

fn bytes4(w: u32) -> vec4<u32> {
    return (vec4<u32>(w) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(0xffu);
}

fn nibbles4(w: u32, high: u32) -> vec4<u32> {
    return (bytes4(w) >> vec4<u32>(high * 4u)) & vec4<u32>(15u);
}

// Bit `e + i` of `qh` as the fifth bit (value 16) of each of four quants.
fn high_bits4(qh: u32, e: u32) -> vec4<u32> {
    return ((vec4<u32>(qh) >> (vec4<u32>(e) + vec4<u32>(0u, 1u, 2u, 3u))) & vec4<u32>(1u)) << vec4<u32>(4u);
}

fn wload4_f32(e: u32, n: u32) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    for (var c = 0u; c < min(n, 4u); c++) {
        v[c] = bitcast<f32>(wq[e + c]);
    }
    return v;
}

fn half_bits(e: u32) -> u32 {
    return (wq[e >> 1u] >> ((e & 1u) << 4u)) & 0xffffu;
}

fn wload4_f16(e: u32, n: u32) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    for (var c = 0u; c < min(n, 4u); c++) {
        v[c] = unpack2x16float(half_bits(e + c)).x;
    }
    return v;
}

fn wload4_bf16(e: u32, n: u32) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    for (var c = 0u; c < min(n, 4u); c++) {
        v[c] = bitcast<f32>(half_bits(e + c) << 16u);
    }
    return v;
}

fn wload4_q4_0(e: u32, n: u32) -> vec4<f32> {
    let base = (e >> 5u) * 18u;
    let j = e & 31u;
    let d = whalf(base);
    return (vec4<f32>(nibbles4(wword(base + 2u + (j & 15u)), j >> 4u)) - 8.0) * d;
}

fn wload4_q4_1(e: u32, n: u32) -> vec4<f32> {
    let base = (e >> 5u) * 20u;
    let j = e & 31u;
    return vec4<f32>(nibbles4(wword(base + 4u + (j & 15u)), j >> 4u)) * whalf(base) + whalf(base + 2u);
}

fn wload4_q5_0(e: u32, n: u32) -> vec4<f32> {
    let base = (e >> 5u) * 22u;
    let j = e & 31u;
    let d = whalf(base);
    let q = vec4<f32>(nibbles4(wword(base + 6u + (j & 15u)), j >> 4u) + high_bits4(wword(base + 2u), j));
    return q * d + (-16.0 * d);
}

fn wload4_q5_1(e: u32, n: u32) -> vec4<f32> {
    let base = (e >> 5u) * 24u;
    let j = e & 31u;
    let q = vec4<f32>(nibbles4(wword(base + 8u + (j & 15u)), j >> 4u) + high_bits4(wword(base + 4u), j));
    return q * whalf(base) + whalf(base + 2u);
}

fn wload4_q8_0(e: u32, n: u32) -> vec4<f32> {
    let base = (e >> 5u) * 34u;
    let q = bitcast<vec4<i32>>(vec4<u32>(wword(base + 2u + (e & 31u))) << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u);
    return vec4<f32>(q) * whalf(base);
}

// The 6-bit scale and min of sub-block `j` from the 12 packed scale bytes at byte `o`.
fn scale_min_k4(j: u32, o: u32) -> vec2<f32> {
    if (j < 4u) {
        return vec2<f32>(f32(wbyte(o + j) & 63u), f32(wbyte(o + j + 4u) & 63u));
    }
    let a = wbyte(o + j + 4u);
    return vec2<f32>(
        f32((a & 15u) | ((wbyte(o + j - 4u) >> 6u) << 4u)),
        f32((a >> 4u) | ((wbyte(o + j) >> 6u) << 4u)),
    );
}

// Q4_K and Q5_K share their layout but for Q5_K's 32 bytes of fifth bits before the quants.
fn wload4_k4(e: u32, block_bytes: u32, qs_at: u32) -> vec4<f32> {
    let base = (e >> 8u) * block_bytes;
    let j = e & 255u;
    let c = j >> 6u;
    let l = j & 63u;
    let hi = l >> 5u;
    let sm = scale_min_k4(2u * c + hi, base + 4u);
    var q = nibbles4(wword(base + qs_at + 32u * c + (l & 31u)), hi);
    if (qs_at == 48u) {
        let qh = (bytes4(wword(base + 16u + (l & 31u))) >> vec4<u32>(2u * c + hi)) & vec4<u32>(1u);
        q += qh << vec4<u32>(4u);
    }
    return whalf(base) * sm.x * vec4<f32>(q) - whalf(base + 2u) * sm.y;
}

fn wload4_q4_k(e: u32, n: u32) -> vec4<f32> {
    return wload4_k4(e, 144u, 16u);
}

fn wload4_q5_k(e: u32, n: u32) -> vec4<f32> {
    return wload4_k4(e, 176u, 48u);
}

fn wload4_q6_k(e: u32, n: u32) -> vec4<f32> {
    let base = (e >> 8u) * 210u;
    let j = e & 255u;
    let h = j >> 7u;
    let quad = (j >> 5u) & 3u;
    let l = j & 31u;
    let lo = (bytes4(wword(base + 64u * h + l + (quad & 1u) * 32u)) >> vec4<u32>((quad >> 1u) * 4u)) & vec4<u32>(15u);
    let hb = (bytes4(wword(base + 128u + 32u * h + l)) >> vec4<u32>(2u * quad)) & vec4<u32>(3u);
    let q = vec4<f32>(vec4<i32>(lo | (hb << vec4<u32>(4u))) - vec4<i32>(32));
    let sc = f32((bitcast<i32>(wbyte(base + 192u + 8u * h + (l >> 4u) + 2u * quad) << 24u)) >> 24u);
    return whalf(base + 208u) * sc * q;
}
