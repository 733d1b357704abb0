// The sums over a workgroup of its WG threads' NR * MT accumulators, with subgroup operations:
// each subgroup adds its lanes' values in registers, one lane per subgroup leaves the subgroup's
// sums in workgroup memory under a slot it draws, and thread j < NR * MT adds up the few slots
// of accumulator j (WG / subgroup size of them, instead of WG). The caller's control flow must be
// uniform across the workgroup.

var<workgroup> partial: array<f32, NR * MT * WG>;
var<workgroup> slots: atomic<u32>;

fn workgroup_sums(t: u32, acc: ptr<function, array<f32, NR * MT>>) -> f32 {
    var sums: array<f32, NR * MT>;
    for (var j = 0u; j < NR * MT; j++) {
        sums[j] = subgroupAdd((*acc)[j]);
    }
    if (subgroupBroadcastFirst(t) == t) {
        let slot = atomicAdd(&slots, 1u);
        for (var j = 0u; j < NR * MT; j++) {
            partial[j * WG + slot] = sums[j];
        }
    }
    workgroupBarrier();
    let n = atomicLoad(&slots);
    var s = 0.0;
    if (t < NR * MT) {
        for (var q = 0u; q < n; q++) {
            s += partial[t * WG + q];
        }
    }
    return s;
}
