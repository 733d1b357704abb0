// The KV cache in f32: `attention.wgsl` takes this or kv_f16.wgsl. A slot's values fill whole
// 16-byte blocks of 4, which attention reads K by where a head is whole blocks.
@group(0) @binding(5) var<storage, read_write> kc: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read_write> vc: array<f32>;

const KV_BLOCK: u32 = 4u;

// K's block `b`: values 4b .. 4b + 4.
fn k_block(b: u32) -> array<f32, KV_BLOCK> {
    let w = kc[b];
    return array<f32, KV_BLOCK>(w.x, w.y, w.z, w.w);
}

fn k_at(i: u32) -> f32 {
    return kc[i >> 2u][i & 3u];
}

fn v_at(i: u32) -> f32 {
    return vc[i];
}

// Cache block `at` from the `n` (1 to 4) batch values of K and of V from `src` on; the rest of
// the block is zero.
fn kv_put(at: u32, src: u32, n: u32) {
    var kk = vec4<f32>(0.0);
    for (var e = 0u; e < KV_BLOCK; e++) {
        var vv = 0.0;
        if (e < n) {
            kk[e] = k[src + e];
            vv = v[src + e];
        }
        vc[KV_BLOCK * at + e] = vv;
    }
    kc[at] = kk;
}
