// Prepended to every kernel (src/backend/gpu/pipelines.rs): what each would otherwise declare
// alike.

// The kernel's parameters, its own `Params`, at binding 0 (`dispatch` in encoder.rs).
@group(0) @binding(0) var<uniform> p: Params;

// Which workgroup an invocation is in; every entry point takes one, beside its thread's index in
// the workgroup (`@builtin(local_invocation_index) tid: u32`). The two stay apart: a browser's
// uniformity analysis (Tint) counts a struct holding a thread's index as varying by thread as a
// whole, and would then refuse every barrier after a bounds check on the workgroup's index.
struct Workgroup {
    @builtin(workgroup_id) id: vec3<u32>,
    @builtin(num_workgroups) count: vec3<u32>,
}

// The workgroup's index in the dispatch: one of more workgroups than a dimension holds is a 2D
// grid read as x + y * width (`grid` in encoder.rs).
fn workgroup_index(wg: Workgroup) -> u32 {
    return wg.id.x + wg.id.y * wg.count.x;
}

// The invocation's index in the dispatch, in workgroups of `size` threads.
fn global_index(wg: Workgroup, tid: u32, size: u32) -> u32 {
    return workgroup_index(wg) * size + tid;
}
