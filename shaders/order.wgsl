// Order keys of f32 values, shared by the kernels that select among a row's entries: a u32 whose
// integer order is the values' (NaN lowest, as 0; -0 as +0), and pairs of (key, column) ranked
// by key, then by the lower column.

// NaN tested on the bits: WGSL lets a compiler assume no value is NaN.
fn is_nan(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u;
}

fn order_key(v: f32) -> u32 {
    if (is_nan(v)) {
        return 0u;
    }
    let b = bitcast<u32>(v + 0.0);
    if ((b >> 31u) == 1u) {
        return ~b;
    }
    return b | 0x80000000u;
}

// The value whose order key is `key` (not 0, NaN's).
fn key_value(key: u32) -> f32 {
    if ((key >> 31u) == 1u) {
        return bitcast<f32>(key & 0x7fffffffu);
    }
    return bitcast<f32>(~key);
}

// Whether a comes before b: the larger key, then the lower column.
fn before(a: vec2<u32>, b: vec2<u32>) -> bool {
    return a.x > b.x || (a.x == b.x && a.y < b.y);
}
