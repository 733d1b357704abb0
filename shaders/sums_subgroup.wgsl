// The sums over a workgroup of its WG threads' NR * MT accumulators, with subgroup operations:
// each subgroup adds its lanes' values in registers, and one lane per subgroup leaves the
// subgroup's sums in workgroup memory under a slot it draws. Where one subgroup filled the
// workgroup (the decode matmul's on a CPU adapter) a single slot was drawn and every lane already
// holds every total; otherwise thread t adds up the few slots (WG / subgroup size) of accumulators
// t, t + WG, ... below SPAN and of each one's GROUPS - 1 partners, SPAN apart (matmul.wgsl), in
// the order of each slot's first lane rather than the order the subgroups drew them in, which
// differs from run to run on a GPU: three or more f32 sums in another order can round to other
// bits, and a verification's rows must get their decodes' bits. Each total ends in the `acc` of
// the thread that writes it. The caller's control flow must be uniform across the workgroup.

var<workgroup> partial: array<f32, NR * MT * WG>;
var<workgroup> slots: atomic<u32>;
// The first lane (local index) of the subgroup that drew each slot.
var<workgroup> owner: array<u32, WG>;

fn workgroup_sums(t: u32, acc: ptr<function, array<f32, NR * MT>>) {
    for (var j = 0u; j < NR * MT; j++) {
        (*acc)[j] = subgroupAdd((*acc)[j]);
    }
    if (subgroupBroadcastFirst(t) == t) {
        let slot = atomicAdd(&slots, 1u);
        owner[slot] = t;
        for (var j = 0u; j < NR * MT; j++) {
            partial[j * WG + slot] = (*acc)[j];
        }
    }
    workgroupBarrier();
    let n = atomicLoad(&slots);
    if (n == 1u) {
        return;
    }
    for (var i = t; i < SPAN; i += WG) {
        for (var j = i; j < GROUPS * SPAN; j += SPAN) {
            var s = 0.0;
            var after = 0u;
            for (var r = 0u; r < n; r++) {
                // The slot whose first lane comes next after the last one added.
                var next = 0u;
                var lane = WG;
                for (var q = 0u; q < n; q++) {
                    let o = owner[q];
                    if ((r == 0u || o > after) && o < lane) {
                        next = q;
                        lane = o;
                    }
                }
                after = lane;
                s += partial[j * WG + next];
            }
            (*acc)[j] = s;
        }
    }
}
