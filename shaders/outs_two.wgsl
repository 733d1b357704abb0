// Two output tensors side by side, for weights loaded one after the other and run in one pass (a
// layer's Q and K, where its V is stored in another type): columns ..split1 go to `out`, the rest
// to `out1`, each [m, its columns].

@group(0) @binding(6) var<storage, read_write> out1: array<f32>;

fn store_value(row: u32, col: u32, v: f32) {
    if (col < p.split1) {
        out[row * p.split1 + col] = v;
    } else {
        out1[row * (p.n - p.split1) + col - p.split1] = v;
    }
}
