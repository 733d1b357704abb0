//! GGUF (v2 and v3) parsing: metadata, tensor infos and alignment, with every size checked
//! against the file so a corrupt or truncated file is an error, never a panic or a huge allocation.

use std::collections::HashMap;
use std::ops::Range;

use crate::error::{Error, Result};
use crate::model::quant::DType;

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;

#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
}

impl Value {
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v as u64),
            Value::U16(v) => Some(v as u64),
            Value::U32(v) => Some(v as u64),
            Value::U64(v) => Some(v),
            Value::I8(v) if v >= 0 => Some(v as u64),
            Value::I16(v) if v >= 0 => Some(v as u64),
            Value::I32(v) if v >= 0 => Some(v as u64),
            Value::I64(v) if v >= 0 => Some(v as u64),
            _ => None,
        }
    }
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v as f64),
            Value::F64(v) => Some(v),
            _ => self.as_u64().map(|v| v as f64),
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }
}

#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the contiguous (innermost) dimension.
    pub dims: Vec<usize>,
    pub dtype: DType,
    /// Absolute byte range in the file.
    pub range: Range<usize>,
}

#[derive(Debug)]
pub struct Gguf {
    pub version: u32,
    pub metadata: HashMap<String, Value>,
    pub tensors: Vec<TensorInfo>,
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len()).ok_or_else(|| {
            Error::invalid_model(format!(
                "GGUF file truncated: needed {n} bytes at offset {} of {}",
                self.pos,
                self.buf.len()
            ))
        })?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn arr<const N: usize>(&mut self) -> Result<[u8; N]> {
        Ok(self.take(N)?.try_into().expect("take returns N bytes"))
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.arr()?))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.arr()?))
    }
    /// A count of items of at least `min_item_bytes` each: bounded by the bytes left, so a
    /// corrupt count cannot trigger a huge allocation.
    fn count(&mut self, min_item_bytes: usize, what: &str) -> Result<usize> {
        let n = self.u64()?;
        let left = (self.buf.len() - self.pos) as u64;
        if n.saturating_mul(min_item_bytes as u64) > left {
            return Err(Error::invalid_model(format!(
                "GGUF {what} count {n} exceeds what the file can hold (truncated or corrupt)"
            )));
        }
        Ok(n as usize)
    }
    fn string(&mut self) -> Result<String> {
        let n = self.count(1, "string length")?;
        let b = self.take(n)?;
        String::from_utf8(b.to_vec()).map_err(|_| Error::invalid_model("GGUF string is not UTF-8"))
    }
    fn value(&mut self, ty: u32, depth: u32) -> Result<Value> {
        Ok(match ty {
            0 => Value::U8(self.arr::<1>()?[0]),
            1 => Value::I8(self.arr::<1>()?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.arr()?)),
            3 => Value::I16(i16::from_le_bytes(self.arr()?)),
            4 => Value::U32(self.u32()?),
            5 => Value::I32(i32::from_le_bytes(self.arr()?)),
            6 => Value::F32(f32::from_le_bytes(self.arr()?)),
            7 => Value::Bool(self.arr::<1>()?[0] != 0),
            8 => Value::String(self.string()?),
            9 if depth == 0 => {
                let elem = self.u32()?;
                let n = self.count(1, "array length")?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.value(elem, depth + 1)?);
                }
                Value::Array(v)
            }
            10 => Value::U64(self.u64()?),
            11 => Value::I64(i64::from_le_bytes(self.arr()?)),
            12 => Value::F64(f64::from_le_bytes(self.arr()?)),
            _ => return Err(Error::invalid_model(format!("GGUF metadata value type {ty} unknown"))),
        })
    }
}

impl Gguf {
    /// Parse the header of a GGUF file held in `buf` (the whole file, memory-mapped or read).
    pub fn parse(buf: &[u8]) -> Result<Gguf> {
        let mut r = Reader { buf, pos: 0 };
        if buf.len() < 4 || &buf[..4] != MAGIC {
            return Err(Error::invalid_model("not a GGUF file (bad magic)"));
        }
        r.pos = 4;
        let version = r.u32()?;
        if !(2..=3).contains(&version) {
            return Err(Error::Unsupported(format!("GGUF version {version} (2 and 3 are supported)")));
        }
        let n_tensors = r.count(24, "tensor")?;
        let n_kv = r.count(12, "metadata")?;
        let mut metadata = HashMap::with_capacity(n_kv);
        for _ in 0..n_kv {
            let key = r.string()?;
            let ty = r.u32()?;
            let value = r.value(ty, 0)?;
            metadata.insert(key, value);
        }
        let mut raw = Vec::with_capacity(n_tensors);
        for _ in 0..n_tensors {
            let name = r.string()?;
            let n_dims = r.u32()? as usize;
            if n_dims == 0 || n_dims > 4 {
                return Err(Error::invalid_model(format!("tensor {name} has {n_dims} dimensions")));
            }
            let mut dims = Vec::with_capacity(n_dims);
            for _ in 0..n_dims {
                dims.push(usize::try_from(r.u64()?).map_err(|_| Error::invalid_model("tensor dim too large"))?);
            }
            let ty = r.u32()?;
            let offset = r.u64()?;
            raw.push((name, dims, ty, offset));
        }
        let alignment = match metadata.get("general.alignment") {
            Some(v) => v.as_u64().filter(|a| a.is_power_of_two()).ok_or_else(|| {
                Error::invalid_model("general.alignment is not a power of two")
            })?,
            None => DEFAULT_ALIGNMENT,
        };
        let data_start = (r.pos as u64).div_ceil(alignment) * alignment;
        let mut tensors = Vec::with_capacity(raw.len());
        for (name, dims, ty, offset) in raw {
            let dtype = DType::from_ggml(ty)
                .map_err(|e| Error::invalid_model(format!("tensor {name}: {e}")))?;
            let n = dims
                .iter()
                .try_fold(1usize, |a, &d| a.checked_mul(d))
                .ok_or_else(|| Error::invalid_model(format!("tensor {name}: size overflows")))?;
            if dims[0] % dtype.block_size() != 0 {
                return Err(Error::invalid_model(format!(
                    "tensor {name}: row of {} values is not a whole number of {:?} blocks",
                    dims[0], dtype
                )));
            }
            let bytes = dtype.bytes_for(n).map_err(|e| Error::invalid_model(format!("tensor {name}: {e}")))?;
            let start = data_start.checked_add(offset).and_then(|s| usize::try_from(s).ok());
            let range = start
                .and_then(|s| s.checked_add(bytes).map(|e| s..e))
                .filter(|r| r.end <= buf.len())
                .ok_or_else(|| {
                    Error::invalid_model(format!(
                        "tensor {name} ({bytes} bytes at offset {offset}) extends past the end of the file ({} bytes); the file is truncated or corrupt",
                        buf.len()
                    ))
                })?;
            tensors.push(TensorInfo { name, dims, dtype, range });
        }
        Ok(Gguf { version, metadata, tensors })
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    pub fn get_u64(&self, key: &str) -> Result<u64> {
        self.get(key)
            .and_then(Value::as_u64)
            .ok_or_else(|| Error::invalid_model(format!("GGUF metadata {key} missing or not an integer")))
    }

    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Value::as_str)
    }

    /// A string array, e.g. `tokenizer.ggml.tokens`.
    pub fn get_strings(&self, key: &str) -> Result<Vec<&str>> {
        let arr = self
            .get(key)
            .and_then(Value::as_array)
            .ok_or_else(|| Error::Tokenizer(format!("GGUF metadata {key} missing")))?;
        arr.iter()
            .map(|v| v.as_str().ok_or_else(|| Error::Tokenizer(format!("{key} holds a non-string"))))
            .collect()
    }
}
