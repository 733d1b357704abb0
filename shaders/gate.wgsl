// A gated unit's output `act(g) * u`, with act(g) = g * sigmoid(g * (ca + cb * g^2)): SiLU and
// tanh-GELU by their coefficients (Activation::sigmoid_coefficients). The glu kernel and the
// matmul's gating epilogue both call it, so that the fused and the separate paths agree.
fn gated(g: f32, u: f32, ca: f32, cb: f32) -> f32 {
    return g / (1.0 + exp(-(g * (ca + cb * g * g)))) * u;
}
