// The matmul's one output tensor, `out` ([m, n]).

fn store_value(row: u32, col: u32, v: f32) {
    out[row * p.n + col] = v;
}
