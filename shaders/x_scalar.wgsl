// The matmul's activations as scalars, for any K: matmul.wgsl takes this or x_vec4.wgsl.
@group(0) @binding(1) var<storage, read> x: array<f32>;

// The four values at column `i` of activation row `row`, zero past the row's end.
fn xload4(row: u32, i: u32) -> vec4<f32> {
    let b = row * p.k + i;
    if (i + 4u <= p.k) {
        return vec4<f32>(x[b], x[b + 1u], x[b + 2u], x[b + 3u]);
    }
    var v = vec4<f32>(0.0);
    for (var c = 0u; c < p.k - i; c++) {
        v[c] = x[b + c];
    }
    return v;
}
