//! WGSL sources and the cache of compute pipelines built from them. A source may hold `{{NAME}}`
//! placeholders (the weight type, tile sizes, a function written for the device's features) that
//! are filled in when a pipeline is first needed, so that one kernel serves every variant. A
//! kernel whose arithmetic type `F` is `f16` is built with the `f16` extension enabled.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::error::Result;

use super::device::scoped;

pub(super) struct Shader {
    name: &'static str,
    source: &'static str,
    /// Sources of shared functions prepended to it: the weight decoders, the gating function, the
    /// order keys of values, the decode matmul's units.
    includes: &'static [&'static str],
}

const DEQUANT: &str = include_str!("../../../shaders/dequant.wgsl");
const UNITS: &str = include_str!("../../../shaders/units.wgsl");
const GATE: &str = include_str!("../../../shaders/gate.wgsl");
const ORDER: &str = include_str!("../../../shaders/order.wgsl");
const WORKGROUP_SUM: &str = include_str!("../../../shaders/workgroup_sum.wgsl");

/// WGSL pieces a kernel takes in place of a placeholder whose value names them (`@name`): one
/// function written for two kinds of device, or the bindings and accessors of one buffer stored
/// or read two ways, so that a kernel need not be written twice.
const SNIPPETS: [(&str, &str); 9] = [
    ("@outs_one", include_str!("../../../shaders/outs_one.wgsl")),
    ("@outs_two", include_str!("../../../shaders/outs_two.wgsl")),
    ("@outs_three", include_str!("../../../shaders/outs_three.wgsl")),
    ("@sums_workgroup", include_str!("../../../shaders/sums_workgroup.wgsl")),
    ("@sums_subgroup", include_str!("../../../shaders/sums_subgroup.wgsl")),
    ("@kv_f32", include_str!("../../../shaders/kv_f32.wgsl")),
    ("@kv_f16", include_str!("../../../shaders/kv_f16.wgsl")),
    ("@x_vec4", include_str!("../../../shaders/x_vec4.wgsl")),
    ("@x_scalar", include_str!("../../../shaders/x_scalar.wgsl")),
];

pub(super) const MATMUL: Shader =
    Shader { name: "matmul", source: include_str!("../../../shaders/matmul.wgsl"), includes: &[DEQUANT, UNITS, GATE] };
pub(super) const EMBED: Shader = Shader { name: "embed", source: include_str!("../../../shaders/embed.wgsl"), includes: &[DEQUANT] };
pub(super) const NORM: Shader = Shader { name: "norm", source: include_str!("../../../shaders/norm.wgsl"), includes: &[] };
pub(super) const ROPE: Shader = Shader { name: "rope", source: include_str!("../../../shaders/rope.wgsl"), includes: &[] };
pub(super) const ATTENTION: Shader =
    Shader { name: "attention", source: include_str!("../../../shaders/attention.wgsl"), includes: &[] };
pub(super) const ELEMENTWISE: Shader =
    Shader { name: "elementwise", source: include_str!("../../../shaders/elementwise.wgsl"), includes: &[GATE] };
pub(super) const TOPK: Shader = Shader { name: "topk", source: include_str!("../../../shaders/topk.wgsl"), includes: &[ORDER, WORKGROUP_SUM] };
pub(super) const DRAW: Shader = Shader { name: "draw", source: include_str!("../../../shaders/draw.wgsl"), includes: &[ORDER, WORKGROUP_SUM] };
pub(super) const ARGMAX: Shader =
    Shader { name: "argmax", source: include_str!("../../../shaders/argmax.wgsl"), includes: &[] };

/// A pipeline with its bind group layout (derived from the shader).
#[derive(Clone)]
pub(super) struct Kernel {
    pub pipeline: wgpu::ComputePipeline,
    pub layout: wgpu::BindGroupLayout,
    pub name: String,
}

#[derive(Default)]
pub(super) struct Pipelines {
    cache: Mutex<HashMap<String, Kernel>>,
}

impl Pipelines {
    /// The names of the pipelines built so far, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.cache.lock().unwrap().keys().cloned().collect();
        names.sort();
        names
    }

    /// The pipeline of `entry` in `shader` with the placeholders replaced as `vars` says.
    pub fn get(&self, device: &wgpu::Device, shader: &Shader, entry: &str, vars: &[(&str, &str)]) -> Result<Kernel> {
        let name = std::iter::once(format!("{}.{entry}", shader.name))
            .chain(vars.iter().map(|(k, v)| format!("{k}={v}")))
            .collect::<Vec<_>>()
            .join(",");
        if let Some(k) = self.cache.lock().unwrap().get(&name) {
            return Ok(k.clone());
        }
        // WGSL wants its extensions enabled before any declaration.
        let enable = if vars.contains(&("F", "f16")) { "enable f16;\n" } else { "" };
        let mut src: String = [enable].iter().chain(shader.includes).chain([&shader.source]).flat_map(|s| [s, "\n"]).collect();
        for (k, v) in vars {
            let text = SNIPPETS.iter().find(|(name, _)| name == v).map_or(*v, |(_, text)| *text);
            src = src.replace(&format!("{{{{{k}}}}}"), text);
        }
        let (pipeline, layout) = scoped(
            device,
            || format!("building GPU kernel {name}"),
            || {
                let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
                    label: Some(&name),
                    source: wgpu::ShaderSource::Wgsl(src.into()),
                });
                let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                    label: Some(&name),
                    layout: None,
                    module: &module,
                    entry_point: Some(entry),
                    compilation_options: Default::default(),
                    cache: None,
                });
                let layout = pipeline.get_bind_group_layout(0);
                (pipeline, layout)
            },
        )?;
        let k = Kernel { pipeline, layout, name: name.clone() };
        self.cache.lock().unwrap().insert(name, k.clone());
        Ok(k)
    }
}
