// The sums over a workgroup of its WG threads' NR * MT accumulators, through workgroup memory
// alone (plain WebGPU): every thread leaves its values there, and thread j < NR * MT adds up the
// WG values of accumulator j. The caller's control flow must be uniform across the workgroup.

var<workgroup> partial: array<f32, NR * MT * WG>;

fn workgroup_sums(t: u32, acc: ptr<function, array<f32, NR * MT>>) -> f32 {
    for (var j = 0u; j < NR * MT; j++) {
        partial[j * WG + t] = (*acc)[j];
    }
    workgroupBarrier();
    var s = 0.0;
    if (t < NR * MT) {
        for (var q = 0u; q < WG; q++) {
            s += partial[t * WG + q];
        }
    }
    return s;
}
