// Element-wise ops over flat f32 tensors, one thread per output element.

struct Params {
    n: u32,
    cols: u32,
    // glu's activation: act(g) = g * sigmoid(g * (a + b * g^2)) (SiLU: a = 1, b = 0).
    a: f32,
    b: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read> rows: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

fn index(t: u32, wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return (wid.x + wid.y * nwg.x) * 256u + t;
}

// out = act(a) * b
@compute @workgroup_size(256)
fn glu(
    @builtin(local_invocation_index) t: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let i = index(t, wid, nwg);
    if (i < p.n) {
        out[i] = gated(a[i], b[i], p.a, p.b);
    }
}

// out += a
@compute @workgroup_size(256)
fn add_assign(
    @builtin(local_invocation_index) t: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let i = index(t, wid, nwg);
    if (i < p.n) {
        out[i] += a[i];
    }
}

// out[r, :] = a[rows[r], :]
@compute @workgroup_size(256)
fn select_rows(
    @builtin(local_invocation_index) t: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let i = index(t, wid, nwg);
    if (i < p.n) {
        out[i] = a[rows[i / p.cols] * p.cols + i % p.cols];
    }
}
