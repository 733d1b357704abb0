// Three output tensors side by side, for weights loaded one after the other and run in one pass (a
// layer's Q, K and V): columns ..split1 go to `out`, split1..split2 to `out1`, the rest to `out2`,
// each [m, its columns].

@group(0) @binding(6) var<storage, read_write> out1: array<f32>;
@group(0) @binding(7) var<storage, read_write> out2: array<f32>;

fn store_value(row: u32, col: u32, v: f32) {
    if (col < p.split1) {
        out[row * p.split1 + col] = v;
    } else if (col < p.split2) {
        out1[row * (p.split2 - p.split1) + col - p.split1] = v;
    } else {
        out2[row * (p.n - p.split2) + col - p.split2] = v;
    }
}
