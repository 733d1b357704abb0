// The sum of every thread's value over a workgroup of WG threads (a power of two), added in
// halves through workgroup memory, the same tree whatever the caller; every thread gets it. The
// caller's control flow must be uniform across the workgroup.

var<workgroup> halves: array<f32, WG>;

fn workgroup_sum(t: u32, v: f32) -> f32 {
    halves[t] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (t < s) {
            halves[t] += halves[t + s];
        }
        workgroupBarrier();
    }
    let total = halves[0];
    // Before a later call's thread 0 writes over it.
    workgroupBarrier();
    return total;
}
