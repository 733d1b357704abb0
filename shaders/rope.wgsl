// RoPE in place: the first 2 * half values of each head_dim-wide head rotate in rotate-half pairs
// (i, i + half); the rest of the head passes through. The cos/sin table, [row][i] = (cos, sin) of
// row's angle for pair i, is computed on the host once per batch, exactly as the CPU backend
// computes it: GPU sin/cos lose accuracy at the large angles of long contexts.

struct Params {
    rows: u32,
    cols: u32,
    half: u32,
    head_dim: u32,
    // rope_pair: the width of `y`, rotated at the same positions after `x`.
    cols_y: u32,
}

@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> table: array<vec2<f32>>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

// Thread `gid`'s pair of a tensor `cols` wide: the index of its first value (-1 past the
// tensor) and of its entry in the table.
fn pair_at(gid: u32, cols: u32) -> vec2<i32> {
    let pairs = (cols / p.head_dim) * p.half;
    let row = gid / pairs;
    if (row >= p.rows) {
        return vec2<i32>(-1);
    }
    let j = gid % pairs;
    let i = j % p.half;
    return vec2<i32>(i32(row * cols + (j / p.half) * p.head_dim + i), i32(row * p.half + i));
}

// The pair (a, b) rotated by the table's (cos, sin).
fn rotated(a: f32, b: f32, cs: vec2<f32>) -> vec2<f32> {
    return vec2<f32>(a * cs.x - b * cs.y, b * cs.x + a * cs.y);
}

// One thread per rotated pair: half pairs per head.
@compute @workgroup_size(64)
fn rope(wg: Workgroup, @builtin(local_invocation_index) tid: u32) {
    let at = pair_at(global_index(wg, tid, 64u), p.cols);
    if (at.x >= 0) {
        let a = u32(at.x);
        let r = rotated(x[a], x[a + p.half], table[at.y]);
        x[a] = r.x;
        x[a + p.half] = r.y;
    }
}

// `x` (Q) and then `y` (K) in one pass. WGSL passes no storage buffer to a function, so each
// tensor has its own few lines of loads and stores.
@compute @workgroup_size(64)
fn rope_pair(wg: Workgroup, @builtin(local_invocation_index) tid: u32) {
    let gid = global_index(wg, tid, 64u);
    let x_pairs = p.rows * (p.cols / p.head_dim) * p.half;
    if (gid < x_pairs) {
        let at = pair_at(gid, p.cols);
        let a = u32(at.x);
        let r = rotated(x[a], x[a + p.half], table[at.y]);
        x[a] = r.x;
        x[a + p.half] = r.y;
        return;
    }
    let at = pair_at(gid - x_pairs, p.cols_y);
    if (at.x >= 0) {
        let a = u32(at.x);
        let r = rotated(y[a], y[a + p.half], table[at.y]);
        y[a] = r.x;
        y[a + p.half] = r.y;
    }
}
