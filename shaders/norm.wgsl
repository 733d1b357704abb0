// RMSNorm, one workgroup per row: out = x * (1 / sqrt(mean(x^2) + eps) * w).

struct Params {
    rows: u32,
    cols: u32,
    eps: f32,
}

@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

const WG: u32 = 64u;

var<workgroup> partial: array<f32, WG>;

@compute @workgroup_size(64)
fn rms_norm(wg: Workgroup, @builtin(local_invocation_index) tid: u32) {
    let t = tid;
    let row = workgroup_index(wg);
    if (row >= p.rows) {
        return;
    }
    let base = row * p.cols;
    var s = 0.0;
    for (var i = t; i < p.cols; i += WG) {
        let v = x[base + i];
        s += v * v;
    }
    partial[t] = s;
    workgroupBarrier();
    // Every thread sums the 64 partials itself: one barrier instead of a reduction tree.
    var total = 0.0;
    for (var q = 0u; q < WG; q++) {
        total += partial[q];
    }
    let scale = 1.0 / sqrt(total / f32(p.cols) + p.eps);
    for (var i = t; i < p.cols; i += WG) {
        out[base + i] = x[base + i] * (scale * w[i]);
    }
}
