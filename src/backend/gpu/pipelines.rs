//! WGSL sources and the cache of compute pipelines built from them.
//!
//! An op declares its own [`Shader`] in its host file (there is no list of them here): its WGSL
//! (`wgsl!("name")`, from shaders/), the shared functions it includes, and the snippets it may
//! take. Every kernel is built with shaders/common.wgsl before it (the parameters at binding 0,
//! the invocation's ids and indices). A source may hold `{{NAME}}` placeholders (the weight type,
//! tile sizes, a function written for the device's features) that are filled in when a pipeline
//! is first needed, so that one kernel serves every variant. A kernel whose arithmetic type `F`
//! is `f16` is built with the `f16` extension enabled.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::error::Result;

use super::device::scoped;

/// The text of shaders/`$name`.wgsl.
macro_rules! wgsl {
    ($name:literal) => {
        include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/shaders/", $name, ".wgsl"))
    };
}
pub(super) use wgsl;

pub(super) struct Shader {
    pub name: &'static str,
    pub source: &'static str,
    /// Sources of shared functions prepended to it (the constants below, or the op's own).
    pub includes: &'static [&'static str],
    /// WGSL pieces the kernel takes in place of a placeholder whose value names them (`@name`):
    /// one function written for two kinds of device, or the bindings and accessors of one buffer
    /// stored or read two ways, so that a kernel need not be written twice.
    pub snippets: &'static [(&'static str, &'static str)],
}

/// Prepended to every kernel.
const COMMON: &str = wgsl!("common");

// Functions shared by the kernels of several ops: the weight decoders, the gating function, the
// order keys of values, a workgroup's sum.
pub(super) const DEQUANT: &str = wgsl!("dequant");
pub(super) const GATE: &str = wgsl!("gate");
pub(super) const ORDER: &str = wgsl!("order");
pub(super) const WORKGROUP_SUM: &str = wgsl!("workgroup_sum");

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
        let mut src: String =
            [enable, COMMON].iter().chain(shader.includes).chain([&shader.source]).flat_map(|s| [s, "\n"]).collect();
        for (k, v) in vars {
            let text = shader.snippets.iter().find(|(name, _)| name == v).map_or(*v, |(_, text)| *text);
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
