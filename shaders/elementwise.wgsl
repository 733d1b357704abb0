// Element-wise ops over flat f32 tensors, one thread per output element.

struct Params {
    n: u32,
    cols: u32,
    // glu's activation: act(g) = g * sigmoid(g * (a + b * g^2)) (SiLU: a = 1, b = 0).
    a: f32,
    b: f32,
}

@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read> rows: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

// out = act(a) * b
@compute @workgroup_size(256)
fn glu(wg: Workgroup, @builtin(local_invocation_index) tid: u32) {
    let i = global_index(wg, tid, 256u);
    if (i < p.n) {
        out[i] = gated(a[i], b[i], p.a, p.b);
    }
}

// out += a
@compute @workgroup_size(256)
fn add_assign(wg: Workgroup, @builtin(local_invocation_index) tid: u32) {
    let i = global_index(wg, tid, 256u);
    if (i < p.n) {
        out[i] += a[i];
    }
}

// out[r, :] = a[rows[r], :]
@compute @workgroup_size(256)
fn select_rows(wg: Workgroup, @builtin(local_invocation_index) tid: u32) {
    let i = global_index(wg, tid, 256u);
    if (i < p.n) {
        out[i] = a[rows[i / p.cols] * p.cols + i % p.cols];
    }
}

// -inf's bits: Tint refuses a constant that is not finite, even one made by a bitcast.
var<private> NEG_INF_BITS: u32 = 0xff800000u;

// out[r, c] = -inf where bit c of row r's bitset in `rows` (ceil(cols / 32) words a row) is clear
@compute @workgroup_size(256)
fn mask(wg: Workgroup, @builtin(local_invocation_index) tid: u32) {
    let i = global_index(wg, tid, 256u);
    if (i < p.n) {
        let r = i / p.cols;
        let c = i % p.cols;
        let word = rows[r * ((p.cols + 31u) / 32u) + c / 32u];
        if (((word >> (c % 32u)) & 1u) == 0u) {
            out[i] = bitcast<f32>(NEG_INF_BITS);
        }
    }
}
