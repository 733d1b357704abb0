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
use crate::model::split;
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

/// A model arriving into `B`: feed it the bytes of its file (or of each part of a split model,
/// [`crate::model::split`]) in order with [`GgufStream::push_to`], then take the model with
/// [`GgufStream::finish`].
///
/// The model is planned once every part's header is read, so each part's first bytes are pushed
/// before any part's rest: push each part until [`GgufStream::needs_header`] says no, then each
/// part's remaining bytes, part after part. Until then a part's bytes are held (a header and
/// the rest of the piece that completed it).
pub struct GgufStream<B: Backend> {
    backend: B,
    parts: Vec<Part>,
    /// The part whose bytes are being read, once the tensors are.
    current: usize,
    state: State<B>,
}

struct Part {
    /// What errors call it: a file name, or "the model file".
    name: String,
    /// Its length, where it was announced.
    len: Option<u64>,
    /// Bytes pushed so far.
    pos: u64,
    /// Its bytes held until the model is planned, and how many there were at the last try of its
    /// header.
    held: Vec<u8>,
    tried: usize,
    header: Option<Gguf>,
}

/// Part `p`'s byte `i` sits at `(p << PART_SHIFT) + i` in the one space of offsets the tensors
/// are read in: the tensors of every part sort in the order they arrive.
const PART_SHIFT: u32 = 48;

fn offset(part: usize, at: u64) -> u64 {
    ((part as u64) << PART_SHIFT) + at
}

enum State<B: Backend> {
    /// Some part's header is still to come.
    Headers,
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
    /// A stream of one file of `file_len` bytes (`None`: not announced) onto `backend`.
    pub fn new(backend: B, file_len: Option<u64>) -> Self {
        Self::with_parts(backend, vec![("the model file".into(), file_len)])
    }

    /// A stream of a split model's parts, each named (for errors) and with its length where
    /// announced, in order.
    pub fn with_parts(backend: B, parts: Vec<(String, Option<u64>)>) -> Self {
        let parts = parts
            .into_iter()
            .map(|(name, len)| Part { name, len, pos: 0, held: Vec::new(), tried: 0, header: None })
            .collect();
        GgufStream { backend, parts, current: 0, state: State::Headers }
    }

    /// Bytes pushed so far, of all parts.
    pub fn received(&self) -> u64 {
        self.parts.iter().map(|p| p.pos).sum()
    }

    /// Whether part `part`'s header is still to come (its first bytes are wanted before any
    /// part's rest).
    pub fn needs_header(&self, part: usize) -> bool {
        matches!(self.state, State::Headers) && self.parts.get(part).is_some_and(|p| p.header.is_none())
    }

    /// The next bytes of a one-file stream.
    pub fn push(&mut self, chunk: &[u8]) -> Result<()> {
        self.push_to(0, chunk)
    }

    /// The next bytes of part `part`. An error leaves the stream failed: drop it.
    pub fn push_to(&mut self, part: usize, chunk: &[u8]) -> Result<()> {
        let n = self.parts.len();
        let p = self.parts.get_mut(part).ok_or_else(|| Error::invalid_model(format!("the model has {n} files, not {}", part + 1)))?;
        let end = p.pos + chunk.len() as u64;
        if let Some(len) = p.len.filter(|&len| end > len) {
            return Err(Error::invalid_model(format!("{} is longer than its announced {len} bytes", p.name)));
        }
        let at = p.pos;
        p.pos = end;
        if let State::Tensors(t) = &mut self.state {
            if part < self.current {
                return Err(Error::invalid_model(format!("{} arrived after a later part began", self.parts[part].name)));
            }
            while self.current < part {
                let done = &self.parts[self.current];
                if done.len.is_some_and(|len| len != done.pos) {
                    return Err(Error::invalid_model(format!("{}'s bytes arrived before {} was whole", self.parts[part].name, done.name)));
                }
                self.current += 1;
                let held = std::mem::take(&mut self.parts[self.current].held);
                t.feed(&self.backend, &self.parts, offset(self.current, 0), &held)?;
            }
            return t.feed(&self.backend, &self.parts, offset(part, at), chunk);
        }
        let p = &mut self.parts[part];
        if p.held.len() + chunk.len() > MAX_HEADER {
            return Err(Error::invalid_model(format!("{}: the GGUF header is larger than {} MB", p.name, MAX_HEADER >> 20)));
        }
        p.held.extend_from_slice(chunk);
        let whole = p.len == Some(end);
        if p.header.is_some() || (!whole && p.held.len() < (p.tried * 2).max(FIRST_HEADER_TRY)) {
            return Ok(());
        }
        p.tried = p.held.len();
        p.header = Gguf::parse_prefix(&p.held, p.len.unwrap_or(1 << PART_SHIFT)).map_err(|e| split::in_file(&p.name, n, e))?;
        self.plan_when_ready()
    }

    /// Plan the model once every part's header has been read, and feed the first part's bytes.
    fn plan_when_ready(&mut self) -> Result<()> {
        if self.parts.iter().any(|p| p.header.is_none()) {
            return Ok(());
        }
        let headers = self.parts.iter_mut().map(|p| (p.name.clone(), p.header.take().expect("checked above"))).collect();
        let (mut g, part_of) = split::merge(headers)?;
        for (info, &p) in g.tensors.iter_mut().zip(&part_of) {
            info.range = offset(p, info.range.start)..offset(p, info.range.end);
        }
        let mut t = Box::new(Tensors::plan(g)?);
        let held = std::mem::take(&mut self.parts[0].held);
        t.feed(&self.backend, &self.parts, 0, &held)?;
        self.state = State::Tensors(t);
        Ok(())
    }

    /// The model, once every tensor it uses has arrived.
    pub fn finish(mut self) -> Result<StreamedModel<B>> {
        // A part of no announced length that ended before its header was tried: it is all here.
        if matches!(self.state, State::Headers) {
            let n = self.parts.len();
            for p in self.parts.iter_mut().filter(|p| p.header.is_none() && p.len.is_none()) {
                p.header = Some(Gguf::parse(&p.held).map_err(|e| split::in_file(&p.name, n, e))?);
            }
            self.plan_when_ready()?;
        }
        let t = match &mut self.state {
            State::Headers => {
                let p = self.parts.iter().find(|p| p.header.is_none()).expect("a header is missing");
                return Err(truncated(p, "inside its header"));
            }
            State::Tensors(t) => t,
        };
        // Parts after the last one pushed to, which arrived whole with their headers.
        while self.current + 1 < self.parts.len() {
            self.current += 1;
            let held = std::mem::take(&mut self.parts[self.current].held);
            t.feed(&self.backend, &self.parts, offset(self.current, 0), &held)?;
        }
        if let Some(&i) = t.order.get(t.done) {
            let info = &t.infos[i];
            return Err(truncated(part_of(&self.parts, info), &format!("before tensor {}", info.name)));
        }
        // A download cut short past the last tensor is cut short all the same.
        if let Some(p) = self.parts.iter().find(|p| p.len.is_some_and(|len| len != p.pos)) {
            return Err(truncated(p, "after its last tensor"));
        }
        let State::Tensors(t) = self.state else { unreachable!("matched above") };
        let Tensors { parts, loaded, kept, .. } = *t;
        let (weights, tokenizer, chat_template) = parts.with_rope(|r| Ok(r.resolve(&kept[&r.index])))?;
        let weights: ModelWeights<B::Weight> = weights.try_map(|r| Ok(loaded[r].clone()))?;
        Ok(StreamedModel { model: Transformer::from_loaded(self.backend, weights), tokenizer, chat_template })
    }
}

fn truncated(p: &Part, what: &str) -> Error {
    let of = p.len.map_or(String::new(), |len| format!(" of {len}"));
    Error::invalid_model(format!("{} is truncated: {} bytes{of} arrived, {what}", p.name, p.pos))
}

/// The part a tensor's bytes lie in.
fn part_of<'a>(parts: &'a [Part], info: &TensorInfo) -> &'a Part {
    &parts[(info.range.start >> PART_SHIFT) as usize]
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

    /// Bytes `at..` of the stream's offsets (see [`offset`]).
    fn feed(&mut self, backend: &B, files: &[Part], mut at: u64, mut chunk: &[u8]) -> Result<()> {
        while let Some(&i) = self.order.get(self.done) {
            let range = self.infos[i].range.clone();
            let filled = range.start + self.current.len() as u64;
            let end = at + chunk.len() as u64;
            if end <= filled {
                return Ok(());
            }
            // Bytes of a later part while this tensor is unfinished: its part ended short.
            if at > filled {
                return Err(truncated(part_of(files, &self.infos[i]), &format!("before tensor {}", self.infos[i].name)));
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
