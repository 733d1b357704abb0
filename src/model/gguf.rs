//! GGUF (v2 and v3) parsing: metadata, tensor infos and alignment, with every size checked
//! against the file so a corrupt or truncated file is an error, never a panic or a huge allocation.

use std::collections::HashMap;
use std::ops::Range;

use crate::error::{Error, Result};
use crate::storage::quant::DType;

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
    /// Absolute byte range in the file (u64: a file streamed into wasm32 may exceed its address
    /// space).
    pub range: Range<u64>,
}

#[derive(Debug)]
pub struct Gguf {
    pub version: u32,
    pub metadata: HashMap<String, Value>,
    pub tensors: Vec<TensorInfo>,
    /// Where the tensor data starts: the header's length, padded to the alignment.
    pub data_start: u64,
}

/// Sane bounds beyond what the file's length allows, so that a small hostile file cannot make
/// the parser allocate far more than it reads (a `Value` is larger than the byte it came from).
/// Real models stay far below them: ~300 tensors per 30 layers, ~30 metadata keys, 152k-token
/// vocabularies.
const MAX_TENSORS: u64 = 1 << 16;
const MAX_METADATA: u64 = 1 << 16;
const MAX_ARRAY_LEN: u64 = 1 << 22;
const MAX_ALIGNMENT: u64 = 1 << 16;

/// Reads the header from `buf`, the first bytes of a file of `file_len` bytes.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    file_len: u64,
    /// Set when a read ran past `buf` but not past the file: more of the file would tell.
    short: bool,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, field: &dyn Fn() -> String) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e as u64 <= self.file_len).ok_or_else(|| {
            Error::invalid_model(format!(
                "GGUF file truncated: {} needs {n} bytes at offset {} of {}",
                field(),
                self.pos,
                self.file_len
            ))
        })?;
        if end > self.buf.len() {
            self.short = true;
            return Err(Error::invalid_model(format!("GGUF header longer than the {} bytes read", self.buf.len())));
        }
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn arr<const N: usize>(&mut self, field: &dyn Fn() -> String) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N, field)?);
        Ok(a)
    }
    fn u32(&mut self, field: &dyn Fn() -> String) -> Result<u32> {
        Ok(u32::from_le_bytes(self.arr(field)?))
    }
    fn u64(&mut self, field: &dyn Fn() -> String) -> Result<u64> {
        Ok(u64::from_le_bytes(self.arr(field)?))
    }
    /// A count of items of at least `min_item_bytes` each, refused before anything is allocated
    /// when the bytes left cannot hold that many or it exceeds `max`.
    fn count(&mut self, min_item_bytes: usize, max: u64, field: &dyn Fn() -> String) -> Result<usize> {
        let n = self.u64(field)?;
        let left = self.file_len - self.pos as u64;
        if n.saturating_mul(min_item_bytes as u64) > left {
            return Err(Error::invalid_model(format!(
                "GGUF {} = {n} exceeds what the remaining {left} bytes of the file can hold (truncated or corrupt)",
                field()
            )));
        }
        if n > max {
            return Err(Error::invalid_model(format!("GGUF {} = {n} exceeds the limit of {max}", field())));
        }
        usize::try_from(n).map_err(|_| Error::invalid_model(format!("GGUF {} = {n} is too large", field())))
    }
    fn string(&mut self, field: &dyn Fn() -> String) -> Result<String> {
        let len_field = || format!("{} length", field());
        let n = self.count(1, u64::MAX, &len_field)?;
        let b = self.take(n, field)?;
        String::from_utf8(b.to_vec()).map_err(|_| Error::invalid_model(format!("GGUF {} is not UTF-8", field())))
    }
    /// A value of GGUF type `ty` for metadata key `key`; arrays hold scalars or strings.
    fn value(&mut self, ty: u32, key: &str, in_array: bool) -> Result<Value> {
        let field = || format!("metadata {key}");
        Ok(match ty {
            0 => Value::U8(self.arr::<1>(&field)?[0]),
            1 => Value::I8(self.arr::<1>(&field)?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.arr(&field)?)),
            3 => Value::I16(i16::from_le_bytes(self.arr(&field)?)),
            4 => Value::U32(self.u32(&field)?),
            5 => Value::I32(i32::from_le_bytes(self.arr(&field)?)),
            6 => Value::F32(f32::from_le_bytes(self.arr(&field)?)),
            7 => Value::Bool(self.arr::<1>(&field)?[0] != 0),
            8 => Value::String(self.string(&field)?),
            9 if !in_array => {
                let elem = self.u32(&|| format!("metadata {key} element type"))?;
                let size = value_size(elem).ok_or_else(|| {
                    Error::invalid_model(format!("GGUF metadata {key}: array element type {elem} unknown or nested"))
                })?;
                let n = self.count(size, MAX_ARRAY_LEN, &|| format!("metadata {key} array length"))?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.value(elem, key, true)?);
                }
                Value::Array(v)
            }
            10 => Value::U64(self.u64(&field)?),
            11 => Value::I64(i64::from_le_bytes(self.arr(&field)?)),
            12 => Value::F64(f64::from_le_bytes(self.arr(&field)?)),
            _ => return Err(Error::invalid_model(format!("GGUF metadata {key}: value type {ty} unknown or nested"))),
        })
    }
}

/// The least number of bytes a value of GGUF type `ty` occupies in an array (a string: its
/// length field); `None` for unknown types and arrays, which may not nest.
fn value_size(ty: u32) -> Option<usize> {
    Some(match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 | 10..=12 => 8,
        _ => return None,
    })
}

/// A tensor info as read, before it is checked against the data section.
struct RawTensor {
    name: String,
    dims: Vec<usize>,
    ty: u32,
    offset: u64,
}

impl Gguf {
    /// Parse the header of a GGUF file held in `buf` (the whole file, memory-mapped or read).
    pub fn parse(buf: &[u8]) -> Result<Gguf> {
        Self::parse_prefix(buf, buf.len() as u64)?
            .ok_or_else(|| Error::invalid_model("GGUF file truncated inside its header"))
    }

    /// Parse the header from `prefix`, the first bytes of a file of `file_len` bytes (one being
    /// downloaded): `None` when the header runs past `prefix`. Tensors are checked against
    /// `file_len`.
    pub fn parse_prefix(prefix: &[u8], file_len: u64) -> Result<Option<Gguf>> {
        let mut r = Reader { buf: prefix, pos: 0, file_len, short: false };
        match r.header() {
            Err(_) if r.short => Ok(None),
            parsed => parsed.map(Some),
        }
    }
}

impl Reader<'_> {
    fn header(&mut self) -> Result<Gguf> {
        let r = self;
        if r.file_len < 4 || r.take(4, &|| "magic".into())? != MAGIC {
            return Err(Error::invalid_model("not a GGUF file (bad magic)"));
        }
        let version = r.u32(&|| "version".into())?;
        if !(2..=3).contains(&version) {
            return Err(Error::Unsupported(format!("GGUF version {version} (2 and 3 are supported)")));
        }
        // The smallest tensor info: an empty name (8), one dimension (4 + 8), type (4), offset (8);
        // the smallest metadata entry: an empty key (8), type (4), a one-byte value.
        let n_tensors = r.count(32, MAX_TENSORS, &|| "tensor_count".into())?;
        let n_kv = r.count(13, MAX_METADATA, &|| "metadata_kv_count".into())?;
        let mut metadata = HashMap::with_capacity(n_kv);
        for i in 0..n_kv {
            let key = r.string(&|| format!("metadata key {i}"))?;
            let ty = r.u32(&|| format!("metadata {key} type"))?;
            let value = r.value(ty, &key, false)?;
            metadata.insert(key, value);
        }
        let mut raw = Vec::with_capacity(n_tensors);
        for i in 0..n_tensors {
            let name = r.string(&|| format!("tensor {i} name"))?;
            let field = |what: &str| format!("tensor {name} {what}");
            let n_dims = r.u32(&|| field("n_dimensions"))? as usize;
            if n_dims == 0 || n_dims > 4 {
                return Err(Error::invalid_model(format!("GGUF tensor {name} has {n_dims} dimensions (1 to 4 allowed)")));
            }
            let mut dims = Vec::with_capacity(n_dims);
            for _ in 0..n_dims {
                let d = r.u64(&|| field("dimension"))?;
                dims.push(usize::try_from(d).map_err(|_| Error::invalid_model(format!("GGUF tensor {name} dimension {d} is too large")))?);
            }
            let ty = r.u32(&|| field("type"))?;
            let offset = r.u64(&|| field("offset"))?;
            raw.push(RawTensor { name, dims, ty, offset });
        }
        let alignment = match metadata.get("general.alignment") {
            Some(v) => v.as_u64().filter(|a| a.is_power_of_two() && *a <= MAX_ALIGNMENT).ok_or_else(|| {
                Error::invalid_model(format!("GGUF metadata general.alignment = {v:?} is not a power of two up to {MAX_ALIGNMENT}"))
            })?,
            None => DEFAULT_ALIGNMENT,
        };
        let data_start = (r.pos as u64).div_ceil(alignment) * alignment;
        let tensors = raw.into_iter().map(|t| t.locate(data_start, r.file_len)).collect::<Result<_>>()?;
        Ok(Gguf { version, metadata, tensors, data_start })
    }
}

impl Gguf {
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

impl RawTensor {
    /// Check the tensor's type and size, and that its bytes lie inside the file (`file_len`
    /// bytes, data section from `data_start`).
    fn locate(self, data_start: u64, file_len: u64) -> Result<TensorInfo> {
        let RawTensor { name, dims, ty, offset } = self;
        let bad = |what: String| Error::invalid_model(format!("GGUF tensor {name}: {what}"));
        let dtype = DType::from_ggml(ty).map_err(|e| bad(e.to_string()))?;
        let n = dims
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| bad(format!("dimensions {dims:?} overflow")))?;
        if dims[0] % dtype.block_size() != 0 {
            return Err(bad(format!("row of {} values is not a whole number of {dtype:?} blocks", dims[0])));
        }
        let bytes = dtype.bytes_for(n).map_err(|e| bad(e.to_string()))?;
        let range = data_start
            .checked_add(offset)
            .and_then(|s| s.checked_add(bytes as u64).map(|e| s..e))
            .filter(|r| r.end <= file_len)
            .ok_or_else(|| {
                bad(format!(
                    "{bytes} bytes at offset {offset} extend past the end of the file ({file_len} bytes); the file is truncated or corrupt"
                ))
            })?;
        Ok(TensorInfo { name, dims, dtype, range })
    }
}
