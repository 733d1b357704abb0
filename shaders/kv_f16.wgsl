// The KV cache in f16, two values per word (`pack2x16float`, core WGSL: no `shader-f16` needed),
// half the bytes of f32 for attention to read and for the cache to hold. A slot's values fill
// whole 16-byte blocks of 8 (`KvCache::stride` pads them), so that no block holds two slots'
// values: kv_write writes a block per thread, and attention reads a head's K a block at a time
// where the head is whole blocks (one vector load per lane, where lavapipe gathers a word per
// lane per value).
@group(0) @binding(5) var<storage, read_write> kc: array<vec4<u32>>;
@group(0) @binding(6) var<storage, read_write> vc: array<u32>;

const KV_BLOCK: u32 = 8u;

// K's block `b`: values 8b .. 8b + 8.
fn k_block(b: u32) -> array<f32, KV_BLOCK> {
    let w = kc[b];
    let lo = vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
    let hi = vec4<f32>(unpack2x16float(w.z), unpack2x16float(w.w));
    return array<f32, KV_BLOCK>(lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w);
}

fn k_at(i: u32) -> f32 {
    return unpack2x16float(kc[i >> 3u][(i >> 1u) & 3u])[i & 1u];
}

fn v_at(i: u32) -> f32 {
    return unpack2x16float(vc[i >> 1u])[i & 1u];
}

// Cache block `at` from the `n` (1 to 8) batch values of K and of V from `src` on; the rest of
// the block is zero.
fn kv_put(at: u32, src: u32, n: u32) {
    var kk: array<f32, KV_BLOCK>;
    var vv: array<f32, KV_BLOCK>;
    for (var e = 0u; e < n; e++) {
        kk[e] = k[src + e];
        vv[e] = v[src + e];
    }
    var kw: vec4<u32>;
    for (var j = 0u; j < 4u; j++) {
        kw[j] = pack2x16float(vec2<f32>(kk[2u * j], kk[2u * j + 1u]));
        vc[4u * at + j] = pack2x16float(vec2<f32>(vv[2u * j], vv[2u * j + 1u]));
    }
    kc[at] = kw;
}
