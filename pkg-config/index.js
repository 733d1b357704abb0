// saguaro-web: the public API. In a browser the engine runs in a dedicated Web Worker (the page's
// main thread never computes) and the CPU draft of SSD (and of SD with it) in a second one; in
// Node the same API runs inline on the CPU backend. The CPU backend computes on a pool of threads
// sharing wasm memory where it can (the threads build: Node, or a cross-origin isolated page),
// else on one.
import { DEFAULTS, LIMITS } from './contract.generated.js';
import { SaguaroError, canShareMemory, errorInfo, isServer, whenLockFree } from './core.js';
import { modelCache } from './storage.js';

export { DEFAULTS, LIMITS, SaguaroError };

const isNode = typeof process !== 'undefined' && !!process.versions?.node && typeof window === 'undefined';
function defaultThreads(cores) {
  return Math.max(1, Math.min(cores || 1, DEFAULTS.threadCap));
}

function abortError(partial) {
  const e = new SaguaroError('aborted', 'generation aborted');
  e.partial = partial;
  return e;
}

function fail(info) {
  return new SaguaroError(info.code, info.message);
}

/** The values of several async iterators as each comes; leaving early ends them all. */
async function* interleave(iterators) {
  const next = (i) => iterators[i].next().then((r) => ({ r, i }));
  const pending = new Map(iterators.map((_, i) => [i, next(i)]));
  try {
    while (pending.size) {
      const { r, i } = await Promise.race(pending.values());
      if (r.done) pending.delete(i);
      else {
        pending.set(i, next(i));
        yield r.value;
      }
    }
  } finally {
    for (const i of pending.keys()) iterators[i].return?.();
  }
}

/** OpenAI's finish_reason for ours ('cancelled' never gets here: it rejects as 'aborted'). A
 * grammar that completed ends the generation as 'eos' does: 'stop'. */
const FINISH_REASONS = { eos: 'stop', max_tokens: 'length', context_full: 'length' };

/** Where a model comes from, in a form a worker can receive: a resolved URL string, a Blob, or a
 * server target's plain object. */
function transferable(source, role) {
  if (isServer(source)) return { ...source };
  if (source instanceof URL) return source.href;
  // A Hugging Face name is resolved where the file is read (against the `hub` option).
  if (typeof source === 'string' && source.startsWith('hf:')) return source;
  if (typeof source === 'string') return new URL(source, globalThis.location?.href).href;
  if (source instanceof ArrayBuffer || ArrayBuffer.isView(source)) return new Blob([source]);
  if (typeof Blob !== 'undefined' && source instanceof Blob) return source;
  throw new SaguaroError('invalid_argument', `${role}: expected a URL, a Blob/File, an ArrayBuffer or a Uint8Array`);
}

async function webgpuAdapter() {
  try {
    return !!(globalThis.navigator?.gpu && (await navigator.gpu.requestAdapter()));
  } catch {
    return false;
  }
}

/** Requests to a worker, each answered by id; progress and text events on the way. */
class Rpc {
  #worker;
  #next = 1;
  #calls = new Map();
  /** Why the worker is gone, once it is. */
  #lost = null;
  /** Messages that answer no call (`{type: 'draft-lost'}`). */
  onEvent = null;

  constructor(worker) {
    this.#worker = worker;
    worker.onmessage = (e) => {
      const m = e.data;
      if (m.id === undefined) return this.onEvent?.(m);
      const call = this.#calls.get(m.id);
      if (!call) return;
      if (m.type === 'progress') call.onProgress?.(m.progress);
      else if (m.type === 'text') call.onText?.(m.piece, m.tokens);
      else {
        this.#calls.delete(m.id);
        if (m.type === 'result') call.resolve(m.value);
        else call.reject(fail(m.error));
      }
    };
    worker.onerror = (e) => this.lost(`engine worker failed: ${e.message}`);
  }

  /** The worker stopped: every call waiting on it, and every later one, fails. */
  lost(message) {
    this.#lost ??= message;
    for (const call of this.#calls.values()) call.reject(new SaguaroError('internal', message));
    this.#calls.clear();
  }

  call(msg, { onProgress, onText, transfer = [] } = {}) {
    const id = this.#next++;
    return {
      id,
      done: new Promise((resolve, reject) => {
        if (this.#lost) return reject(new SaguaroError('internal', this.#lost));
        this.#calls.set(id, { resolve, reject, onProgress, onText });
        this.#worker.postMessage({ ...msg, id }, transfer);
      }),
    };
  }

  abort(id) {
    this.#worker.postMessage({ type: 'abort', target: id });
  }

  terminate() {
    this.lost('the engine was disposed');
    this.#worker.terminate();
  }
}

/** The draft in a new worker on `threads` threads, loading `source`, with `port` its end of the
 * channel to the engine; `loaded` settles when it is ready. It holds the Web Lock `lock` while it
 * lives. */
function spawnDraft(source, cfg, threads, lock, onProgress) {
  const channel = new MessageChannel();
  const worker = new Worker(new URL('./draft-worker.js', import.meta.url), { type: 'module', name: 'saguaro-draft' });
  const loaded = new Promise((resolve, reject) => {
    worker.onmessage = (e) => {
      const m = e.data;
      if (m.type === 'progress') onProgress?.(m.progress);
      else if (m.type === 'ready') resolve();
      else if (m.type === 'failed') reject(fail(m.error));
    };
    worker.onerror = (e) => reject(new SaguaroError('internal', `draft worker failed: ${e.message}`));
  });
  // A draft worker that fails once loaded is ended: the engine worker sees it go.
  loaded.then(() => (worker.onerror = () => worker.terminate()), () => {});
  // The draft worker's model is the engine options' draft (`draftBackend`); its target is unused.
  worker.postMessage({ port: channel.port2, source, opts: { ...cfg, backend: 'cpu', threads }, lock }, [channel.port2]);
  return { worker, port: channel.port1, loaded };
}

/** The browser placement: engine worker, plus a draft worker (on the CPU or its own GPUDevice) for
 * SSD, which serves SD too. */
class WorkerEngine {
  static async load(models, opts, modes) {
    const gpu = await webgpuAdapter();
    const server = isServer(models.target);
    let backend = opts.backend;
    if (backend === 'gpu' && !gpu) throw new SaguaroError('no_webgpu', 'backend "gpu": this browser has no WebGPU adapter');
    if (!backend && !server) {
      backend = gpu ? 'gpu' : 'cpu';
      if (!gpu) console.warn('saguaro: no WebGPU adapter, so the target runs on the CPU');
    }
    let draftBackend = opts.draftBackend ?? 'cpu';
    if (draftBackend === 'gpu' && !gpu) throw new SaguaroError('no_webgpu', 'draftBackend "gpu": this browser has no WebGPU adapter');
    const target = transferable(models.target, 'target');
    const draft = models.draft ? transferable(models.draft, 'draft') : null;
    // With the draft on WebGPU too, the draft worker requests a GPUDevice of its own: its
    // speculation is submitted on its own queue while the target's verification is in flight.
    const remoteSsd = !!draft && modes.includes('ssd');
    // The draft worker drafts for SD as well: one copy of the draft, held there. Without SSD the
    // engine worker holds it.
    const workerSd = remoteSsd && modes.includes('sd');
    const localModes = remoteSsd ? [] : modes.filter((m) => m === 'sd' || m === 'ssd');
    // The threads build computes on the CPU only: it serves an engine worker with nothing on
    // WebGPU, on a page whose memory can be shared, and a draft worker that drafts for SD there
    // (SD's drafting runs between the target's forwards, as it would on the engine worker's pool;
    // SSD beside a GPU or server target leaves the cores to its speculation). A draft worker for
    // SSD alone runs on one thread, beside the target.
    const threads = opts.threads ?? defaultThreads(globalThis.navigator?.hardwareConcurrency);
    const shareable = Number.isInteger(threads) && threads > 1 && canShareMemory();
    const draftThreads = workerSd && shareable && draftBackend === 'cpu' ? threads : 1;
    let engineThreads = threads;
    if (Number.isInteger(threads) && threads > 1) {
      if (backend === 'gpu' || (draftBackend === 'gpu' && !remoteSsd)) engineThreads = 1;
      else if (!canShareMemory()) {
        engineThreads = 1;
        console.info('saguaro: the page is not cross-origin isolated, so the CPU backend computes on one thread ' +
          '(serve it with the headers Cross-Origin-Opener-Policy: same-origin and Cross-Origin-Embedder-Policy: require-corp to compute on several)');
      }
    }
    const { onProgress, ...rest } = opts;
    const cfg = { ...rest, ...(backend && { backend }), draftBackend, threads: engineThreads };
    const worker = new Worker(new URL('./engine-worker.js', import.meta.url), { type: 'module', name: 'saguaro-engine' });
    const rpc = new Rpc(worker);
    // Each worker holds a Web Lock while it lives; waiting on it is how its end is seen.
    const lockId = `saguaro-${Math.random().toString(36).slice(2)}`;
    const spawn = remoteSsd ? (n) => spawnDraft(draft, cfg, draftThreads, `${lockId}-draft-${n}`, opts.onProgress) : null;
    // The engine worker reads the draft only to hold it itself, or with a server target, whose
    // tokenizer is the draft's (the engine then keeps the tokenizer alone): the draft worker then
    // starts once that read is done, and reads the draft from the store rather than
    // downloading it a second time.
    const localDraft = localModes.length > 0 || server;
    // A draft that is the target's own file (a model drafting for itself) is read once the
    // target's read has put it in the store, rather than downloaded twice at once.
    const sameFile = typeof draft === 'string' && draft === target && opts.cache !== false;
    let first = localDraft || sameFile ? null : spawn?.(0);
    try {
      const load = rpc.call(
        { type: 'load', target, draft: localDraft ? draft : null, opts: cfg, modes: localModes, requested: modes, draftPort: first?.port, sd: workerSd, lock: `${lockId}-engine` },
        { onProgress: opts.onProgress, transfer: first ? [first.port] : [] },
      );
      let [info] = await Promise.all([load.done, first?.loaded]);
      if (spawn && !first) {
        first = spawn(0);
        await first.loaded;
        info = await rpc.call({ type: 'attach', draftPort: first.port, sd: workerSd }, { transfer: [first.port] }).done;
      }
      whenLockFree(`${lockId}-engine`, () => rpc.lost('the engine worker stopped (it closed or crashed): load the models again'));
      return new WorkerEngine(rpc, first?.worker ?? null, spawn, workerSd, { ...info, backend: server ? 'server' : backend, draftBackend: draft ? draftBackend : null, draftWorker: remoteSsd });
    } catch (e) {
      rpc.terminate();
      first?.worker.terminate();
      throw e;
    }
  }

  #spawned = 0;
  #disposed = false;

  constructor(rpc, draftWorker, spawn, workerSd, info) {
    this.rpc = rpc;
    this.draftWorker = draftWorker;
    this.info = info;
    // A draft worker that stopped is replaced; until the new one is ready, the modes it serves
    // fail at once.
    rpc.onEvent = (m) => {
      if (m.type === 'draft-lost' && spawn && !this.#disposed) this.#replaceDraft(spawn, workerSd).catch((e) => console.warn(`saguaro: the draft worker could not be restarted (${e.message})`));
    };
  }

  async #replaceDraft(spawn, sd) {
    const next = spawn(++this.#spawned);
    this.draftWorker = next.worker;
    await next.loaded;
    const info = await this.rpc.call({ type: 'attach', draftPort: next.port, sd }, { transfer: [next.port] }).done;
    this.info = { ...this.info, ...info };
  }

  async run(prompt, opts, onText, signal) {
    const { id, done } = this.rpc.call({ type: 'generate', prompt, opts }, { onText });
    const onAbort = () => this.rpc.abort(id);
    signal?.addEventListener('abort', onAbort);
    try {
      const { result, info } = await done;
      this.info = { ...this.info, ...info };
      return result;
    } finally {
      signal?.removeEventListener('abort', onAbort);
    }
  }

  async dispose() {
    this.#disposed = true;
    await this.rpc.call({ type: 'dispose' }).done.catch(() => {});
    this.rpc.terminate();
    this.draftWorker?.terminate();
  }
}

/** Node: the engine inline on the CPU (SSD's draft inline too: the same tokens, no overlap). */
class InlineEngine {
  static async load(models, opts, modes) {
    if (opts.backend === 'gpu' || opts.draftBackend === 'gpu') throw new SaguaroError('no_webgpu', 'Node has no WebGPU: use backend "cpu"');
    const core = await import('./core.js');
    const { availableParallelism } = await import('node:os');
    // The first load in the process picks the build: with threads > 1, the threads build.
    const threads = opts.threads ?? defaultThreads(availableParallelism());
    const local = modes.filter((m) => m !== 'ar');
    let engine;
    try {
      engine = await core.loadEngine(models.target, models.draft, { ...opts, backend: 'cpu', draftBackend: 'cpu', threads }, local, opts.onProgress, modes);
    } catch (e) {
      throw fail(errorInfo(e));
    }
    const backend = isServer(models.target) ? 'server' : 'cpu';
    return new InlineEngine(core, engine, { ...engine.info(), backend, draftBackend: models.draft ? 'cpu' : null, draftWorker: false });
  }

  constructor(core, engine, info) {
    this.core = core;
    this.engine = engine;
    this.info = info;
  }

  async run(prompt, opts, onText, signal) {
    try {
      return await this.core.generate(this.engine, prompt, opts, onText, () => !!signal?.aborted);
    } catch (e) {
      throw fail(errorInfo(e));
    } finally {
      this.#refresh();
    }
  }

  /** The engine refines its choice of mode after each generation; an engine stopped by an
   * internal error has nothing to say. */
  #refresh() {
    try {
      if (this.engine) this.info = { ...this.info, ...this.engine.info() };
    } catch {}
  }

  async dispose() {
    this.engine?.free();
    this.engine = null;
  }
}

export class Saguaro {
  #impl;
  #queue = Promise.resolve();

  /** The models kept in this browser's stores: list, delete, clear (see index.d.ts). */
  static cache = modelCache;

  /**
   * Load a target model and an optional draft (same vocabulary). See index.d.ts for the options.
   */
  static async load(models, options = {}) {
    if (!models || models.target === undefined) throw new SaguaroError('invalid_argument', 'load: give at least { target }');
    // Other options pass through: the engine checks them against its one list of names.
    const batched = (options.parallel ?? DEFAULTS.parallel) > 1;
    const modes = options.modes ?? (models.draft ? (batched ? DEFAULTS.batchModes : DEFAULTS.modes) : ['ar']);
    // The names are the engine's to check (with the other options, before any download).
    if (!Array.isArray(modes)) throw new SaguaroError('invalid_argument', 'modes: expected an array of mode names');
    // Asked of the page (workers cannot): a persistent store is not evicted under pressure.
    if (options.persist && globalThis.navigator?.storage?.persist && !(await navigator.storage.persist())) console.warn('saguaro: the browser did not make the model store persistent');
    // The engine measures what each mode costs on this machine and picks the default mode (and
    // its K) itself; a generation without `mode` leaves the choice to it.
    const impl = isNode ? await InlineEngine.load(models, options, modes) : await WorkerEngine.load(models, options, modes);
    return new Saguaro(impl);
  }

  constructor(impl) {
    this.#impl = impl;
    this.chat = { completions: { create: (req) => this.#chatCompletion(req) } };
  }

  /** Where the models run and what was loaded. */
  get info() {
    return this.#impl.info;
  }

  /** Generate from a prompt (a string, or {messages}); resolves to {text, tokens, promptTokens, finish, stats}. */
  generate(prompt, options = {}) {
    const { signal, onToken, ...opts } = options;
    const run = async () => {
      if (!this.#impl) throw new SaguaroError('invalid_argument', 'the engine was disposed');
      if (signal?.aborted) throw abortError(null);
      let text = '';
      let generated = 0;
      const onText = (piece, tokens) => {
        text += piece;
        generated += tokens;
        onToken?.(piece, tokens);
      };
      let result;
      try {
        result = await this.#impl.run(prompt, opts, onText, signal);
      } catch (e) {
        e.partial ??= { text, generated };
        throw e;
      }
      // Only an abort cancels a generation.
      if (result.finish === 'cancelled') throw abortError(result);
      return result;
    };
    // With `parallel` above 1 a call joins the engine's batch at once; else one generation runs
    // at a time and later calls wait their turn. dispose() waits for every call made before it.
    const batched = this.#impl?.info.parallel > 1;
    const p = batched ? run() : this.#queue.then(run, run);
    const settled = p.catch(() => {});
    this.#queue = batched ? Promise.all([this.#queue, settled]) : settled;
    return p;
  }

  /** The generated text as an async iterator of pieces (never half a character). Leaving the
   * loop early (`break`, `return`, a throw) aborts the generation. */
  stream(prompt, options = {}) {
    const { signal, ...opts } = options;
    const pieces = [];
    let wake = null;
    let finished = false;
    let failure = null;
    // Aborted by the caller's signal or by a consumer that stops iterating.
    const stop = new AbortController();
    const follow = () => stop.abort();
    if (signal?.aborted) stop.abort();
    else signal?.addEventListener('abort', follow, { once: true });
    const result = this.generate(prompt, {
      ...opts,
      signal: stop.signal,
      onToken: (p, n) => {
        opts.onToken?.(p, n);
        if (!p) return;
        pieces.push(p);
        wake?.();
      },
    });
    result.then(
      () => {
        finished = true;
        wake?.();
      },
      (e) => {
        finished = true;
        failure = e;
        wake?.();
      },
    ).finally(() => signal?.removeEventListener('abort', follow));
    // `result` rejects when the generation fails; a caller who only iterates sees the error
    // there, so it must not count as an unhandled rejection.
    result.catch(() => {});
    return {
      result,
      async *[Symbol.asyncIterator]() {
        try {
          for (;;) {
            if (pieces.length) {
              yield pieces.shift();
              continue;
            }
            if (finished) {
              if (failure) throw failure;
              return;
            }
            await new Promise((r) => (wake = r));
            wake = null;
          }
        } finally {
          if (!finished) stop.abort();
        }
      },
    };
  }

  async #chatCompletion(req) {
    const { max_tokens, temperature, top_p, seed, stream, signal, mode, response_format, grammar, regex, tools, tool_choice, n = 1 } = req ?? {};
    if (!Array.isArray(req?.messages) || req.messages.length === 0) throw new SaguaroError('invalid_argument', 'messages: give at least one {role, content}');
    if (!Number.isInteger(n) || n < 1) throw new SaguaroError('invalid_argument', `n: must be a whole number of choices, at least 1, got ${JSON.stringify(n)}`);
    // Earlier calls go to the chat template as transformers hands them over: arguments parsed.
    const messages = req.messages.map(({ role, content, tool_calls }) => ({
      role,
      content: content ?? '',
      ...(tool_calls?.length && { tool_calls: tool_calls.map((c) => ({ type: 'function', function: { name: c.function.name, arguments: JSON.parse(c.function.arguments || '{}') } })) }),
    }));
    // The n choices stop together: at the caller's signal, or when one of them fails.
    const stop = new AbortController();
    const follow = () => stop.abort();
    if (signal?.aborted) stop.abort();
    else signal?.addEventListener('abort', follow, { once: true });
    // Left out, each is the engine's default (`DEFAULTS`); the engine checks the formats.
    const opts = { maxTokens: max_tokens, temperature, topP: top_p, seed, signal: stop.signal, mode, responseFormat: response_format ?? undefined, grammar, regex, tools, toolChoice: tool_choice };
    for (const k of Object.keys(opts)) if (opts[k] === undefined) delete opts[k];
    // Choice i samples with seed + i, as saguaro serve's do: the choices differ. With `parallel`
    // above 1 they generate in one batch, else one after another.
    const optsOf = (i) => (n > 1 ? { ...opts, seed: (seed ?? DEFAULTS.seed) + i } : opts);
    const choices = Array.from({ length: n }, (_, i) => i);
    const id = `chatcmpl-${Math.random().toString(36).slice(2)}`;
    const created = Math.floor(Date.now() / 1000);
    const stops = this.info.stopTexts ?? [];
    const strip = (text) => {
      for (const s of stops) if (s && text.endsWith(s)) return text.slice(0, -s.length);
      return text;
    };
    const calls = (r) => r.toolCalls?.map((c, i) => ({ index: i, id: `call_${id.slice(9)}_${i}`, type: 'function', function: { name: c.name, arguments: c.arguments } }));
    const reason = (r) => (r.toolCalls?.length ? 'tool_calls' : FINISH_REASONS[r.finish]);
    const usage = (rs) => {
      const completion_tokens = rs.reduce((sum, r) => sum + r.tokens.length, 0);
      return { prompt_tokens: rs[0].promptTokens, completion_tokens, total_tokens: rs[0].promptTokens + completion_tokens };
    };
    const settled = (p) => p.finally(() => signal?.removeEventListener('abort', follow));
    if (!stream) {
      const rs = await settled(
        Promise.all(choices.map((i) => this.generate({ messages }, optsOf(i)))).catch((e) => {
          stop.abort();
          throw e;
        }),
      );
      const message = (r) => (r.toolCalls?.length ? { role: 'assistant', content: null, tool_calls: calls(r) } : { role: 'assistant', content: strip(r.text) });
      const out = rs.map((r, index) => ({ index, message: message(r), finish_reason: reason(r) }));
      return { id, object: 'chat.completion', created, model: 'saguaro', choices: out, usage: usage(rs), stats: rs[0].stats };
    }
    const streams = choices.map((i) => this.stream({ messages }, optsOf(i)));
    settled(Promise.allSettled(streams.map((s) => s.result)));
    const chunk = (index, delta, finish_reason = null) => ({ id, object: 'chat.completion.chunk', created, model: 'saguaro', choices: [{ index, delta, finish_reason }] });
    // With tools the output may be calls, which begin with '<' (plain text never does, the tools'
    // grammar says): nothing of it streams as content until its first character shows which.
    const mayCall = tools?.length && tool_choice !== 'none';
    async function* choice(index, s) {
      yield chunk(index, { role: 'assistant', content: '' });
      // One piece is held back so the stop token's text can be cut from the last one.
      let held = null;
      let text = '';
      for await (const piece of s) {
        text += piece;
        if (mayCall && !/\S/.test(text)) continue;
        if (mayCall && text.trimStart().startsWith('<')) continue;
        if (held !== null) yield chunk(index, { content: held });
        held = held === null && mayCall ? text : piece;
      }
      const r = await s.result;
      // A call cut short by max_tokens is text after all.
      const rest = held ?? (mayCall ? text : null);
      if (r.toolCalls?.length) yield chunk(index, { tool_calls: calls(r) });
      else if (rest !== null && strip(rest)) yield chunk(index, { content: strip(rest) });
      const last = chunk(index, {}, reason(r));
      if (n === 1) last.usage = usage([r]);
      yield last;
    }
    if (n === 1) return choice(0, streams[0]);
    return (async function* () {
      try {
        yield* interleave(streams.map((s, i) => choice(i, s)));
      } catch (e) {
        stop.abort();
        throw e;
      }
      // The usage of all the choices, in a chunk of its own (OpenAI's `include_usage`).
      yield { id, object: 'chat.completion.chunk', created, model: 'saguaro', choices: [], usage: usage(await Promise.all(streams.map((s) => s.result))) };
    })();
  }

  /** Stop the workers and free the models; the engine cannot be used afterwards. */
  async dispose() {
    const impl = this.#impl;
    this.#impl = null;
    await this.#queue;
    await impl?.dispose();
  }
}
