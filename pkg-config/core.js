// The part of the package that runs where the engine lives: in the engine and draft Web Workers
// in a browser, or inline in Node. It picks and starts the build of the library (with the threads
// build, its pool of compute threads), fills model buffers as bytes arrive, converts options, and
// turns wasm errors into SaguaroErrors.
import { LIMITS } from './contract.generated.js';
import { chunksOf, openUrl, storeFor } from './storage.js';

const isNode = typeof process !== 'undefined' && !!process.versions?.node;
let ready = null;
/** The loaded build's bindings: ModelBuffer, ModelStream (builds with WebGPU), WasmDraft, WasmEngine. */
let wasm = null;
/** Rejects once a panic has stopped the wasm instance: the call it cut short never settles. */
let stopped = null;

/** `call`'s promise, or the panic that stops the engine midway through it. */
function unlessStopped(call) {
  return Promise.race([call, stopped]);
}

/** A module whose one function runs `i32x4.relaxed_dot_i8x16_i7x16_add_s` on three zero vectors:
 * it validates where the engine runs relaxed SIMD. */
const RELAXED_SIMD_PROBE = new Uint8Array([
  0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, // magic, version
  0x01, 0x05, 0x01, 0x60, 0x00, 0x01, 0x7b, // types: () -> v128
  0x03, 0x02, 0x01, 0x00, // one function of type 0
  0x0a, 0x3d, 0x01, 0x3b, 0x00, // code: one body of 59 bytes, no locals
  ...[0, 1, 2].flatMap(() => [0xfd, 0x0c, ...new Array(16).fill(0)]), // v128.const 0, three times
  0xfd, 0x93, 0x02, // i32x4.relaxed_dot_i8x16_i7x16_add_s
  0x0b, // end
]);

/** Whether this engine runs relaxed SIMD, and so the build of the library compiled for it. */
export function relaxedSimd() {
  return WebAssembly.validate(RELAXED_SIMD_PROBE);
}

/** Whether wasm memory can be shared with other threads here: SharedArrayBuffer exists (on the
 * web only on a cross-origin isolated page, one served with COOP and COEP headers). */
export function canShareMemory() {
  return typeof SharedArrayBuffer !== 'undefined' && (isNode || globalThis.crossOriginIsolated === true);
}

/** Instantiate the build of the library this engine runs best, beside this file (once per worker
 * or process: the first call's `threads` decides): with `threads` > 1 where memory can be shared,
 * the threads build (simd128, atomics, shared memory) with a pool of as many threads; else the
 * relaxed-SIMD build where relaxed SIMD validates, else the simd128 one. */
export function initWasm(threads = 1) {
  ready ??= (async () => {
    let glue = null;
    // Other values of `threads` are the engine's to refuse (with the other options).
    if (Number.isInteger(threads) && threads > 1 && threads <= LIMITS.maxThreads && canShareMemory()) {
      try {
        glue = await startThreads(threads);
      } catch (e) {
        console.warn(`saguaro: the threads build did not start (${e?.message ?? e}), so the CPU backend runs on one thread`);
      }
    }
    if (!glue) {
      const name = relaxedSimd() ? 'saguaro_relaxed' : 'saguaro';
      glue = name === 'saguaro' ? await import('./saguaro.js') : await import('./saguaro_relaxed.js');
      await instantiate(glue, name);
    }
    stopped = new Promise((_, reject) => {
      glue.onPanic((msg) => reject(new SaguaroError('internal', `the engine stopped at an internal error (${msg}): load it again`)));
    });
    stopped.catch(() => {});
    wasm = glue;
  })();
  return ready;
}

/** Instantiate `glue`'s module (`name`_bg.wasm, beside this file), on `memory` if given. */
async function instantiate(glue, name, memory) {
  const url = new URL(`./${name}_bg.wasm`, import.meta.url);
  if (isNode) {
    const { readFile } = await import('node:fs/promises');
    glue.initSync({ module: await readFile(url), memory });
  } else {
    await glue.default({ module_or_path: url, memory });
  }
}

/** The threads build, with its pool started: this thread and `threads - 1` workers (Web Workers,
 * or worker threads in Node), each an instance of the module on the same memory. */
async function startThreads(threads) {
  const glue = await import('./saguaro_threads.js');
  await instantiate(glue, 'saguaro_threads');
  const { module, memory, size } = glue.threadsStart(threads);
  const started = await Promise.allSettled(Array.from({ length: size - 1 }, () => (isNode ? nodeThread(module, memory) : webThread(module, memory))));
  const failed = started.find((s) => s.status === 'rejected');
  if (failed) {
    // The ones that did start stop too: the pool is left unused, the single-thread build loaded.
    for (const s of started) s.value?.terminate();
    throw failed.reason;
  }
  return glue;
}

/** A compute thread: a Web Worker (engine-worker.js in its `thread` role) on `memory`. */
function webThread(module, memory) {
  const worker = new Worker(new URL('./engine-worker.js', import.meta.url), { type: 'module', name: 'saguaro-thread' });
  const started = new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('a compute thread did not start within 30 s')), 30_000);
    worker.onmessage = (e) => {
      clearTimeout(timer);
      if (e.data?.type === 'thread-ready') resolve(worker);
      else reject(new Error(e.data?.error ?? 'a compute thread did not start'));
    };
    worker.onerror = (e) => {
      clearTimeout(timer);
      reject(new Error(`a compute thread failed: ${e.message ?? 'worker error'}`));
    };
  });
  worker.postMessage({ type: 'thread', module, memory });
  started.catch(() => worker.terminate());
  return started;
}

/** A compute thread in Node: a worker thread (unref'd: it never keeps the process alive). */
async function nodeThread(module, memory) {
  const { Worker } = await import('node:worker_threads');
  const code = `const { parentPort, workerData: d } = require('node:worker_threads');
import(d.glue).then((g) => {
  g.initSync({ module: d.module, memory: d.memory });
  parentPort.postMessage('ready');
  try { g.threadsWorker(); } catch { try { g.threadsFailed(); } catch {} }
}, (e) => parentPort.postMessage(String(e?.message ?? e)));`;
  const glue = new URL('./saguaro_threads.js', import.meta.url).href;
  const worker = new Worker(code, { eval: true, workerData: { glue, module, memory } });
  const started = new Promise((resolve, reject) => {
    worker.once('message', (m) => {
      if (m !== 'ready') return reject(new Error(`a compute thread did not start: ${m}`));
      worker.unref();
      resolve(worker);
    });
    worker.once('error', reject);
  });
  started.catch(() => worker.terminate());
  return started;
}

/** A compute thread's life, in the Web Worker `webThread` started: instantiate the threads build
 * on the memory it was sent, then work the pool's jobs (this never returns). */
export async function runThread({ module, memory }) {
  try {
    const glue = await import('./saguaro_threads.js');
    await glue.default({ module_or_path: module, memory });
    self.postMessage({ type: 'thread-ready' });
    try {
      glue.threadsWorker();
    } catch (e) {
      // A trap (a panic has closed this worker already): the job in progress fails.
      glue.threadsFailed();
      throw e;
    }
  } catch (e) {
    self.postMessage({ type: 'thread-failed', error: String(e?.message ?? e) });
    self.close();
  }
}

export class SaguaroError extends Error {
  constructor(code, message) {
    super(message);
    this.name = 'SaguaroError';
    this.code = code;
  }
}

/** A plain {code, message} for postMessage, from anything thrown. */
export function errorInfo(e) {
  if (e && typeof e === 'object' && typeof e.code === 'string') return { code: e.code, message: e.message };
  if (e && e.name === 'AbortError') return { code: 'aborted', message: 'generation aborted' };
  return { code: 'internal', message: String(e?.message ?? e) };
}

/** Hold the Web Lock `name` until this worker ends, for whoever waits on it to learn of that
 * (a worker that is closed, terminated or crashes sends no message). Resolves once it is held. */
export function holdLock(name) {
  if (!name || !globalThis.navigator?.locks) return Promise.resolve();
  return new Promise((held) => {
    navigator.locks.request(name, () => {
      held();
      return new Promise(() => {});
    });
  });
}

/** Call `then` once the worker holding the Web Lock `name` has ended. */
export function whenLockFree(name, then) {
  if (name && globalThis.navigator?.locks) navigator.locks.request(name, () => then());
}

const CHUNK = 1 << 22;

/** The files of a model source: a split model's parts (from its first part's name), or one. */
function filesOf(source) {
  if (typeof source === 'string') return wasm.splitParts(source) ?? [source];
  if (source instanceof URL) return filesOf(source.href);
  return [source];
}

/** Bytes of a model file, as a stream of Uint8Arrays with a known total when there is one: a URL
 * (or Hugging Face name) through `store` ([`openUrl`]), or bytes in hand. */
async function open(source, { store, hub, role }) {
  if (source instanceof Uint8Array || source instanceof ArrayBuffer || ArrayBuffer.isView(source)) {
    const bytes = source instanceof ArrayBuffer ? new Uint8Array(source) : new Uint8Array(source.buffer, source.byteOffset, source.byteLength);
    return {
      total: bytes.byteLength,
      fromCache: false,
      async *chunks() {
        for (let i = 0; i < bytes.byteLength; i += CHUNK) yield bytes.subarray(i, Math.min(i + CHUNK, bytes.byteLength));
      },
    };
  }
  if (typeof Blob !== 'undefined' && source instanceof Blob) {
    return { total: source.size, fromCache: false, chunks: () => source.stream() };
  }
  if (typeof source !== 'string') {
    throw new SaguaroError('invalid_argument', `${role}: expected a URL, a Blob/File, an ArrayBuffer or a Uint8Array`);
  }
  return openUrl(source, { store, hub, role });
}

/** Each file of `source` opened in turn, with its name and progress reporter. */
async function* openFiles(source, { role, onProgress, cache, hub }) {
  const store = await storeFor(cache);
  const files = filesOf(source);
  for (const [i, file] of files.entries()) {
    const src = await open(file, { store, hub, role });
    const name = typeof file === 'string' ? file : undefined;
    const parts = files.length > 1 ? { part: i + 1, parts: files.length } : {};
    const progress = (loaded) => onProgress?.({ phase: 'download', role, loaded, total: src.total, fromCache: src.fromCache, ...parts });
    yield { src, name, progress };
  }
}

/** Read a model source into wasm memory piece by piece, reporting progress; a split model's
 * parts one after the other. */
export async function readModel(source, opts) {
  let buffer = null;
  for await (const { src, name, progress } of openFiles(source, opts)) {
    const room = (len) => (buffer ? buffer.nextPart(len, name) : (buffer = new wasm.ModelBuffer(len, name)));
    let loaded = 0;
    if (src.total) {
      room(src.total);
      for await (const chunk of chunksOf(src.chunks())) {
        buffer.push(chunk);
        loaded += chunk.byteLength;
        progress(loaded);
      }
    } else {
      // No announced length: gather the pieces first (only servers that omit Content-Length).
      const pieces = [];
      for await (const chunk of chunksOf(src.chunks())) {
        pieces.push(chunk);
        loaded += chunk.byteLength;
        progress(loaded);
      }
      room(loaded);
      for (const p of pieces) buffer.push(p);
    }
  }
  return buffer;
}

/** Stream a target bound for WebGPU onto the GPU as it downloads: each tensor goes to its GPU
 * buffer once it has arrived, so wasm memory never holds the whole file (a model larger than
 * wasm32's 4 GiB loads). A split model's parts are opened together: each part's header is read
 * first, then each part's rest in order. `opts`: the load options as the wasm side takes them. */
export async function streamModel(source, opts, read) {
  const files = [];
  for await (const f of openFiles(source, read)) files.push({ ...f, it: chunksOf(f.src.chunks()), loaded: 0 });
  const names = files.map((f, i) => f.name ?? `file ${i + 1}`);
  const stream = await wasm.ModelStream.open(files.map((f) => f.src.total ?? 0), names, opts);
  const push = (i, chunk) => {
    const f = files[i];
    stream.push(i, chunk);
    f.loaded += chunk.byteLength;
    f.progress(f.loaded);
  };
  try {
    for (const [i, f] of files.entries()) {
      while (stream.needsHeader(i)) {
        const { done, value } = await f.it.next();
        if (done) break;
        push(i, value);
      }
    }
    for (const [i, f] of files.entries()) for await (const chunk of { [Symbol.asyncIterator]: () => f.it }) push(i, chunk);
  } catch (e) {
    stream.free();
    throw e;
  } finally {
    // Files left unread (a refused model) end their downloads, and store nothing.
    for (const f of files) await f.it.return();
  }
  return stream;
}

/** Load options as the wasm side takes them: all but those this package handles itself. The
 * wasm side knows the option names and refuses any other (src/contract/options.rs). */
export function engineOptions(opts, modes) {
  const { onProgress, cache, hub, persist, ...rest } = opts;
  return { ...rest, modes };
}

/** A target on a server: `{ server: 'http://HOST:PORT', ... }` rather than a model file. */
export function isServer(source) {
  return typeof source === 'object' && source !== null && Object.getPrototypeOf(source) === Object.prototype && 'server' in source;
}

/** Load the engine with local drafts for `modes`; `requested` (default `modes`) are all the modes
 * the caller asked for, some of which a draft worker serves: their names are checked here too. */
export async function loadEngine(target, draft, opts, modes, onProgress, requested = modes) {
  await initWasm(opts.threads);
  // Bad options fail before any model is downloaded.
  wasm.WasmEngine.checkOptions(engineOptions(opts, requested));
  if (isServer(target)) {
    wasm.WasmEngine.checkServer(target);
    if (!draft) throw new SaguaroError('invalid_argument', 'a server target needs a draft model here: give { target: { server }, draft }');
    const d = await readModel(draft, { role: 'draft', onProgress, cache: opts.cache, hub: opts.hub });
    return unlessStopped(wasm.WasmEngine.loadRemote(target, d, engineOptions(opts, modes)));
  }
  // Several sequences at once share one batch: the target is read whole first (wasm.WasmPool).
  if ((opts.parallel ?? 1) > 1) {
    const t = await readModel(target, { role: 'target', onProgress, cache: opts.cache, hub: opts.hub });
    const d = draft ? await readModel(draft, { role: 'draft', onProgress, cache: opts.cache, hub: opts.hub }) : undefined;
    return unlessStopped(wasm.WasmPool.load(t, d, engineOptions(opts, modes)));
  }
  // A WebGPU target goes to the GPU as it downloads; a CPU target computes on its bytes in wasm memory.
  const streamed = opts.backend === 'gpu' && !!wasm.ModelStream;
  const t = streamed
    ? await streamModel(target, engineOptions(opts, modes), { role: 'target', onProgress, cache: opts.cache, hub: opts.hub })
    : await readModel(target, { role: 'target', onProgress, cache: opts.cache, hub: opts.hub });
  const d = draft ? await readModel(draft, { role: 'draft', onProgress, cache: opts.cache, hub: opts.hub }) : undefined;
  onProgress?.({ phase: 'upload', role: 'target', loaded: 0, total: 1 });
  const o = engineOptions(opts, modes);
  const engine = await unlessStopped(streamed ? wasm.WasmEngine.loadStreamed(t, d, o) : wasm.WasmEngine.load(t, d, o));
  onProgress?.({ phase: 'upload', role: 'target', loaded: 1, total: 1 });
  return engine;
}

export async function loadDraft(source, opts, onProgress) {
  await initWasm(opts.threads);
  wasm.WasmEngine.checkOptions(engineOptions(opts, []));
  const buf = await readModel(source, { role: 'draft', onProgress, cache: opts.cache, hub: opts.hub });
  return unlessStopped(wasm.WasmDraft.load(buf, engineOptions(opts, [])));
}

/** Run one generation; `onText(piece)` streams text, `aborted()` is polled once per round.
 * `opts` go to the engine as given: it checks them. */
export async function generate(engine, prompt, opts, onText, aborted) {
  return unlessStopped(
    engine.generate(prompt, opts, (piece, tokens) => {
      if (piece || tokens) onText?.(piece, tokens);
      return !aborted();
    }),
  );
}
