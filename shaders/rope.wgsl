// RoPE in place: the first 2 * half values of each head_dim-wide head rotate in rotate-half pairs
// (i, i + half); the rest of the head passes through. The cos/sin table, [row][i] = (cos, sin) of
// row's angle for pair i, is computed on the host once per batch, exactly as the CPU backend
// computes it: GPU sin/cos lose accuracy at the large angles of long contexts.

struct Params {
    rows: u32,
    cols: u32,
    half: u32,
    head_dim: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> table: array<vec2<f32>>;

@compute @workgroup_size(64)
fn rope(
    @builtin(local_invocation_index) t: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let gid = (wid.x + wid.y * nwg.x) * 64u + t;
    // One thread per rotated pair: half pairs per head.
    let pairs = (p.cols / p.head_dim) * p.half;
    let row = gid / pairs;
    if (row >= p.rows) {
        return;
    }
    let j = gid % pairs;
    let i = j % p.half;
    let a_at = row * p.cols + (j / p.half) * p.head_dim + i;
    let cs = table[row * p.half + i];
    let a = x[a_at];
    let b = x[a_at + p.half];
    x[a_at] = a * cs.x - b * cs.y;
    x[a_at + p.half] = b * cs.x + a * cs.y;
}
