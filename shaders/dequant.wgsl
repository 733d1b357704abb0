// Decoding of weights in their ggml storage types. A weight part is bound as `wq`, the raw ggml
// bytes as little-endian u32 words with one spare word at the end, so that a 4-byte read at any
// byte offset stays inside the buffer. ggml blocks are 18, 20, 22, 34, 144 or 210 bytes, so block
// fields are rarely word-aligned: every field is read through the byte-addressed helpers below.
//
// `wload4_<dtype>(e, n)` returns the four values at element index `e` of the part (`e` is a
// multiple of 4 and the four lie in one row, hence in one quant block); only the first `n` of them
// are meaningful, which matters for float rows whose length is not a multiple of 4.

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

// The f16 at an even byte offset.
fn whalf(o: u32) -> f32 {
    return unpack2x16float(wq[o >> 2u] >> ((o & 2u) << 3u)).x;
}

fn bytes4(w: u32) -> vec4<u32> {
    return (vec4<u32>(w) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(0xffu);
}

fn nibbles4(w: u32, high: u32) -> vec4<f32> {
    return vec4<f32>((bytes4(w) >> vec4<u32>(high * 4u)) & vec4<u32>(15u));
}

// Bit `e + i` of `qh` as the fifth bit (value 16) of each of four quants.
fn high_bits4(qh: u32, e: u32) -> vec4<f32> {
    return vec4<f32>(((vec4<u32>(qh) >> (vec4<u32>(e) + vec4<u32>(0u, 1u, 2u, 3u))) & vec4<u32>(1u)) << vec4<u32>(4u));
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
    return (nibbles4(wword(base + 2u + (j & 15u)), j >> 4u) - 8.0) * d;
}

fn wload4_q4_1(e: u32, n: u32) -> vec4<f32> {
    let base = (e >> 5u) * 20u;
    let j = e & 31u;
    return nibbles4(wword(base + 4u + (j & 15u)), j >> 4u) * whalf(base) + whalf(base + 2u);
}

fn wload4_q5_0(e: u32, n: u32) -> vec4<f32> {
    let base = (e >> 5u) * 22u;
    let j = e & 31u;
    let d = whalf(base);
    let q = nibbles4(wword(base + 6u + (j & 15u)), j >> 4u) + high_bits4(wword(base + 2u), j);
    return q * d + (-16.0 * d);
}

fn wload4_q5_1(e: u32, n: u32) -> vec4<f32> {
    let base = (e >> 5u) * 24u;
    let j = e & 31u;
    let q = nibbles4(wword(base + 8u + (j & 15u)), j >> 4u) + high_bits4(wword(base + 4u), j);
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
        q += vec4<f32>(qh << vec4<u32>(4u));
    }
    return whalf(base) * sm.x * q - whalf(base + 2u) * sm.y;
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

// Units of the decode matmul, one family of functions per unit `U` (the kernel's UNIT: `4`, or a
// quantized type other than Q8_0). A thread takes a row's weights a unit at a time, UV_U vec4s:
// the unit's scale fields are decoded and its words of quants read once (`wunit_U(e0, u, k)`,
// for unit `u` of the row whose first element is `e0`, of length `k`), its vec4s then decoded
// from those (`wquad_U(unit, v)`: vec4 `v` of the unit), and `xunit_U(u)` gives the columns where
// its vec4s start. A K-quant unit is 16 values laid out as ggml packs them: in Q4_K two words hold
// four values of each of four sub-blocks, whose scales a four-value decode read for each four
// values. Neighbouring units lie in neighbouring words, so that neighbouring threads read
// neighbouring bytes.

struct Unit {
    // A K-quant unit's words, read once: two of quants, and one of high bits where the type has
    // them. A 32-value block's word of quants and, in Q5_0/Q5_1, of fifth bits. A four-value
    // unit's first element and how many of its values lie in the row.
    w: vec3<u32>,
    // In Q5_K, the bit of the unit's first sub-block in its word of high bits.
    bit: u32,
    // Each vec4's scale and offset: its values are quant * d + m.
    d: vec4<f32>,
    m: vec4<f32>,
}

const UV_4: u32 = 1u;
const UV_q4_k: u32 = 4u;
const UV_q5_k: u32 = 4u;
const UV_q6_k: u32 = 4u;

// Float types and Q8_0 take units of four values, decoded by `wload4_{{DTYPE}}`; the unit's `w`
// holds where they start and how many of them are in the row.
fn xunit_4(u: u32) -> vec4<u32> {
    return vec4<u32>(4u * u);
}

fn wunit_4(e0: u32, u: u32, k: u32) -> Unit {
    return Unit(vec3<u32>(e0 + 4u * u, k - 4u * u, 0u), 0u, vec4<f32>(), vec4<f32>());
}

fn wquad_4(n: Unit, v: u32) -> vec4<f32> {
    return wload4_{{DTYPE}}(n.w.x, n.w.y);
}

// 4- and 5-bit 32-value-block types: unit `i` of a block (4 units) takes the word at byte 4i of
// the block's quants, whose low nibbles are values 4i..4i+3 and high nibbles 4i+16..4i+19. So the
// block's scale fields (and Q5's word of fifth bits) are read once for eight values, and the four
// units of a block lie side by side in its bytes, as the lanes that take them do. Q8_0, with one
// value a byte, gains nothing from it and keeps four-value units (docs/measurements.md, "Where a
// decode's time goes, and vector loads of the activations").
const UV_q4_0: u32 = 2u;
const UV_q4_1: u32 = 2u;
const UV_q5_0: u32 = 2u;
const UV_q5_1: u32 = 2u;

fn xunit_b32(u: u32) -> vec4<u32> {
    let c = (u >> 2u) * 32u + 4u * (u & 3u);
    return vec4<u32>(c, c + 16u, 0u, 0u);
}

// The byte offset of unit `u`'s block and its quants' word offset in the block, for a row whose
// first element is `e0`.
fn b32_at(e0: u32, u: u32, block_bytes: u32) -> vec2<u32> {
    return vec2<u32>(((e0 >> 5u) + (u >> 2u)) * block_bytes, 4u * (u & 3u));
}

fn wunit_q4_0(e0: u32, u: u32, k: u32) -> Unit {
    let b = b32_at(e0, u, 18u);
    return Unit(vec3<u32>(wword(b.x + 2u + b.y), 0u, 0u), 0u, vec4<f32>(whalf(b.x)), vec4<f32>());
}

fn wquad_q4_0(n: Unit, v: u32) -> vec4<f32> {
    return (nibbles4(n.w.x, v) - 8.0) * n.d[v];
}

fn wunit_q4_1(e0: u32, u: u32, k: u32) -> Unit {
    let b = b32_at(e0, u, 20u);
    let dm = unpack2x16float(wq[b.x >> 2u]);
    return Unit(vec3<u32>(wq[(b.x + 4u + b.y) >> 2u], 0u, 0u), 0u, vec4<f32>(dm.x), vec4<f32>(dm.y));
}

fn wquad_q4_1(n: Unit, v: u32) -> vec4<f32> {
    return nibbles4(n.w.x, v) * n.d[v] + n.m[v];
}

// Q5_0 and Q5_1 keep the unit's eight fifth bits at bits 0-3 and 16-19 of `w.y`.
fn wunit_q5_0(e0: u32, u: u32, k: u32) -> Unit {
    let b = b32_at(e0, u, 22u);
    let d = whalf(b.x);
    return Unit(vec3<u32>(wword(b.x + 6u + b.y), wword(b.x + 2u) >> b.y, 0u), 0u, vec4<f32>(d), vec4<f32>(-16.0 * d));
}

fn wunit_q5_1(e0: u32, u: u32, k: u32) -> Unit {
    let b = b32_at(e0, u, 24u);
    let dm = unpack2x16float(wq[b.x >> 2u]);
    return Unit(vec3<u32>(wq[(b.x + 8u + b.y) >> 2u], wq[(b.x + 4u) >> 2u] >> b.y, 0u), 0u, vec4<f32>(dm.x), vec4<f32>(dm.y));
}

fn wquad_q5_0(n: Unit, v: u32) -> vec4<f32> {
    return (nibbles4(n.w.x, v) + high_bits4(n.w.y, 16u * v)) * n.d[v] + n.m[v];
}

fn wquad_q5_1(n: Unit, v: u32) -> vec4<f32> {
    return wquad_q5_0(n, v);
}

fn xunit_q4_0(u: u32) -> vec4<u32> {
    return xunit_b32(u);
}

fn xunit_q4_1(u: u32) -> vec4<u32> {
    return xunit_b32(u);
}

fn xunit_q5_0(u: u32) -> vec4<u32> {
    return xunit_b32(u);
}

fn xunit_q5_1(u: u32) -> vec4<u32> {
    return xunit_b32(u);
}

// Q4_K and Q5_K: unit `i` of a 256-value block (16 units) takes the four values at `l` = 4i % 32
// of the 32 bytes of quants of chunks c and c + 2 (c = i / 8): the low and high nibbles of each,
// sub-blocks 2c, 2c + 1, 2c + 4 and 2c + 5, whose 6-bit scales and mins sit in two bytes of each
// of the three scale words.
fn xunit_k4(u: u32) -> vec4<u32> {
    let i = u & 15u;
    return vec4<u32>((u >> 4u) * 256u + 64u * (i >> 3u) + 4u * (i & 7u)) + vec4<u32>(0u, 32u, 128u, 160u);
}

fn wunit_k4(e0: u32, u: u32, block_bytes: u32, qs_at: u32) -> Unit {
    let base = ((e0 >> 8u) + (u >> 4u)) * block_bytes;
    let i = u & 15u;
    let c = i >> 3u;
    let l = 4u * (i & 7u);
    let dm = unpack2x16float(wq[base >> 2u]);
    let sh = 16u * c;
    let s0 = (wq[(base >> 2u) + 1u] >> sh) & 0xffffu;
    let s1 = (wq[(base >> 2u) + 2u] >> sh) & 0xffffu;
    let s2 = (wq[(base >> 2u) + 3u] >> sh) & 0xffffu;
    let sc = vec4<f32>(bytes4((s0 & 0x3f3fu) | (((s2 & 0x0f0fu) | ((s0 & 0xc0c0u) >> 2u)) << 16u)));
    let mn = vec4<f32>(bytes4((s1 & 0x3f3fu) | ((((s2 >> 4u) & 0x0f0fu) | ((s1 & 0xc0c0u) >> 2u)) << 16u)));
    let at = (base + qs_at + 32u * c + l) >> 2u;
    var hi = 0u;
    if (qs_at == 48u) {
        hi = wq[(base + 16u + l) >> 2u];
    }
    return Unit(vec3<u32>(wq[at], wq[at + 16u], hi), 2u * c, dm.x * sc, -(dm.y * mn));
}

fn wquad_k4(n: Unit, v: u32, has_high: bool) -> vec4<f32> {
    var q = nibbles4(n.w[v >> 1u], v & 1u);
    if (has_high) {
        let bit = n.bit + (v & 1u) + 4u * (v >> 1u);
        q += vec4<f32>(((bytes4(n.w.z) >> vec4<u32>(bit)) & vec4<u32>(1u)) << vec4<u32>(4u));
    }
    return n.d[v] * q + n.m[v];
}

fn xunit_q4_k(u: u32) -> vec4<u32> {
    return xunit_k4(u);
}

fn xunit_q5_k(u: u32) -> vec4<u32> {
    return xunit_k4(u);
}

fn wunit_q4_k(e0: u32, u: u32, k: u32) -> Unit {
    return wunit_k4(e0, u, 144u, 16u);
}

fn wunit_q5_k(e0: u32, u: u32, k: u32) -> Unit {
    return wunit_k4(e0, u, 176u, 48u);
}

fn wquad_q4_k(n: Unit, v: u32) -> vec4<f32> {
    return wquad_k4(n, v, false);
}

fn wquad_q5_k(n: Unit, v: u32) -> vec4<f32> {
    return wquad_k4(n, v, true);
}

// Q6_K: unit `i` of a block takes the four values at `l` = 4i % 32 of each quarter of half
// h = i / 8: one word of each of the half's two 32-byte runs of low bits (quarters 0 and 2, 1 and
// 3 by nibble), one word of its high bits (two bits a quarter) and a scale byte per quarter.
fn xunit_q6_k(u: u32) -> vec4<u32> {
    let i = u & 15u;
    return vec4<u32>((u >> 4u) * 256u + 128u * (i >> 3u) + 4u * (i & 7u)) + vec4<u32>(0u, 32u, 64u, 96u);
}

fn wunit_q6_k(e0: u32, u: u32, k: u32) -> Unit {
    let base = ((e0 >> 8u) + (u >> 4u)) * 210u;
    let i = u & 15u;
    let h = i >> 3u;
    let l = 4u * (i & 7u);
    let s = base + 192u + 8u * h + (l >> 4u);
    // The four quarters' scale bytes, 2 apart, sign-extended.
    let sc = vec4<f32>(bitcast<vec4<i32>>(vec4<u32>(wword(s), wword(s), wword(s + 4u), wword(s + 4u)) << vec4<u32>(24u, 8u, 24u, 8u)) >> vec4<u32>(24u));
    let at = base + 64u * h + l;
    return Unit(vec3<u32>(wword(at), wword(at + 32u), wword(base + 128u + 32u * h + l)), 0u, whalf(base + 208u) * sc, vec4<f32>(0.0));
}

fn wquad_q6_k(n: Unit, v: u32) -> vec4<f32> {
    let lo = (bytes4(n.w[v & 1u]) >> vec4<u32>(4u * (v >> 1u))) & vec4<u32>(15u);
    let hi = (bytes4(n.w.z) >> vec4<u32>(2u * v)) & vec4<u32>(3u);
    return n.d[v] * vec4<f32>(vec4<i32>(lo | (hi << vec4<u32>(4u))) - vec4<i32>(32));
}
