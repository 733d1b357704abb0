// Embedding lookup: out[i, :] = scale * row ids[i] of the table, decoded from its storage type. A table
// split into several parts is gathered by one dispatch per part; each fills the rows it holds.

struct Params {
    m: u32,
    k: u32,
    row0: u32,
    rows: u32,
    // What every value is multiplied by (Gemma scales its embeddings by sqrt(d_model)).
    scale: f32,
    // The part's first row in `wq`.
    at: u32,
}

@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read> wq: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(64)
fn embed(wg: Workgroup, @builtin(local_invocation_index) tid: u32) {
    let groups = (p.k + 3u) / 4u;
    let gid = global_index(wg, tid, 64u);
    let i = gid / groups;
    let c = (gid % groups) * 4u;
    if (i >= p.m) {
        return;
    }
    let id = ids[i];
    if (id < p.row0 || id >= p.row0 + p.rows) {
        return;
    }
    let n = min(4u, p.k - c);
    let v = wload4_{{DTYPE}}((id - p.row0 + p.at) * p.k + c, n);
    for (var j = 0u; j < n; j++) {
        out[i * p.k + c + j] = v[j] * p.scale;
    }
}
