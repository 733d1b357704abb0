// The sums over a workgroup of its WG threads' NR * MT accumulators, through workgroup memory
// alone (plain WebGPU): every thread leaves its values there, and thread t adds up the WG values
// of accumulators t, t + WG, ... below SPAN and of each one's GROUPS - 1 partners, SPAN apart
// (matmul.wgsl), leaving each total in its own `acc`. The caller's control flow must be uniform
// across the workgroup.

var<workgroup> partial: array<f32, NR * MT * WG>;

fn workgroup_sums(t: u32, acc: ptr<function, array<f32, NR * MT>>) {
    for (var j = 0u; j < NR * MT; j++) {
        partial[j * WG + t] = (*acc)[j];
    }
    workgroupBarrier();
    for (var i = t; i < SPAN; i += WG) {
        for (var j = i; j < GROUPS * SPAN; j += SPAN) {
            var s = 0.0;
            for (var q = 0u; q < WG; q++) {
                s += partial[j * WG + q];
            }
            (*acc)[j] = s;
        }
    }
}
