// Prepended to every kernel (src/backend/gpu/pipelines.rs): what each would otherwise declare
// alike.

// The kernel's parameters, its own `Params`, at binding 0 (`dispatch` in encoder.rs).
@group(0) @binding(0) var<uniform> p: Params;

// Where an invocation is; every entry point takes one. `t` is the thread within its workgroup.
struct Invocation {
    @builtin(local_invocation_index) t: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
}

// The workgroup's index in the dispatch: one of more workgroups than a dimension holds is a 2D
// grid read as x + y * width (`grid` in encoder.rs).
fn workgroup_index(inv: Invocation) -> u32 {
    return inv.wid.x + inv.wid.y * inv.nwg.x;
}

// The invocation's index in the dispatch, in workgroups of `size` threads.
fn global_index(inv: Invocation, size: u32) -> u32 {
    return workgroup_index(inv) * size + inv.t;
}
