// Attention over the KV cache. The batch metadata `batch_meta` is, for m query rows:
//   [0, m)                    the cache slot each row writes its K and V to
//   [m, 2m)                   prefix[r]: row r attends every slot below it ...
//   [2m, 3m)                  start[r]: ... from this one on (0, or a sliding window's first)
//   [3m, 3m + m * stride)     extra[r * stride ..]: further slots row r attends (NO_SLOT = padding)
// uploaded once per forward and shared by all layers.

struct Params {
    m: u32,
    n_heads: u32,
    // Query heads per KV head.
    group: u32,
    head_dim: u32,
    kv_dim: u32,
    stride: u32,
    scale: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
@group(0) @binding(4) var<storage, read> batch_meta: array<u32>;
@group(0) @binding(5) var<storage, read_write> kc: array<f32>;
@group(0) @binding(6) var<storage, read_write> vc: array<f32>;
@group(0) @binding(7) var<storage, read_write> out: array<f32>;

const NO_SLOT: u32 = 0xffffffffu;
const WG: u32 = 64u;
// head_dim <= WG * MAX_DIMS.
const MAX_DIMS: u32 = 4u;
// Below every score, but finite, so that exp(NEG - NEG) is 1 rather than NaN.
const NEG: f32 = -3.0e38;

// K and V of each batch row into the row's cache slot; one thread per value.
@compute @workgroup_size(64)
fn kv_write(
    @builtin(local_invocation_index) t: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let i = (wid.x + wid.y * nwg.x) * 64u + t;
    if (i >= p.m * p.kv_dim) {
        return;
    }
    let r = i / p.kv_dim;
    let at = batch_meta[r] * p.kv_dim + i % p.kv_dim;
    kc[at] = k[i];
    vc[at] = v[i];
}

var<workgroup> qh: array<f32, WG * MAX_DIMS>;
var<workgroup> scores: array<f32, WG>;
var<workgroup> slots: array<u32, WG>;
var<workgroup> attended: u32;

// One workgroup per (row, head). The attended slots are visited WG at a time: each thread scores
// one slot, then every thread folds the WG scores into a running softmax (max, sum) and into the
// output dimensions it owns. Two barriers per WG slots.
@compute @workgroup_size(64)
fn attend(
    @builtin(local_invocation_index) t: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let g = wid.x + wid.y * nwg.x;
    let r = g / p.n_heads;
    if (r >= p.m) {
        return;
    }
    let h = g % p.n_heads;
    let hd = p.head_dim;
    let kv_off = (h / p.group) * hd;
    let q_off = (r * p.n_heads + h) * hd;
    let prefix = batch_meta[p.m + r];
    let start = batch_meta[2u * p.m + r];
    let from_prefix = prefix - start;
    for (var d = t; d < hd; d += WG) {
        qh[d] = q[q_off + d];
    }
    if (t == 0u) {
        attended = from_prefix + p.stride;
    }
    let n = workgroupUniformLoad(&attended);

    var run_max = NEG;
    var sum = 0.0;
    var acc: array<f32, MAX_DIMS>;
    for (var c0 = 0u; c0 < n; c0 += WG) {
        let j = c0 + t;
        var slot = NO_SLOT;
        var s = NEG;
        if (j < from_prefix) {
            slot = start + j;
        } else if (j < n) {
            slot = batch_meta[3u * p.m + r * p.stride + j - from_prefix];
        }
        if (slot != NO_SLOT) {
            let kb = slot * p.kv_dim + kv_off;
            var dot = 0.0;
            for (var d = 0u; d < hd; d++) {
                dot += qh[d] * kc[kb + d];
            }
            s = dot * p.scale;
        }
        scores[t] = s;
        slots[t] = slot;
        workgroupBarrier();
        var new_max = run_max;
        for (var i = 0u; i < WG; i++) {
            if (slots[i] != NO_SLOT) {
                new_max = max(new_max, scores[i]);
            }
        }
        let alpha = exp(run_max - new_max);
        sum *= alpha;
        for (var dd = 0u; dd < MAX_DIMS; dd++) {
            acc[dd] *= alpha;
        }
        run_max = new_max;
        for (var i = 0u; i < WG; i++) {
            let si = slots[i];
            if (si == NO_SLOT) {
                continue;
            }
            let pr = exp(scores[i] - run_max);
            sum += pr;
            let vb = si * p.kv_dim + kv_off;
            for (var dd = 0u; dd < MAX_DIMS; dd++) {
                let d = t + dd * WG;
                if (d < hd) {
                    acc[dd] += pr * vc[vb + d];
                }
            }
        }
        workgroupBarrier();
    }
    for (var dd = 0u; dd < MAX_DIMS; dd++) {
        let d = t + dd * WG;
        if (d < hd) {
            out[q_off + d] = select(0.0, acc[dd] / sum, sum > 0.0);
        }
    }
}
