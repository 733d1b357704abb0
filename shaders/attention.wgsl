// Attention over the KV cache. The batch metadata `batch_meta` is, for m query rows:
//   [0, m)                    the cache slot each row writes its K and V to
//   [m, 2m)                   prefix[r]: row r attends every slot below it ...
//   [2m, 3m)                  start[r]: ... from this one on (0, or a sliding window's first)
//   [3m, 3m + m * stride)     extra[r * stride ..]: further slots row r attends (NO_SLOT = padding)
// uploaded once per forward and shared by all layers.
//
// A small batch's walk over the cache may be split into parts of `split` entries, each its own
// workgroup, so that a decode at a long context keeps more than a few of a GPU's cores busy: each
// part leaves its running maximum, sum and unnormalized output in `out`, and `combine` merges the
// parts. A block's walk starts at a multiple of the part length (of WG when it is not split), so
// chunks and parts begin at the same cache slots whatever the batch and whatever a sliding window
// cuts off; since an entry a row does not attend adds exactly zero and a part with none of its
// entries merges with weight zero, a verification's rows get the bits of the decodes they stand
// for. (A tree step's extra slots follow its block's prefix span; no decode stands for them.)

struct Params {
    m: u32,
    n_heads: u32,
    // Query heads per KV head.
    group: u32,
    head_dim: u32,
    kv_dim: u32,
    // Cache values per slot: kv_dim, rounded up to whole 16-byte blocks.
    kv_stride: u32,
    stride: u32,
    scale: f32,
    // Entries of the walk per part (a multiple of WG; unsplit, past any walk), and the parts each
    // block's walk is cut into.
    split: u32,
    splits: u32,
}

@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
@group(0) @binding(4) var<storage, read> batch_meta: array<u32>;
// The output, or with several parts, each part's [output (head_dim), maximum, sum] per query.
@group(0) @binding(7) var<storage, read_write> out: array<f32>;
@group(0) @binding(8) var<storage, read> parts: array<f32>;

const NO_SLOT: u32 = 0xffffffffu;
const WG: u32 = 64u;
// Output dimensions per thread: head_dim <= WG * MAX_DIMS.
const MAX_DIMS: u32 = {{DIMS}}u;
// Below every score, but finite, so that exp(NEG - NEG) is 1 rather than NaN.
const NEG: f32 = -3.0e38;

// The cache's bindings (5 and 6) and how its values are stored: kv_f32.wgsl or kv_f16.wgsl.
{{KV}}

// K and V of each batch row into the row's cache slot; one thread per cache block.
@compute @workgroup_size(64)
fn kv_write(wg: Workgroup, @builtin(local_invocation_index) tid: u32) {
    let i = global_index(wg, tid, 64u);
    let blocks = p.kv_stride / KV_BLOCK;
    if (i >= p.m * blocks) {
        return;
    }
    let r = i / blocks;
    let e = (i % blocks) * KV_BLOCK;
    kv_put(batch_meta[r] * blocks + i % blocks, r * p.kv_dim + e, min(KV_BLOCK, p.kv_dim - e));
}

// Queries one workgroup attends for: rows x query heads of one KV head.
const QMAX: u32 = 8u;

var<workgroup> qh: array<f32, QMAX * WG * MAX_DIMS>;
var<workgroup> scores: array<f32, QMAX * WG>;
var<workgroup> slots: array<u32, WG>;
var<workgroup> span: vec2<u32>;
var<workgroup> skip: u32;

// The rows of a workgroup's queries: query i of block b is row (b * QMAX + i) / group.
fn query_row(b: u32, i: u32) -> u32 {
    return (b * QMAX + i) / p.group;
}

// Whether query row r attends the chunk entry j of the block's walk: first the union of the
// rows' prefix ranges [start, prefix), then each row's extra slots, which only that row attends.
fn attends(r: u32, j: u32, lo: u32, r0: u32) -> bool {
    let prefix = batch_meta[p.m + r];
    let start = batch_meta[2u * p.m + r];
    let slot = slots[j % WG];
    if (slot == NO_SLOT) {
        return false;
    }
    let n_prefix = span.y - lo;
    if (j < n_prefix) {
        return slot >= start && slot < prefix;
    }
    return r == r0 + (j - n_prefix) / max(p.stride, 1u);
}

// Whether any row r0..=r1 attends a prefix slot of the chunk of the walk from entry c0: a block's
// rows may belong to sequences in distant regions of the cache (`model::shared`), and the
// stretch between them, which none attends, is skipped rather than walked. A skipped chunk is
// one that would have added exactly nothing.
fn chunk_attended(c0: u32, lo: u32, hi: u32, r0: u32, r1: u32) -> bool {
    if (lo + c0 + WG > hi) {
        return true;
    }
    for (var r = r0; r <= r1; r++) {
        if (batch_meta[2u * p.m + r] < lo + c0 + WG && batch_meta[p.m + r] > lo + c0) {
            return true;
        }
    }
    return false;
}

// One workgroup per (KV head, block of QMAX queries: consecutive rows x the head's query heads, part),
// so that every K and V row a block attends is read once for all its queries. The slots are
// visited WG at a time: each thread scores one slot against every query and, once every thread
// has moved the queries' running maxima, turns its scores into weights; then every thread folds
// the WG weights of each query into its running sum and into the output dimensions it owns.
// Four barriers per WG slots.
@compute @workgroup_size(64)
fn attend(wg: Workgroup, @builtin(local_invocation_index) tid: u32) {
    let t = tid;
    let blocks = (p.m * p.group + QMAX - 1u) / QMAX;
    let g = workgroup_index(wg) / p.splits;
    let part = workgroup_index(wg) % p.splits;
    let kvh = g / blocks;
    if (kvh >= p.n_heads / p.group) {
        return;
    }
    let b = g % blocks;
    let hd = p.head_dim;
    let kv_off = kvh * hd;
    let nq = min(QMAX, p.m * p.group - b * QMAX);
    let r0 = query_row(b, 0u);
    let r1 = query_row(b, nq - 1u);
    for (var i = 0u; i < nq; i++) {
        let q_off = (query_row(b, i) * p.n_heads + kvh * p.group + (b * QMAX + i) % p.group) * hd;
        for (var d = t; d < hd; d += WG) {
            qh[i * hd + d] = q[q_off + d];
        }
    }
    if (t == 0u) {
        var lo = 0xffffffffu;
        var hi = 0u;
        for (var r = r0; r <= r1; r++) {
            lo = min(lo, batch_meta[2u * p.m + r]);
            hi = max(hi, batch_meta[p.m + r]);
        }
        let low = min(lo, hi);
        span = vec2<u32>(low - low % select(WG, p.split, p.splits > 1u), hi);
    }
    let bounds = workgroupUniformLoad(&span);
    let lo = bounds.x;
    let n = (bounds.y - lo) + (r1 - r0 + 1u) * p.stride;
    let first = part * p.split;
    let to = min(n, first + p.split);

    var run_max: array<f32, QMAX>;
    var sum: array<f32, QMAX>;
    var acc: array<array<f32, MAX_DIMS>, QMAX>;
    for (var i = 0u; i < QMAX; i++) {
        run_max[i] = NEG;
    }
    for (var c0 = first; c0 < to; c0 += WG) {
        if (t == 0u) {
            skip = select(0u, 1u, !chunk_attended(c0, lo, bounds.y, r0, r1));
        }
        if (workgroupUniformLoad(&skip) == 1u) {
            continue;
        }
        let j = c0 + t;
        var slot = NO_SLOT;
        if (j < bounds.y - lo) {
            slot = lo + j;
        } else if (j < to) {
            let e = j - (bounds.y - lo);
            slot = batch_meta[3u * p.m + r0 * p.stride + e];
        }
        slots[t] = slot;
        workgroupBarrier();
        var dots: array<f32, QMAX>;
        if (slot != NO_SLOT) {
            let kb = slot * p.kv_stride + kv_off;
            // Either way each dot adds its products in the order of d.
            if (hd % KV_BLOCK == 0u) {
                // The head starts a block too: the slot's stride and the head's offset are
                // whole blocks.
                for (var d = 0u; d < hd; d += KV_BLOCK) {
                    var kv = k_block((kb + d) / KV_BLOCK);
                    for (var e = 0u; e < KV_BLOCK; e++) {
                        for (var i = 0u; i < nq; i++) {
                            dots[i] += qh[i * hd + d + e] * kv[e];
                        }
                    }
                }
            } else {
                for (var d = 0u; d < hd; d++) {
                    let kd = k_at(kb + d);
                    for (var i = 0u; i < nq; i++) {
                        dots[i] += qh[i * hd + d] * kd;
                    }
                }
            }
        }
        for (var i = 0u; i < nq; i++) {
            scores[i * WG + t] = select(NEG, dots[i] * p.scale, j < to && attends(query_row(b, i), j, lo, r0));
        }
        workgroupBarrier();
        for (var i = 0u; i < nq; i++) {
            var new_max = run_max[i];
            for (var u = 0u; u < WG; u++) {
                new_max = max(new_max, scores[i * WG + u]);
            }
            let alpha = exp(run_max[i] - new_max);
            sum[i] *= alpha;
            for (var dd = 0u; dd < MAX_DIMS; dd++) {
                acc[i][dd] *= alpha;
            }
            run_max[i] = new_max;
        }
        // Each thread turns its own slot's scores into weights, once for all threads.
        workgroupBarrier();
        for (var i = 0u; i < nq; i++) {
            let score = scores[i * WG + t];
            scores[i * WG + t] = select(0.0, exp(score - run_max[i]), score != NEG);
        }
        workgroupBarrier();
        for (var u = 0u; u < WG; u++) {
            let su = slots[u];
            if (su == NO_SLOT || c0 + u >= to) {
                continue;
            }
            let vb = su * p.kv_stride + kv_off;
            var vd: array<f32, MAX_DIMS>;
            for (var dd = 0u; dd < MAX_DIMS; dd++) {
                let d = t + dd * WG;
                if (d < hd) {
                    vd[dd] = v_at(vb + d);
                }
            }
            for (var i = 0u; i < nq; i++) {
                // A slot a query does not attend weighs 0, and adds nothing even where it holds
                // no finite value (a slot of another sequence's region not yet written).
                let pr = scores[i * WG + u];
                sum[i] += pr;
                for (var dd = 0u; dd < MAX_DIMS; dd++) {
                    acc[i][dd] += select(0.0, pr * vd[dd], pr != 0.0);
                }
            }
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < nq; i++) {
        let query = query_row(b, i) * p.n_heads + kvh * p.group + (b * QMAX + i) % p.group;
        let at = (query * p.splits + part) * (hd + 2u);
        for (var dd = 0u; dd < MAX_DIMS; dd++) {
            let d = t + dd * WG;
            if (d < hd) {
                if (p.splits == 1u) {
                    out[query * hd + d] = select(0.0, acc[i][dd] / sum[i], sum[i] > 0.0);
                } else {
                    out[at + d] = acc[i][dd];
                }
            }
        }
        if (p.splits > 1u && t == 0u) {
            out[at + hd] = run_max[i];
            out[at + hd + 1u] = sum[i];
        }
    }
}

// Merges the parts of a split walk; one thread per output value. A lone part's weight is
// exp(0) = 1, so a row whose slots all fall in one part gets the bits of an unsplit walk.
@compute @workgroup_size(64)
fn combine(wg: Workgroup, @builtin(local_invocation_index) tid: u32) {
    let i = global_index(wg, tid, 64u);
    let hd = p.head_dim;
    if (i >= p.m * p.n_heads * hd) {
        return;
    }
    let stride = hd + 2u;
    let base = (i / hd) * p.splits * stride;
    var top = NEG;
    for (var s = 0u; s < p.splits; s++) {
        top = max(top, parts[base + s * stride + hd]);
    }
    var sum = 0.0;
    var acc = 0.0;
    for (var s = 0u; s < p.splits; s++) {
        let at = base + s * stride;
        let w = exp(parts[at + hd] - top);
        sum += w * parts[at + hd + 1u];
        acc += w * parts[at + i % hd];
    }
    out[i] = select(0.0, acc / sum, sum > 0.0);
}
