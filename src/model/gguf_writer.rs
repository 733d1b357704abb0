//! A minimal GGUF v3 writer: metadata of the types model files use and tensors in any stored
//! type, each tensor aligned to 32 bytes. It writes the files of `saguaro synth` (`model::synth`)
//! and the tests' tiny and malformed models.

use std::io::{self, Write};

pub enum Val {
    U32(u32),
    F32(f32),
    Str(String),
    Strs(Vec<String>),
    Bool(bool),
    /// An array of i32 (how llama.cpp's converter writes `tokenizer.ggml.token_type`).
    I32s(Vec<i32>),
}

#[derive(Default)]
pub struct GgufWriter {
    kv: Vec<(String, Val)>,
    /// (name, dims, ggml type, data)
    tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)>,
}

const ALIGNMENT: usize = 32;

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

impl GgufWriter {
    pub fn kv(mut self, k: &str, v: Val) -> Self {
        self.kv.push((k.into(), v));
        self
    }
    /// A tensor of ggml type `ty` (see `DType::ggml_id`) with ggml's dims (the row length first).
    pub fn tensor(mut self, name: &str, dims: &[u64], ty: u32, data: Vec<u8>) -> Self {
        self.tensors.push((name.into(), dims.to_vec(), ty, data));
        self
    }
    /// The header, metadata and tensor infos, padded to the alignment; `declared_tensor_count`
    /// overrides the header's tensor count when given.
    fn head(&self, declared_tensor_count: Option<u64>) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend(declared_tensor_count.unwrap_or(self.tensors.len() as u64).to_le_bytes());
        out.extend((self.kv.len() as u64).to_le_bytes());
        for (k, v) in &self.kv {
            put_str(&mut out, k);
            match v {
                Val::U32(x) => {
                    out.extend(4u32.to_le_bytes());
                    out.extend(x.to_le_bytes());
                }
                Val::F32(x) => {
                    out.extend(6u32.to_le_bytes());
                    out.extend(x.to_le_bytes());
                }
                Val::Str(s) => {
                    out.extend(8u32.to_le_bytes());
                    put_str(&mut out, s);
                }
                Val::Strs(a) => {
                    out.extend(9u32.to_le_bytes());
                    out.extend(8u32.to_le_bytes());
                    out.extend((a.len() as u64).to_le_bytes());
                    a.iter().for_each(|s| put_str(&mut out, s));
                }
                Val::Bool(b) => {
                    out.extend(7u32.to_le_bytes());
                    out.push(*b as u8);
                }
                Val::I32s(a) => {
                    out.extend(9u32.to_le_bytes());
                    out.extend(5u32.to_le_bytes());
                    out.extend((a.len() as u64).to_le_bytes());
                    a.iter().for_each(|x| out.extend(x.to_le_bytes()));
                }
            }
        }
        let mut offset = 0u64;
        for (name, dims, ty, data) in &self.tensors {
            put_str(&mut out, name);
            out.extend((dims.len() as u32).to_le_bytes());
            dims.iter().for_each(|d| out.extend(d.to_le_bytes()));
            out.extend(ty.to_le_bytes());
            out.extend(offset.to_le_bytes());
            offset += data.len().next_multiple_of(ALIGNMENT) as u64;
        }
        out.resize(out.len().next_multiple_of(ALIGNMENT), 0);
        out
    }
    /// Write the file to `out`, one tensor at a time.
    pub fn write_to(&self, out: &mut impl Write) -> io::Result<()> {
        self.write_with(out, None)
    }
    fn write_with(&self, out: &mut impl Write, declared_tensor_count: Option<u64>) -> io::Result<()> {
        out.write_all(&self.head(declared_tensor_count))?;
        let zeros = [0u8; ALIGNMENT];
        for (_, _, _, data) in &self.tensors {
            out.write_all(data)?;
            out.write_all(&zeros[..data.len().next_multiple_of(ALIGNMENT) - data.len()])?;
        }
        Ok(())
    }
    /// Serialise; `declared_tensor_count` overrides the header's tensor count when given.
    pub fn build_with(&self, declared_tensor_count: Option<u64>) -> Vec<u8> {
        let mut out = Vec::new();
        self.write_with(&mut out, declared_tensor_count).expect("writing to memory cannot fail");
        out
    }
    pub fn build(&self) -> Vec<u8> {
        self.build_with(None)
    }
}
