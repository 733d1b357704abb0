//! A GGUF model loaded as its bytes arrive: the header first, then each tensor, handed to the
//! backend the moment it is whole and dropped, so that only the tensor being read is ever held
//! in memory. On the GPU this is how a model larger than wasm32's 4 GiB of memory loads in a
//! browser: its weights go from the download (or the Cache API) straight into GPU buffers.
//!
//! The tensors are taken as references ([`TensorRef`]) while the model is assembled from the
//! header, by the same code that assembles a file held whole ([`gguf_parts`]); each reference is
//! resolved against its tensor's bytes when they arrive.

use std::collections::HashMap;
use std::ops::Range;

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::model::gguf::{Gguf, TensorInfo};
use crate::model::load::{gguf_parts, unpermute_qk, GgufParts, Tensor};
use crate::model::tokenizer::Tokenizer;
use crate::model::transformer::{check_head, Transformer};
use crate::model::weights::ModelWeights;
use crate::storage::{Bytes, Weight};

/// The header is parsed again each time the bytes held have doubled, from this many on.
const FIRST_HEADER_TRY: usize = 1 << 20;
/// A header larger than this is refused (real ones, vocabularies included, take a few MB).
const MAX_HEADER: usize = 256 << 20;

/// Rows of a tensor of the file, as the model uses them.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct TensorRef {
    /// The tensor's index in the header.
    index: usize,
    rows: Range<usize>,
    cols: usize,
    /// Q/K rows to un-interleave for this many heads.
    heads: Option<usize>,
}

impl Tensor for TensorRef {
    fn shape(&self) -> (usize, usize) {
        (self.rows.len(), self.cols)
    }
    fn rows_view(&self, rows: Range<usize>) -> Self {
        let start = self.rows.start + rows.start;
        TensorRef { rows: start..start + rows.len(), ..self.clone() }
    }
    fn unpermuted(&self, n_heads: usize) -> Self {
        TensorRef { heads: Some(n_heads), ..self.clone() }
    }
}

impl TensorRef {
    /// These rows of `whole`, the tensor's bytes.
    fn resolve(&self, whole: &Weight) -> Weight {
        let w = match self.rows == (0..whole.rows) {
            true => whole.clone(),
            false => whole.rows_view(self.rows.clone()),
        };
        match self.heads {
            Some(h) => unpermute_qk(&w, h),
            None => w,
        }
    }
}

/// A model arriving into `B`: feed it the file's bytes in order with [`GgufStream::push`], then
/// take the model with [`GgufStream::finish`].
pub struct GgufStream<B: Backend> {
    backend: B,
    /// The file's length, where it was announced.
    file_len: Option<u64>,
    /// Bytes pushed so far.
    pos: u64,
    state: State<B>,
}

enum State<B: Backend> {
    /// The header's bytes so far, and how many there were at the last try.
    Header { bytes: Vec<u8>, tried: usize },
    Tensors(Box<Tensors<B>>),
}

/// The tensor phase: the model as references, and the weights loaded so far.
struct Tensors<B: Backend> {
    parts: GgufParts<TensorRef>,
    infos: Vec<TensorInfo>,
    /// The tensors the model uses, in file order, and how many of them are done.
    order: Vec<usize>,
    done: usize,
    /// The bytes of `order[done]`, as far as they arrived.
    current: Vec<u8>,
    /// What each tensor serves.
    uses: HashMap<usize, Vec<TensorRef>>,
    loaded: HashMap<TensorRef, B::Weight>,
    /// Tensors read on the CPU (RoPE factors), kept.
    kept: HashMap<usize, Weight>,
}

/// What the stream loaded: the model on its backend, and how to talk to it.
pub struct StreamedModel<B: Backend> {
    pub model: Transformer<B>,
    pub tokenizer: Tokenizer,
    pub chat_template: Option<String>,
}

impl<B: Backend> GgufStream<B> {
    /// A stream of a file of `file_len` bytes (`None`: not announced) onto `backend`.
    pub fn new(backend: B, file_len: Option<u64>) -> Self {
        GgufStream { backend, file_len, pos: 0, state: State::Header { bytes: Vec::new(), tried: 0 } }
    }

    /// Bytes pushed so far.
    pub fn received(&self) -> u64 {
        self.pos
    }

    /// The next bytes of the file. An error leaves the stream failed: drop it.
    pub fn push(&mut self, chunk: &[u8]) -> Result<()> {
        let end = self.pos + chunk.len() as u64;
        if let Some(len) = self.file_len.filter(|&len| end > len) {
            return Err(Error::invalid_model(format!("the model is longer than its announced {len} bytes")));
        }
        let at = self.pos;
        self.pos = end;
        match &mut self.state {
            State::Tensors(t) => t.feed(&self.backend, at, chunk),
            State::Header { bytes, tried } => {
                if bytes.len() + chunk.len() > MAX_HEADER {
                    return Err(Error::invalid_model(format!("the GGUF header is larger than {} MB", MAX_HEADER >> 20)));
                }
                bytes.extend_from_slice(chunk);
                let whole = self.file_len == Some(end);
                if !whole && bytes.len() < (*tried * 2).max(FIRST_HEADER_TRY) {
                    return Ok(());
                }
                *tried = bytes.len();
                let Some(g) = Gguf::parse_prefix(bytes, self.file_len.unwrap_or(u64::MAX))? else { return Ok(()) };
                let bytes = std::mem::take(bytes);
                let mut t = Box::new(Tensors::plan(g)?);
                t.feed(&self.backend, 0, &bytes)?;
                self.state = State::Tensors(t);
                Ok(())
            }
        }
    }

    /// The model, once every tensor it uses has arrived.
    pub fn finish(mut self) -> Result<StreamedModel<B>> {
        // A file of no announced length that ended before the header was tried: it is all here.
        if let (None, State::Header { bytes, .. }) = (self.file_len, &mut self.state) {
            let bytes = std::mem::take(bytes);
            let mut t = Box::new(Tensors::plan(Gguf::parse(&bytes)?)?);
            t.feed(&self.backend, 0, &bytes)?;
            self.state = State::Tensors(t);
        }
        let truncated = |what: &str| {
            let of = self.file_len.map_or(String::new(), |len| format!(" of {len}"));
            Error::invalid_model(format!("the model file is truncated: {} bytes{of} arrived, {what}", self.pos))
        };
        let t = match self.state {
            State::Header { .. } => return Err(truncated("inside its header")),
            State::Tensors(t) => t,
        };
        if t.done < t.order.len() {
            return Err(truncated(&format!("before tensor {}", t.infos[t.order[t.done]].name)));
        }
        // A download cut short past the last tensor is cut short all the same.
        if self.file_len.is_some_and(|len| len != self.pos) {
            return Err(truncated("after its last tensor"));
        }
        let Tensors { parts, loaded, kept, .. } = *t;
        let (weights, tokenizer, chat_template) = parts.with_rope(|r| Ok(r.resolve(&kept[&r.index])))?;
        let weights: ModelWeights<B::Weight> = weights.try_map(|r| Ok(loaded[r].clone()))?;
        Ok(StreamedModel { model: Transformer::from_loaded(self.backend, weights), tokenizer, chat_template })
    }
}

impl<B: Backend> Tensors<B> {
    fn plan(g: Gguf) -> Result<Self> {
        let parts = gguf_parts(&g, |index, _, (rows, cols)| Ok(TensorRef { index, rows: 0..rows, cols, heads: None }))?;
        check_head(&parts.weights)?;
        let mut uses: HashMap<usize, Vec<TensorRef>> = HashMap::new();
        parts.weights.try_map(|r| {
            let refs = uses.entry(r.index).or_default();
            if !refs.contains(r) {
                refs.push(r.clone());
            }
            Ok(())
        })?;
        let keep = parts.factors.iter().chain(parts.long.as_ref().map(|(w, _)| w)).map(|r| r.index);
        let mut order: Vec<usize> = uses.keys().copied().chain(keep).collect();
        order.sort_unstable_by_key(|&i| (g.tensors[i].range.start, i));
        order.dedup();
        // Streamed in file order, each tensor's bytes once: overlapping tensors cannot be.
        for w in order.windows(2) {
            let (a, b) = (&g.tensors[w[0]], &g.tensors[w[1]]);
            if b.range.start < a.range.end {
                return Err(Error::invalid_model(format!("GGUF tensors {} and {} overlap", a.name, b.name)));
            }
        }
        let (loaded, kept) = (HashMap::new(), HashMap::new());
        let mut t = Tensors { parts, infos: g.tensors, order, done: 0, current: Vec::new(), uses, loaded, kept };
        t.start_next()?;
        Ok(t)
    }

    /// Room for the next tensor's bytes.
    fn start_next(&mut self) -> Result<()> {
        self.current = Vec::new();
        if let Some(&i) = self.order.get(self.done) {
            let r = &self.infos[i].range;
            let len = usize::try_from(r.end - r.start)
                .map_err(|_| Error::OutOfMemory(format!("tensor {} of {} bytes", self.infos[i].name, r.end - r.start)))?;
            self.current.try_reserve_exact(len).map_err(|_| {
                Error::OutOfMemory(format!("cannot allocate {len} bytes for tensor {}", self.infos[i].name))
            })?;
        }
        Ok(())
    }

    /// Bytes `at..` of the file.
    fn feed(&mut self, backend: &B, mut at: u64, mut chunk: &[u8]) -> Result<()> {
        while let Some(&i) = self.order.get(self.done) {
            let range = self.infos[i].range.clone();
            let filled = range.start + self.current.len() as u64;
            let end = at + chunk.len() as u64;
            if end <= filled {
                return Ok(());
            }
            // Skip what lies before the tensor's unread part (padding, tensors the model does not use).
            let skip = filled.saturating_sub(at) as usize;
            let take = ((range.end - filled).min(end - filled.max(at))) as usize;
            self.current.extend_from_slice(&chunk[skip..skip + take]);
            chunk = &chunk[skip + take..];
            at = filled + take as u64;
            if self.current.len() as u64 == range.end - range.start {
                self.complete(backend, i)?;
            }
        }
        Ok(())
    }

    /// Tensor `i` is whole: load what the model takes of it.
    fn complete(&mut self, backend: &B, i: usize) -> Result<()> {
        let info = &self.infos[i];
        let shape = (info.dims[1..].iter().product(), info.dims[0]);
        let whole = Weight::new(info.dtype, shape.0, shape.1, Bytes::from_vec(std::mem::take(&mut self.current)))?;
        for r in self.uses.remove(&i).unwrap_or_default() {
            let w = backend.load_weight(&r.resolve(&whole))?;
            self.loaded.insert(r, w);
        }
        if self.parts.factors.iter().chain(self.parts.long.as_ref().map(|(w, _)| w)).any(|r| r.index == i) {
            self.kept.insert(i, whole);
        }
        self.done += 1;
        self.start_next()
    }
}
