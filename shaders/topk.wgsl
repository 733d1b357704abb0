// The k largest values of each row, exactly, without reading the row back. One workgroup per row
// finds the k-th largest entry by radix selection: a histogram of 8 bits at a time over the
// entries that share the bits found so far, first of the value's order key and then, only where
// that k-th value ties with more entries than are left to take, of the column (the lower column
// ranking higher). The k entries from that threshold up are gathered, sorted (bitonic, in
// workgroup memory) and written. Each pass reads the row once, where sorting it in chunks did
// some 30 compare-and-swaps per entry. Keys order like the values (NaN lowest, -0 as +0); ties go
// to the lower column, as on the CPU. Last, each row's log-sum-exp at the temperature and its
// value at one asked-for column.

struct Params {
    rows: u32,
    // Entries per row of the input.
    n: u32,
    k: u32,
    // u32 words per row of the output.
    out_stride: u32,
    temperature: f32,
}

@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read_write> pout: array<u32>;
@group(0) @binding(4) var<storage, read> cols: array<u32>;

const WG: u32 = 256u;
// MAX_TOP_K on the host.
const MAX_K: u32 = 512u;
const NONE: u32 = 0xffffffffu;

var<workgroup> hist: array<atomic<u32>, 256>;
var<workgroup> kept: array<vec2<u32>, MAX_K>;
var<workgroup> filled: atomic<u32>;
// The selection so far, written by thread 0 between passes: the bits of the threshold's key and
// column rank found, which bits those are, how many entries are still to take from those that
// share them, and how many share them.
var<workgroup> key_bits: u32;
var<workgroup> key_mask: u32;
var<workgroup> rank_bits: u32;
var<workgroup> rank_mask: u32;
var<workgroup> remaining: u32;
var<workgroup> sharing: u32;

// One radix pass: the 8 bits at `shift` of the key (or, `on_rank`, of the column's rank ~c)
// among the row's entries that share the bits found so far; thread 0 then takes the highest bin
// that holds the threshold.
fn radix_pass(t: u32, row: u32, shift: u32, on_rank: bool) {
    for (var i = t; i < 256u; i += WG) {
        atomicStore(&hist[i], 0u);
    }
    workgroupBarrier();
    let kb = key_bits;
    let km = key_mask;
    let rb = rank_bits;
    let rm = rank_mask;
    for (var c = t; c < p.n; c += WG) {
        let key = order_key(x[row * p.n + c]);
        if ((key & km) == kb && (~c & rm) == rb) {
            let digit = select(key, ~c, on_rank);
            atomicAdd(&hist[(digit >> shift) & 255u], 1u);
        }
    }
    workgroupBarrier();
    if (t == 0u) {
        var above = 0u;
        var b = 255u;
        // The bins hold at least `remaining` entries in all; the guard only keeps the loop finite.
        loop {
            let h = atomicLoad(&hist[b]);
            if (above + h >= remaining || b == 0u) {
                break;
            }
            above += h;
            b -= 1u;
        }
        if (on_rank) {
            rank_bits |= b << shift;
            rank_mask |= 255u << shift;
        } else {
            key_bits |= b << shift;
            key_mask |= 255u << shift;
        }
        remaining -= above;
        sharing = atomicLoad(&hist[b]);
    }
    workgroupBarrier();
}

// One workgroup per row.
@compute @workgroup_size(256)
fn select_top(wg: Workgroup, @builtin(local_invocation_index) tid: u32) {
    let t = tid;
    let row = workgroup_index(wg);
    if (row >= p.rows) {
        return;
    }
    if (t == 0u) {
        key_bits = 0u;
        key_mask = 0u;
        rank_bits = 0u;
        rank_mask = 0u;
        remaining = p.k;
        atomicStore(&filled, 0u);
    }
    workgroupBarrier();
    for (var level = 0u; level < 4u; level++) {
        radix_pass(t, row, 24u - 8u * level, false);
    }
    // More entries hold the k-th value than are left to take: the lower columns among them.
    if (workgroupUniformLoad(&sharing) > workgroupUniformLoad(&remaining)) {
        for (var level = 0u; level < 4u; level++) {
            radix_pass(t, row, 24u - 8u * level, true);
        }
    }
    // Without rank passes the mask is 0 and every entry of the k-th value is taken.
    let kb = key_bits;
    let rb = rank_bits;
    let rm = rank_mask;
    for (var c = t; c < p.n; c += WG) {
        let key = order_key(x[row * p.n + c]);
        if (key > kb || (key == kb && (~c & rm) >= rb)) {
            let slot = atomicAdd(&filled, 1u);
            if (slot < MAX_K) {
                kept[slot] = vec2<u32>(key, c);
            }
        }
    }
    workgroupBarrier();
    // The sort's width: the next power of two from k, padded with entries that sort last.
    var width = 2u;
    while (width < p.k) {
        width <<= 1u;
    }
    for (var i = p.k + t; i < width; i += WG) {
        kept[i] = vec2<u32>(0u, NONE);
    }
    workgroupBarrier();
    for (var size = 2u; size <= width; size <<= 1u) {
        for (var stride = size >> 1u; stride > 0u; stride >>= 1u) {
            for (var pi = t; pi < width / 2u; pi += WG) {
                let lo = 2u * pi - (pi & (stride - 1u));
                let hi = lo + stride;
                let a = kept[lo];
                let b = kept[hi];
                // Blocks alternate direction until the last merge, which orders them all.
                let forward = (lo & size) == 0u;
                if (select(before(a, b), before(b, a), forward)) {
                    kept[lo] = b;
                    kept[hi] = a;
                }
            }
            workgroupBarrier();
        }
    }
    let base = row * p.out_stride;
    for (var i = t; i < p.k; i += WG) {
        pout[base + 2u * i] = kept[i].x;
        pout[base + 2u * i + 1u] = kept[i].y;
    }
    // The row's log-sum-exp at the temperature, about its largest value: the first kept entry.
    // Below any logit, but finite: Tint's constant evaluation rejects -inf (even from a bitcast)
    // and f32's limit once the WGSL has been written back out through f64.
    var top = -3.0e38;
    if (kept[0].x != 0u) {
        top = max(top, key_value(kept[0].x) / p.temperature);
    }
    var sum = 0.0;
    for (var c = t; c < p.n; c += WG) {
        let v = x[row * p.n + c];
        if (!is_nan(v)) {
            sum += exp(v / p.temperature - top);
        }
    }
    let total = workgroup_sum(t, sum);
    if (t == 0u) {
        pout[base + 2u * p.k] = bitcast<u32>(top + log(total));
        let c = cols[row];
        // -inf's bits for a column out of range.
        pout[base + 2u * p.k + 1u] = select(0xff800000u, bitcast<u32>(x[row * p.n + min(c, p.n - 1u)]), c < p.n);
    }
}
