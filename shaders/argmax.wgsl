// Index of the largest value of each row (the first on ties), one workgroup per row, so that
// greedy decoding reads back one u32 per row instead of the logits.

struct Params {
    rows: u32,
    cols: u32,
}

@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;

const WG: u32 = 64u;

var<workgroup> best_v: array<f32, WG>;
var<workgroup> best_i: array<u32, WG>;

@compute @workgroup_size(64)
fn argmax(wg: Workgroup, @builtin(local_invocation_index) tid: u32) {
    let t = tid;
    let row = workgroup_index(wg);
    if (row >= p.rows) {
        return;
    }
    // Each thread scans an increasing sequence of columns, so a strict > keeps its first maximum.
    // NaN never wins over a number, as in the CPU backend (`bv != bv` tests for NaN).
    var bv = x[row * p.cols + min(t, p.cols - 1u)];
    var bi = min(t, p.cols - 1u);
    for (var i = t + WG; i < p.cols; i += WG) {
        let v = x[row * p.cols + i];
        if (v > bv || bv != bv) {
            bv = v;
            bi = i;
        }
    }
    best_v[t] = bv;
    best_i[t] = bi;
    workgroupBarrier();
    if (t == 0u) {
        for (var q = 1u; q < WG; q++) {
            let v = best_v[q];
            if (v > bv || (v == bv && best_i[q] < bi) || (bv != bv && v == v)) {
                bv = best_v[q];
                bi = best_i[q];
            }
        }
        out[row] = bi;
    }
}
