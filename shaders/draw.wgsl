// One token drawn from each row of logits where the rows were computed, and the row's probability
// at one asked-for column: sampling over the whole vocabulary reads back 8 bytes a row, not the
// row. A row draws from its softmax at the temperature or, where it comes with a distribution q,
// from the residual max(0, p - q) (p where that is zero everywhere).
//
// The draw is an exponential race (src/backend/draw.rs runs it on the host): column c gets a time
// E_c ~ Exp(1) from a hash of (seed, row, c), and the column with the largest ln r_c - ln E_c
// wins, with probability r_c / sum(r). Every column is drawn on its own, by any thread. One
// workgroup per row, three passes over it: the largest value, the sum of exp about it, the race.
// Ties go to the lower column; NaN and -inf weigh nothing; an infinite largest value weighs the
// infinite columns alike; a row with no weight at all puts its mass on its argmax, as the host's
// sampling does.

struct Params {
    rows: u32,
    // Columns per row.
    n: u32,
    temperature: f32,
    seed_lo: u32,
    seed_hi: u32,
}

@group(0) @binding(1) var<storage, read> x: array<f32>;
// Per row: the token, the probability's bits.
@group(0) @binding(3) var<storage, read_write> out: array<u32>;
// [rows] asked-for columns, [rows + 1] offsets of the rows' q entries, their columns (ascending
// within a row), then their probabilities' bits.
@group(0) @binding(4) var<storage, read> q: array<u32>;

const WG: u32 = 256u;
const NONE: u32 = 0xffffffffu;
const INF_BITS: u32 = 0x7f800000u;
const NEG_INF_BITS: u32 = 0xff800000u;
const TWO_TO_MINUS_32: f32 = 2.3283064365386963e-10;

var<workgroup> pairs: array<vec2<u32>, WG>;
// What thread 0 tells the others, read with workgroupUniformLoad so that they may branch on it.
var<workgroup> chosen: vec2<u32>;

// The first of the threads' pairs in `before`'s order, for every thread.
fn first_pair(t: u32, mine: vec2<u32>) -> vec2<u32> {
    pairs[t] = mine;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (t < s && before(pairs[t + s], pairs[t])) {
            pairs[t] = pairs[t + s];
        }
        workgroupBarrier();
    }
    if (t == 0u) {
        chosen = pairs[0];
    }
    return workgroupUniformLoad(&chosen);
}

fn mix(h0: u32) -> u32 {
    var h = h0;
    h ^= h >> 16u;
    h *= 0x85ebca6bu;
    h ^= h >> 13u;
    h *= 0xc2b2ae35u;
    return h ^ (h >> 16u);
}

// ln E for the bits: E = -ln(1 - v), v uniform in (0, 1) at the bits' midpoint. Where v is small
// (E is, and decides whether an unlikely column wins) 1 - v would round away its bits: a series.
fn ln_race_time(bits: u32) -> f32 {
    if (bits < 0x01000000u) {
        let v = (f32(bits) + 0.5) * TWO_TO_MINUS_32;
        return log(v * (1.0 + v * (0.5 + v / 3.0)));
    }
    return log(-log((f32(~bits) + 0.5) * TWO_TO_MINUS_32));
}

@compute @workgroup_size(256)
fn draw(wg: Workgroup, @builtin(local_invocation_index) tid: u32) {
    let t = tid;
    let row = workgroup_index(wg);
    if (row >= p.rows) {
        return;
    }
    let base = row * p.n;
    var mine = vec2<u32>(0u, NONE);
    for (var c = t; c < p.n; c += WG) {
        let e = vec2<u32>(order_key(x[base + c]), c);
        if (before(e, mine)) {
            mine = e;
        }
    }
    let largest = first_pair(t, mine);
    let at = q[row];
    let m = bitcast<u32>(key_value(largest.x));
    if (largest.x == 0u || m == NEG_INF_BITS) {
        if (t == 0u) {
            out[2u * row] = largest.y;
            out[2u * row + 1u] = bitcast<u32>(select(0.0, 1.0, at == largest.y));
        }
        return;
    }
    let m_inf = m == INF_BITS;
    let mv = key_value(largest.x);

    var sum = 0.0;
    for (var c = t; c < p.n; c += WG) {
        let v = x[base + c];
        if (weighs(v, m_inf)) {
            sum += exp(scaled(v, mv, m_inf));
        }
    }
    let ln_sum = log(workgroup_sum(t, sum));

    let row_key = mix(mix(mix(p.seed_hi ^ 0x9e3779b9u) ^ p.seed_lo) + row);
    let q_start = q[p.rows + row];
    let q_end = q[p.rows + row + 1u];
    let ids = 2u * p.rows + 1u;
    let probs = ids + q[2u * p.rows];
    var best_p = vec2<u32>(0u, NONE);
    var best_r = vec2<u32>(0u, NONE);
    for (var c = t; c < p.n; c += WG) {
        let v = x[base + c];
        if (!weighs(v, m_inf)) {
            continue;
        }
        let lp = scaled(v, mv, m_inf) - ln_sum;
        let le = ln_race_time(mix(mix(c + row_key) ^ row_key));
        let kp = vec2<u32>(order_key(lp - le), c);
        if (before(kp, best_p)) {
            best_p = kp;
        }
        var kr = kp;
        // The column's q entry, by bisection.
        var lo = q_start;
        var hi = q_end;
        while (lo < hi) {
            let mid = (lo + hi) / 2u;
            if (q[ids + mid] < c) {
                lo = mid + 1u;
            } else {
                hi = mid;
            }
        }
        if (lo < q_end && q[ids + lo] == c) {
            let d = exp(lp) - bitcast<f32>(q[probs + lo]);
            kr = select(vec2<u32>(0u, NONE), vec2<u32>(order_key(log(d) - le), c), d > 0.0);
        }
        if (before(kr, best_r)) {
            best_r = kr;
        }
    }
    let drawn_p = first_pair(t, best_p);
    let drawn_r = first_pair(t, best_r);
    if (t == 0u) {
        out[2u * row] = select(drawn_r.y, drawn_p.y, drawn_r.y == NONE);
        var p_at = 0.0;
        if (at < p.n && weighs(x[base + at], m_inf)) {
            p_at = exp(scaled(x[base + at], mv, m_inf) - ln_sum);
        }
        out[2u * row + 1u] = bitcast<u32>(p_at);
    }
}

// Whether a value has weight in a row whose largest value is infinite (`m_inf`) or not.
fn weighs(v: f32, m_inf: bool) -> bool {
    let b = bitcast<u32>(v);
    return !is_nan(v) && b != NEG_INF_BITS && (!m_inf || b == INF_BITS);
}

// ln of a weighing value's weight relative to the largest value's.
fn scaled(v: f32, m: f32, m_inf: bool) -> f32 {
    if (m_inf) {
        return 0.0;
    }
    return (v - m) / p.temperature;
}
