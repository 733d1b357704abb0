// The sums over a workgroup of its WG threads' NR * MT accumulators, with subgroup operations:
// each subgroup adds its lanes' values in registers, and one lane per subgroup leaves the
// subgroup's sums in workgroup memory under a slot it draws. Where one subgroup filled the
// workgroup (the decode matmul's on a CPU adapter) a single slot was drawn and every lane already
// holds every total; otherwise thread t adds up the few slots (WG / subgroup size) of accumulators
// t, t + WG, .... Each total ends in the `acc` of the thread that writes it. The caller's control
// flow must be uniform across the workgroup.

var<workgroup> partial: array<f32, NR * MT * WG>;
var<workgroup> slots: atomic<u32>;

fn workgroup_sums(t: u32, acc: ptr<function, array<f32, NR * MT>>) {
    for (var j = 0u; j < NR * MT; j++) {
        (*acc)[j] = subgroupAdd((*acc)[j]);
    }
    if (subgroupBroadcastFirst(t) == t) {
        let slot = atomicAdd(&slots, 1u);
        for (var j = 0u; j < NR * MT; j++) {
            partial[j * WG + slot] = (*acc)[j];
        }
    }
    workgroupBarrier();
    let n = atomicLoad(&slots);
    if (n == 1u) {
        return;
    }
    for (var j = t; j < NR * MT; j += WG) {
        var s = 0.0;
        for (var q = 0u; q < n; q++) {
            s += partial[j * WG + q];
        }
        (*acc)[j] = s;
    }
}
