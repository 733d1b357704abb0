//! A minimal GGUF v3 writer: metadata of the types model files use and tensors in any stored
//! type, each tensor aligned to 32 bytes. It writes the files of `saguaro synth` (`model::synth`)
//! and the tests' tiny and malformed models.

use std::io::{self, Write};

use crate::model::gguf::{Gguf, Value};

pub enum Val {
    U32(u32),
    F32(f32),
    Str(String),
    Strs(Vec<String>),
    Bool(bool),
    /// An array of i32 (how llama.cpp's converter writes `tokenizer.ggml.token_type`).
    I32s(Vec<i32>),
    /// Any value, as read from a GGUF file.
    Value(Value),
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

/// GGUF's type id of `v`.
fn type_id(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

/// `v`'s type id and bytes.
fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        // An empty array's element type is not kept when read: any scalar type will do.
        Value::Array(a) => put_array(out, a.first().map_or(4, type_id), a),
        v => {
            out.extend(type_id(v).to_le_bytes());
            put_payload(out, v);
        }
    }
}

fn put_array(out: &mut Vec<u8>, elem: u32, items: &[Value]) {
    out.extend(9u32.to_le_bytes());
    out.extend(elem.to_le_bytes());
    out.extend((items.len() as u64).to_le_bytes());
    items.iter().for_each(|x| put_payload(out, x));
}

/// A scalar's bytes, without its type (an array's elements).
fn put_payload(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend(x.to_le_bytes()),
        Value::I16(x) => out.extend(x.to_le_bytes()),
        Value::U32(x) => out.extend(x.to_le_bytes()),
        Value::I32(x) => out.extend(x.to_le_bytes()),
        Value::F32(x) => out.extend(x.to_le_bytes()),
        Value::Bool(b) => out.push(*b as u8),
        Value::String(s) => put_str(out, s),
        Value::U64(x) => out.extend(x.to_le_bytes()),
        Value::I64(x) => out.extend(x.to_le_bytes()),
        Value::F64(x) => out.extend(x.to_le_bytes()),
        Value::Array(_) => unreachable!("GGUF arrays do not nest"),
    }
}

impl GgufWriter {
    /// The file whose header is `g` and whose bytes are `file`, to be written again (its
    /// metadata in key order).
    pub fn from_gguf(g: &Gguf, file: &[u8]) -> Self {
        let mut kv: Vec<_> = g.metadata.iter().filter(|(k, _)| *k != "general.alignment").collect();
        kv.sort_by(|a, b| a.0.cmp(b.0));
        let kv = kv.into_iter().map(|(k, v)| (k.clone(), Val::Value(v.clone()))).collect();
        let tensors = g
            .tensors
            .iter()
            .map(|t| {
                let dims = t.dims.iter().map(|&d| d as u64).collect();
                (t.name.clone(), dims, t.dtype.ggml_id(), file[t.range.start as usize..t.range.end as usize].to_vec())
            })
            .collect();
        GgufWriter { kv, tensors }
    }

    /// The model cut into `parts` files as llama.cpp's gguf-split cuts it: the tensors shared
    /// out in order, the first file with all the metadata, each with the `split.*` keys.
    pub fn split(self, parts: usize) -> Vec<GgufWriter> {
        let total = self.tensors.len();
        let per = total.div_ceil(parts.max(1));
        let mut tensors = self.tensors.into_iter();
        let mut kv = Some(self.kv);
        (0..parts)
            .map(|no| {
                let keys = [
                    ("split.no", Value::U16(no as u16)),
                    ("split.count", Value::U16(parts as u16)),
                    ("split.tensors.count", Value::I32(total as i32)),
                ];
                let mut w = GgufWriter { kv: kv.take().unwrap_or_default(), tensors: tensors.by_ref().take(per).collect() };
                w.kv.extend(keys.into_iter().map(|(k, v)| (k.to_string(), Val::Value(v))));
                w
            })
            .collect()
    }


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
                Val::U32(x) => put_value(&mut out, &Value::U32(*x)),
                Val::F32(x) => put_value(&mut out, &Value::F32(*x)),
                Val::Str(s) => put_value(&mut out, &Value::String(s.clone())),
                Val::Bool(b) => put_value(&mut out, &Value::Bool(*b)),
                Val::Strs(a) => put_array(&mut out, 8, &a.iter().map(|s| Value::String(s.clone())).collect::<Vec<_>>()),
                Val::I32s(a) => put_array(&mut out, 5, &a.iter().map(|&x| Value::I32(x)).collect::<Vec<_>>()),
                Val::Value(v) => put_value(&mut out, v),
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
