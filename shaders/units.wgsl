// Units of the decode matmul, one family of functions per unit `U` (the kernel's UNIT: `4`, or a
// quantized type other than Q8_0). A thread takes a row's weights a unit at a time, UV_U vec4s:
// the unit's scale fields are decoded and its words of quants read once (`wunit_U(e0, u, k)`,
// for unit `u` of the row whose first element is `e0`, of length `k`), its vec4s then decoded
// from those (`wquad_U(unit, v)`: vec4 `v` of the unit), and `xunit_U(u)` gives the columns where
// its vec4s start. A K-quant unit is 16 values laid out as ggml packs them: in Q4_K two words hold
// four values of each of four sub-blocks, whose scales a four-value decode read for each four
// values. Neighbouring units lie in neighbouring words, so that neighbouring threads read
// neighbouring bytes.
//
// A unit decodes its values in F, the kernel's arithmetic type: f32, or f16 where the backend was
// opened with `shader-f16` arithmetic (`GpuOptions::shader_f16`), which halves the registers and
// doubles the throughput of the decode and of the products on a GPU. Its scales are products of
// an f16 and a small integer, exact in f32, and so are rounded once to F.

alias F = {{F}};

struct Unit {
    // A K-quant unit's words, read once: two of quants, and one of high bits where the type has
    // them. A 32-value block's word of quants and, in Q5_0/Q5_1, of fifth bits. A four-value
    // unit's first element and how many of its values lie in the row.
    w: vec3<u32>,
    // In Q5_K, the bit of the unit's first sub-block in its word of high bits.
    bit: u32,
    // Each vec4's scale and offset: its values are quant * d + m.
    d: vec4<F>,
    m: vec4<F>,
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
    return Unit(vec3<u32>(e0 + 4u * u, k - 4u * u, 0u), 0u, vec4<F>(), vec4<F>());
}

fn wquad_4(n: Unit, v: u32) -> vec4<F> {
    return vec4<F>(wload4_{{DTYPE}}(n.w.x, n.w.y));
}

// 4- and 5-bit 32-value-block types: unit `i` of a block (2 units) takes the two words at byte 8i
// of the block's quants, whose low nibbles are values 8i..8i+7 and high nibbles 8i+16..8i+23. So
// the block's scale fields (and Q5's word of fifth bits) are read once for sixteen values, and
// the two units of a block lie side by side in its bytes, as the lanes that take them do. Q8_0,
// with one value a byte, gains nothing from it and keeps four-value units (docs/measurements.md,
// "Where a decode's time goes, and vector loads of the activations").
const UV_q4_0: u32 = 4u;
const UV_q4_1: u32 = 4u;
const UV_q5_0: u32 = 4u;
const UV_q5_1: u32 = 4u;

// Vec4 `v` of a unit: the low (v < 2) or high nibbles of its word v % 2.
fn xunit_b32(u: u32) -> vec4<u32> {
    let c = (u >> 1u) * 32u + 8u * (u & 1u);
    return vec4<u32>(c, c + 4u, c + 16u, c + 20u);
}

// The byte offset of unit `u`'s block and its quants' byte offset in the block, for a row whose
// first element is `e0`.
fn b32_at(e0: u32, u: u32, block_bytes: u32) -> vec2<u32> {
    return vec2<u32>(((e0 >> 5u) + (u >> 1u)) * block_bytes, 8u * (u & 1u));
}

fn nibbles_b32(n: Unit, v: u32) -> vec4<u32> {
    return nibbles4(n.w[v & 1u], v >> 1u);
}

fn wunit_q4_0(e0: u32, u: u32, k: u32) -> Unit {
    let b = b32_at(e0, u, 18u);
    return Unit(vec3<u32>(wword2(b.x + 2u + b.y), 0u), 0u, vec4<F>(F(whalf(b.x))), vec4<F>());
}

fn wquad_q4_0(n: Unit, v: u32) -> vec4<F> {
    return (vec4<F>(nibbles_b32(n, v)) - 8.0) * n.d[v];
}

fn wunit_q4_1(e0: u32, u: u32, k: u32) -> Unit {
    let b = b32_at(e0, u, 20u);
    let dm = unpack2x16float(wq[b.x >> 2u]);
    let at = (b.x + 4u + b.y) >> 2u;
    return Unit(vec3<u32>(wq[at], wq[at + 1u], 0u), 0u, vec4<F>(F(dm.x)), vec4<F>(F(dm.y)));
}

fn wquad_q4_1(n: Unit, v: u32) -> vec4<F> {
    return vec4<F>(nibbles_b32(n, v)) * n.d[v] + n.m[v];
}

// Q5_0 and Q5_1 keep the unit's sixteen fifth bits at bits 0-7 and 16-23 of `w.z`.
fn wunit_q5_0(e0: u32, u: u32, k: u32) -> Unit {
    let b = b32_at(e0, u, 22u);
    let d = whalf(b.x);
    return Unit(vec3<u32>(wword2(b.x + 6u + b.y), wword(b.x + 2u) >> b.y), 0u, vec4<F>(F(d)), vec4<F>(F(-16.0 * d)));
}

fn wunit_q5_1(e0: u32, u: u32, k: u32) -> Unit {
    let b = b32_at(e0, u, 24u);
    let dm = unpack2x16float(wq[b.x >> 2u]);
    let at = (b.x + 8u + b.y) >> 2u;
    return Unit(vec3<u32>(wq[at], wq[at + 1u], wq[(b.x + 4u) >> 2u] >> b.y), 0u, vec4<F>(F(dm.x)), vec4<F>(F(dm.y)));
}

fn wquad_q5_0(n: Unit, v: u32) -> vec4<F> {
    return vec4<F>(nibbles_b32(n, v) + high_bits4(n.w.z, 4u * (v & 1u) + 16u * (v >> 1u))) * n.d[v] + n.m[v];
}

fn wquad_q5_1(n: Unit, v: u32) -> vec4<F> {
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
    return Unit(vec3<u32>(wq[at], wq[at + 16u], hi), 2u * c, vec4<F>(dm.x * sc), vec4<F>(-(dm.y * mn)));
}

fn wquad_k4(n: Unit, v: u32, has_high: bool) -> vec4<F> {
    var q = nibbles4(n.w[v >> 1u], v & 1u);
    if (has_high) {
        let bit = n.bit + (v & 1u) + 4u * (v >> 1u);
        q += ((bytes4(n.w.z) >> vec4<u32>(bit)) & vec4<u32>(1u)) << vec4<u32>(4u);
    }
    return n.d[v] * vec4<F>(q) + n.m[v];
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

fn wquad_q4_k(n: Unit, v: u32) -> vec4<F> {
    return wquad_k4(n, v, false);
}

fn wquad_q5_k(n: Unit, v: u32) -> vec4<F> {
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
    return Unit(vec3<u32>(wword(at), wword(at + 32u), wword(base + 128u + 32u * h + l)), 0u, vec4<F>(whalf(base + 208u) * sc), vec4<F>(0.0));
}

fn wquad_q6_k(n: Unit, v: u32) -> vec4<F> {
    let lo = (bytes4(n.w[v & 1u]) >> vec4<u32>(4u * (v >> 1u))) & vec4<u32>(15u);
    let hi = (bytes4(n.w.z) >> vec4<u32>(2u * v)) & vec4<u32>(3u);
    return n.d[v] * vec4<F>(vec4<i32>(lo | (hi << vec4<u32>(4u))) - vec4<i32>(32));
}
