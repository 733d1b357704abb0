// The KV cache in f32, one value per word: `attention.wgsl` takes this or kv_f16.wgsl.
@group(0) @binding(5) var<storage, read_write> kc: array<f32>;
@group(0) @binding(6) var<storage, read_write> vc: array<f32>;

const KV_PER_WORD: u32 = 1u;

fn k_at(i: u32) -> f32 {
    return kc[i];
}

fn v_at(i: u32) -> f32 {
    return vc[i];
}

// Cache word `at` from batch value `src` of K and of V (`n` is always 1).
fn kv_put(at: u32, src: u32, n: u32) {
    kc[at] = k[src];
    vc[at] = v[src];
}
