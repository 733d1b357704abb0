// The KV cache in f16, two values per word (`pack2x16float`, core WGSL: no `shader-f16` needed),
// half the bytes of f32 for attention to read and for the cache to hold. A slot's values start
// at an even index (odd rows are padded), so that a word never holds two slots' values and one
// thread writes each word whole.
@group(0) @binding(5) var<storage, read_write> kc: array<u32>;
@group(0) @binding(6) var<storage, read_write> vc: array<u32>;

const KV_PER_WORD: u32 = 2u;

fn k_at(i: u32) -> f32 {
    return unpack2x16float(kc[i >> 1u])[i & 1u];
}

fn v_at(i: u32) -> f32 {
    return unpack2x16float(vc[i >> 1u])[i & 1u];
}

// Cache word `at` from the `n` (1 or 2) batch values of K and of V from `src` on.
fn kv_put(at: u32, src: u32, n: u32) {
    var kk = vec2<f32>(k[src], 0.0);
    var vv = vec2<f32>(v[src], 0.0);
    if (n == 2u) {
        kk.y = k[src + 1u];
        vv.y = v[src + 1u];
    }
    kc[at] = pack2x16float(kk);
    vc[at] = pack2x16float(vv);
}
