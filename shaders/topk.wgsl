// The k largest values of each row, exactly, without reading the row back: each workgroup sorts
// a chunk of CHUNK (key, column) pairs in workgroup memory (a bitonic sort) and keeps its first k;
// passes over the chunks' survivors repeat until one chunk is left. Keys order like the values
// (NaN lowest, -0 as +0); ties go to the lower column, as on the CPU. row_stats then writes each
// row's log-sum-exp at the temperature and its value at one asked-for column.

struct Params {
    rows: u32,
    // Entries per row of the input.
    n: u32,
    k: u32,
    // Chunks per row in this pass.
    chunks: u32,
    // u32 words per row of the output.
    out_stride: u32,
    temperature: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> pin: array<vec2<u32>>;
@group(0) @binding(3) var<storage, read_write> pout: array<u32>;
@group(0) @binding(4) var<storage, read> cols: array<u32>;

const CHUNK: u32 = 1024u;
const WG: u32 = 256u;
const NONE: u32 = 0xffffffffu;

var<workgroup> keys: array<vec2<u32>, CHUNK>;
var<workgroup> red: array<f32, WG>;

// NaN tested on the bits: WGSL lets a compiler assume no value is NaN.
fn is_nan(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u;
}

fn order_key(v: f32) -> u32 {
    if (is_nan(v)) {
        return 0u;
    }
    let b = bitcast<u32>(v + 0.0);
    if ((b >> 31u) == 1u) {
        return ~b;
    }
    return b | 0x80000000u;
}

// Whether a comes before b: the larger key, then the lower column.
fn before(a: vec2<u32>, b: vec2<u32>) -> bool {
    return a.x > b.x || (a.x == b.x && a.y < b.y);
}

// Sort the chunk in `keys` and write its first k pairs.
fn keep_top(t: u32, row: u32, chunk: u32) {
    workgroupBarrier();
    for (var size = 2u; size <= CHUNK; size <<= 1u) {
        for (var stride = size >> 1u; stride > 0u; stride >>= 1u) {
            for (var pi = t; pi < CHUNK / 2u; pi += WG) {
                let lo = 2u * pi - (pi & (stride - 1u));
                let hi = lo + stride;
                let a = keys[lo];
                let b = keys[hi];
                // Blocks alternate direction until the last merge, which orders the whole chunk.
                let forward = (lo & size) == 0u;
                if (select(before(a, b), before(b, a), forward)) {
                    keys[lo] = b;
                    keys[hi] = a;
                }
            }
            workgroupBarrier();
        }
    }
    let base = row * p.out_stride + chunk * p.k * 2u;
    for (var i = t; i < p.k; i += WG) {
        pout[base + 2u * i] = keys[i].x;
        pout[base + 2u * i + 1u] = keys[i].y;
    }
}

// One workgroup per (row, chunk) of the input: the values in the first pass ({{LOAD}} reads x),
// the survivors of the pass before in later ones ({{LOAD}} reads pin).
@compute @workgroup_size(256)
fn chunk_top(
    @builtin(local_invocation_index) t: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let g = wid.x + wid.y * nwg.x;
    let row = g / p.chunks;
    if (row >= p.rows) {
        return;
    }
    let chunk = g % p.chunks;
    for (var i = t; i < CHUNK; i += WG) {
        let c = chunk * CHUNK + i;
        let at = row * p.n + min(c, p.n - 1u);
        keys[i] = select(vec2<u32>(0u, NONE), {{LOAD}}, c < p.n);
    }
    keep_top(t, row, chunk);
}

// One workgroup per row: ln sum exp(x / temperature) and x at cols[row], after the row's k pairs.
@compute @workgroup_size(256)
fn row_stats(
    @builtin(local_invocation_index) t: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= p.rows) {
        return;
    }
    // Below any logit, but finite: Tint's constant evaluation rejects -inf (even from a bitcast)
    // and f32's limit once the WGSL has been written back out through f64.
    var m = -3.0e38;
    for (var i = t; i < p.n; i += WG) {
        let v = x[row * p.n + i];
        if (!is_nan(v)) {
            m = max(m, v / p.temperature);
        }
    }
    red[t] = m;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (t < s) {
            red[t] = max(red[t], red[t + s]);
        }
        workgroupBarrier();
    }
    let top = red[0];
    workgroupBarrier();
    var sum = 0.0;
    for (var i = t; i < p.n; i += WG) {
        let v = x[row * p.n + i];
        if (!is_nan(v)) {
            sum += exp(v / p.temperature - top);
        }
    }
    red[t] = sum;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (t < s) {
            red[t] += red[t + s];
        }
        workgroupBarrier();
    }
    if (t == 0u) {
        let base = row * p.out_stride + 2u * p.k;
        pout[base] = bitcast<u32>(top + log(red[0]));
        let c = cols[row];
        // -inf's bits for a column out of range.
        pout[base + 1u] = select(0xff800000u, bitcast<u32>(x[row * p.n + min(c, p.n - 1u)]), c < p.n);
    }
}
