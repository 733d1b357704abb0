// out[m, row0 + r] = dot(x[m, :], W[r, :]) (+ bias), for one row range (part) of W, with W decoded
// from its storage type (dequant.wgsl, units.wgsl).
//
// `matmul_rows` serves M <= 64: a workgroup owns NR weight rows and MT activation rows, its WG
// threads split K a unit at a time (units.wgsl: 16 values of a K-quant row or of a 4- or 5-bit
// 32-value block, 4 of Q8_0 or a float row), and each weight value, decoded once, is used for
// all MT rows (each activation value loaded, for all NR rows; see Rust's `rows_per_group`).
// Weights are decoded and multiplied in F (f32, or f16 where the device has `shader-f16` and was
// asked to use it), each four products added in F and the sums in f32.
// Every output sums its units in the same order whatever M, so that a verification's rows have
// their decodes' bits. The partial sums meet in `workgroup_sums`, filled in below from
// sums_workgroup.wgsl or, where the device has subgroups, sums_subgroup.wgsl.
//
// The activations `x` (binding 1) and `xload4` come from x_vec4.wgsl where K is a multiple of 4,
// else from x_scalar.wgsl.
//
// Each output goes through `store`, which does what the call's epilogue says (Rust's
// `Epilogue`): store it; add it to what `out` holds, a residual connection's add in the matmul's
// pass; or gate it, `out = gated(side, value)` (gate.wgsl), the up projection of a gated
// feed-forward unit taking its gate projection from `side`. One pass serves two ops, as the
// separate add and glu kernels would have, to the bit. A stored value goes to `out` or, where W
// is several weights one after the other, to the output of the weight its column belongs to
// (`store_value`: outs_one.wgsl or outs_three.wgsl).
//
// W's rows start `at` rows into `wq` (weights loaded together share a buffer), the bias's values
// `bias_at` values into `bias`.
//
// Where PAIRED, W is a gated unit's gate and up projections one after the other (`split1` rows
// each, as loaded together) and `matmul_rows` writes `gated(gate, up)` for each of the `rows`
// outputs: a workgroup takes NR / 2 rows of each, whose sums are the separate projections' to
// the bit, so the one pass gives what the gate's pass and the up projection's gating pass give.
//
// `matmul_tiled` serves prefill (M > 64) in 32 x 32 output tiles, x and the decoded W staged
// through workgroup memory 32 values of K at a time; each of the 64 threads accumulates a 4 x 4
// block of the tile, decoding W four values at a time (`wload4_{{DTYPE}}`). It does not use NR
// and MT.

struct Params {
    m: u32,
    n: u32,
    k: u32,
    row0: u32,
    rows: u32,
    has_bias: u32,
    epilogue: u32,
    // The gating epilogue's activation coefficients (gate.wgsl).
    ga: f32,
    gb: f32,
    at: u32,
    bias_at: u32,
    // Where outs_three.wgsl's second and third outputs start.
    split1: u32,
    split2: u32,
}

@group(0) @binding(2) var<storage, read> wq: array<u32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<storage, read> side: array<f32>;

const WG: u32 = {{WG}}u;
const NR: u32 = {{NR}}u;
const MT: u32 = {{MT}}u;
// Up to how many activation rows `matmul_rows` unrolls its loop over them (Rust's UNROLLED_MT).
const UNROLLED_MT: u32 = {{UNROLLED_MT}}u;
// Vectors of four values a thread takes of a weight row at a time.
const UV: u32 = UV_{{UNIT}};
const PAIRED: bool = {{PAIRED}};
// Outputs per workgroup: NR, or NR / 2 gate rows and as many up rows where PAIRED.
const OUT_ROWS: u32 = select(NR, NR / 2u, PAIRED);
// workgroup_sums leaves accumulators j, j + SPAN, ... (j < SPAN: one output's GROUPS sums) with
// the same thread.
const GROUPS: u32 = select(1u, 2u, PAIRED);
const SPAN: u32 = OUT_ROWS * MT;

{{X}}

{{OUTS}}

// The epilogues; 0 stores.
const ADD: u32 = 1u;
const GATE: u32 = 2u;

fn store(row: u32, col: u32, s: f32) {
    var v = s;
    if (p.has_bias != 0u) {
        v += bias[p.bias_at + col];
    }
    let i = row * p.n + col;
    switch p.epilogue {
        case ADD: {
            out[i] += v;
        }
        case GATE: {
            out[i] = gated(side[i], v, p.ga, p.gb);
        }
        default: {
            store_value(row, col, v);
        }
    }
}

@compute @workgroup_size(WG)
fn matmul_rows(wg: Workgroup, @builtin(local_invocation_index) tid: u32) {
    let t = tid;
    let g = workgroup_index(wg);
    let row_groups = (p.rows + OUT_ROWS - 1u) / OUT_ROWS;
    let r0 = (g % row_groups) * OUT_ROWS;
    let m0 = (g / row_groups) * MT;
    if (m0 >= p.m) {
        return;
    }
    var acc: array<f32, NR * MT>;
    let units = (p.k + 4u * UV - 1u) / (4u * UV);
    for (var u = t; u < units; u += WG) {
        let at = xunit_{{UNIT}}(u);
        var n: array<Unit, NR>;
        for (var r = 0u; r < NR; r++) {
            // Rows past the part compute on a duplicate of its last row and are never written.
            let row = min(r0 + r % OUT_ROWS, p.rows - 1u) + r / OUT_ROWS * p.split1;
            n[r] = wunit_{{UNIT}}((p.at + row) * p.k, u, p.k);
        }
        for (var v = 0u; v < UV; v++) {
            var w: array<vec4<F>, NR>;
            for (var r = 0u; r < NR; r++) {
                w[r] = wquad_{{UNIT}}(n[r], v);
            }
            for (var mt = 0u; mt < MT; mt++) {
                // Up to UNROLLED_MT rows the loop has no exit, so that it unrolls: Rust then makes
                // the group the whole batch.
                if (MT > UNROLLED_MT && m0 + mt >= p.m) {
                    break;
                }
                let xv = vec4<F>(xload4(m0 + mt, at[v]));
                for (var r = 0u; r < NR; r++) {
                    // Each four products are added in F, the output's sum in f32.
                    acc[r * MT + mt] += f32(dot(w[r], xv));
                }
            }
        }
    }
    workgroup_sums(t, &acc);
    for (var j = t; j < SPAN; j += WG) {
        let r = r0 + j / MT;
        let row = m0 + j % MT;
        if (r < p.rows && row < p.m) {
            if (PAIRED) {
                out[row * p.n + p.row0 + r] = gated(acc[j], acc[j + SPAN], p.ga, p.gb);
            } else {
                store(row, p.row0 + r, acc[j]);
            }
        }
    }
}

{{SUMS}}

const TS: u32 = 32u;
const TK: u32 = 32u;

// [k][i / 4] of the tile, four consecutive tile rows per vector, so that the inner loop reads one
// vector of x and one of W per k.
var<workgroup> xs: array<vec4<f32>, TK * TS / 4u>;
var<workgroup> ws: array<vec4<f32>, TK * TS / 4u>;

@compute @workgroup_size(64)
fn matmul_tiled(wg: Workgroup, @builtin(local_invocation_index) tid: u32) {
    let t = tid;
    let g = workgroup_index(wg);
    let col_tiles = (p.rows + TS - 1u) / TS;
    let n0 = (g % col_tiles) * TS;
    let m0 = (g / col_tiles) * TS;
    if (m0 >= p.m) {
        return;
    }
    let tx = t % 8u;
    let ty = t / 8u;
    // The tile row this thread stages, and which half of the 32 K values.
    let lr = t / 2u;
    let lk = (t % 2u) * 16u;
    var acc: array<vec4<f32>, 4>;
    for (var k0 = 0u; k0 < p.k; k0 += TK) {
        for (var q = 0u; q < 4u; q++) {
            let kk = lk + 4u * q;
            var xv = vec4<f32>(0.0);
            var wv = vec4<f32>(0.0);
            if (k0 + kk < p.k) {
                if (m0 + lr < p.m) {
                    xv = xload4(m0 + lr, k0 + kk);
                }
                if (n0 + lr < p.rows) {
                    wv = wload4_{{DTYPE}}((p.at + n0 + lr) * p.k + k0 + kk, p.k - k0 - kk);
                }
            }
            for (var c = 0u; c < 4u; c++) {
                xs[(kk + c) * 8u + lr / 4u][lr % 4u] = xv[c];
                ws[(kk + c) * 8u + lr / 4u][lr % 4u] = wv[c];
            }
        }
        workgroupBarrier();
        for (var kk = 0u; kk < TK; kk++) {
            let a = xs[kk * 8u + ty];
            let b = ws[kk * 8u + tx];
            acc[0] += a.x * b;
            acc[1] += a.y * b;
            acc[2] += a.z * b;
            acc[3] += a.w * b;
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < 4u; i++) {
        let row = m0 + ty * 4u + i;
        for (var c = 0u; c < 4u; c++) {
            let r = n0 + tx * 4u + c;
            if (row < p.m && r < p.rows) {
                store(row, p.row0 + r, acc[i][c]);
            }
        }
    }
}

