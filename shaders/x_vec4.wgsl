// The matmul's activations as vec4s, for a K that is a multiple of 4 (every quantized weight's):
// lavapipe loads a vec4 at once, where it gathers four scalars lane by lane. matmul.wgsl takes
// this or x_scalar.wgsl.
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;

// The four values at column `i` (a multiple of 4) of activation row `row`.
fn xload4(row: u32, i: u32) -> vec4<f32> {
    return x[(row * p.k + i) >> 2u];
}
