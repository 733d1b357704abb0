/** Where a model comes from: a URL, a Hugging Face name `hf:OWNER/REPO/PATH.gguf` (optionally
 * `@REVISION`, default main; see `LoadOptions.hub`), a Blob/File, or the file's bytes. A GGUF
 * file; a split model (`NAME-00001-of-00003.gguf`, …) by its first part's URL or name. */
export type ModelSource = string | URL | Blob | ArrayBuffer | Uint8Array;

/** Where downloaded models are kept: the origin private file system, the Cache API. */
export type ModelStore = 'opfs' | 'cache-api';

/** A model file kept in a store. */
export interface StoredModel {
  /** The name it was loaded by: its URL (made absolute) or its `hf:` name; a split model's parts
   * are each an entry. */
  url: string;
  /** In bytes. */
  size: number;
  store: ModelStore;
  /** When it was stored, in ms since the epoch. */
  storedAt: number;
}

/** The models this origin keeps (`Saguaro.cache`). */
export interface ModelCache {
  list(): Promise<StoredModel[]>;
  /** Remove `url`'s file from every store; resolves to whether one held it. */
  delete(url: string): Promise<boolean>;
  /** Remove every stored model. */
  clear(): Promise<void>;
}

/** A target on a server that speaks SGLang's `/generate` (`saguaro serve`, or SGLang): every
 * round sends the draft's tokens there for verification in one request. Needs a `draft`, which
 * runs here and whose tokenizer must be the server's. Greedy output equals the server model's
 * own; sampled output is exact with `topK` between 1 and `topN` (other sampling is refused). */
export interface ServerTarget {
  /** `http://HOST:PORT`. The server must allow this page's origin (`saguaro serve` does: CORS). */
  server: string;
  /** Likeliest tokens the server returns per verified position (default 64). */
  topN?: number;
  /** Limit on one request, in ms (default 60000). */
  timeoutMs?: number;
  /** Further attempts after a failed request, with a doubling wait from 100 ms (default 3). */
  retries?: number;
}

export type Backend = 'gpu' | 'cpu';
/** With a server target, 'ar' is the server generating on its own (one request). */
export type Mode = 'ar' | 'sd' | 'ssd';

export type ErrorCode =
  | 'bad_model'
  | 'vocab_mismatch'
  | 'no_webgpu'
  | 'device_lost'
  | 'out_of_memory'
  | 'invalid_argument'
  | 'aborted'
  | 'gpu_error'
  | 'server_error'
  | 'internal';

/** Every failure is one of these, with a message that says what went wrong. */
export declare class SaguaroError extends Error {
  readonly code: ErrorCode;
  /** What a generation had produced when it stopped: for `aborted`, its result up to the stop
   * (null when it never started); for a failure midway (e.g. `internal` when the draft worker
   * dies during SD or SSD), the text streamed so far and how many tokens it holds. */
  partial?: GenerateResult | { text: string; generated: number } | null;
}

export interface Progress {
  /** `download` (bytes of a model file, possibly from a store: `LoadOptions.cache`), then `upload` (placing the target). */
  phase: 'download' | 'upload';
  role: 'target' | 'draft';
  loaded: number;
  /** Null when the server did not say how large the file is. */
  total: number | null;
  fromCache?: boolean;
  /** A split model: which of its `parts` files `loaded` and `total` count. */
  part?: number;
  parts?: number;
}

export interface LoadOptions {
  /** Where the target runs. Default: 'gpu' when WebGPU has an adapter, else 'cpu' (with a warning). Node: 'cpu'. */
  backend?: Backend;
  /** Where the draft runs. Default 'cpu'. With 'ssd' among the modes it runs in its own Web
   * Worker ('gpu': on a GPUDevice that worker requests for itself), SSD's speculation overlapping
   * the target, SD drafting there too; the engine's worker then holds no copy of the draft. */
  draftBackend?: Backend;
  onProgress?: (p: Progress) => void;
  /** Where to keep downloaded models: 'opfs', 'cache-api', or false (not kept). Default (or
   * true): the best store the browser has, OPFS where it exists. A stored file is read from
   * there while its source's ETag and length still match it; a store without room for a file
   * is left out, with a warning (the model loads all the same). */
  cache?: boolean | ModelStore;
  /** Ask the browser to make the store persistent (`navigator.storage.persist()`), so that it
   * is not evicted when space runs low. */
  persist?: boolean;
  /** Where `hf:` names resolve (default 'https://huggingface.co'), e.g. a mirror. */
  hub?: string;
  /** KV-cache size in tokens (prompt + output); default 2048, capped by the model. */
  context?: number;
  /** Draft tokens per round for SD/SSD (default 4). */
  specK?: number;
  /** SSD fan-out: 'uniform:F', 'geometric', 'geometric:B' or 'top-p:P' (default 'uniform:3'). */
  fanout?: string;
  /** SSD on a cache miss: 'jit' (draft now, default) or 'fast' (verify the bonus token alone). */
  backup?: 'jit' | 'fast';
  /** Modes to prepare. Default: all three with a draft, ['ar'] without. */
  modes?: Mode[];
  /** Draft SD's tokens by looking the text so far up in the prompt, with no draft model (use
   * mode 'sd'; not with a `draft`). */
  promptLookup?: boolean;
  /** Threads the CPU backend computes on, 1 to 64. Default: one per logical core
   * (`navigator.hardwareConcurrency`, in Node `os.availableParallelism()`), at most 8. Above 1
   * the package loads its threads build (a pool of workers sharing wasm memory), which needs a
   * cross-origin isolated page (served with `Cross-Origin-Opener-Policy: same-origin` and
   * `Cross-Origin-Embedder-Policy: require-corp`); elsewhere, and when the target or the draft
   * runs on WebGPU, the engine computes on one thread (`info.threads` says). The draft worker
   * computes on as many where it drafts for SD, on one where it serves SSD alone. 1: the single-thread build. In Node the first load picks the build for
   * the process. */
  threads?: number;
  /** How a WebGPU model's KV cache stores K and V: 'f16' (default; half the GPU memory, so twice
   * the context in the same memory, and half the bytes attention reads) or 'f32'. A CPU model's
   * cache is f32. */
  kvCache?: 'f16' | 'f32';
  /** f16 arithmetic in a WebGPU model's matmul for decoding and verification: weights decoded
   * and multiplied in f16, added up in f32. The adapter must offer 'shader-f16' (elsewhere the
   * load fails with code 'gpu_error'). Off by default: logits move about 5x further from the
   * fp32 reference than with f32 arithmetic (greedy speculation still gives exactly the target's
   * tokens), and its speed on a GPU is not yet measured. */
  shaderF16?: boolean;
}

export interface GenerateOptions {
  /** Default: the engine's own choice (`info.defaultMode`), made from the cost of each mode it
   * measured at load and refined by the acceptance later generations see; with it the engine
   * also picks K, and `stats.auto` says what it measured. */
  mode?: Mode;
  /** Upper bound on generated tokens (default 256). */
  maxTokens?: number;
  /** 0 (the default) is greedy decoding. */
  temperature?: number;
  /** Keep the K most likely tokens (0 = off). */
  topK?: number;
  /** Nucleus sampling, in (0, 1] (1 = off). */
  topP?: number;
  /** The same seed gives the same output. */
  seed?: number;
  specK?: number;
  fanout?: string;
  /** Wrap a string prompt as a user message in the model's chat template. */
  chat?: boolean;
  /** Stops the generation at its next round (SSD's draft worker drops its speculation at once);
   * the promise rejects with code 'aborted' and the result so far in `partial`. */
  signal?: AbortSignal;
  /** Called once per round with the new text (never half a character; may be empty when a
   * character is still incomplete) and the number of tokens the round added. */
  onToken?: (piece: string, tokens: number) => void;
}

export interface ChatMessage {
  role: 'system' | 'user' | 'assistant';
  content: string;
}

export type Prompt = string | { messages: ChatMessage[] };

export interface Stats {
  mode: Mode;
  promptTokens: number;
  generated: number;
  tokensPerS: number;
  prefillMs: number;
  decodeMs: number;
  /** Target forwards after the prefill. */
  rounds: number;
  acceptanceRate?: number;
  meanAccepted?: number;
  cacheHitRate?: number;
  targetBusyMs: number;
  /** Time the draft computed. SD through the draft worker: time in the worker, so that the
   * timeline's draft spans, which the engine sees, exceed it by the rounds' trips to the worker. */
  draftBusyMs?: number;
  /** Time the draft's speculation ran at the same time as the target's verification. */
  overlapMs?: number;
  /** With a server target: what its requests cost. */
  remote?: {
    roundTrips: number;
    /** Failed attempts that were sent again. */
    retries: number;
    bytesSent: number;
    bytesReceived: number;
    roundTripMs: number;
    /** The server's own time for the requests. */
    serverMs: number;
    /** Tokens the server already held in its prefix cache, of all tokens sent. */
    cachedTokens: number;
    inputTokens: number;
  };
  verifyMsMean?: number;
  treeStepMsMean?: number;
  glueMsMean?: number;
  /** SD/SSD: one entry per round, times in ms from the start of decoding. */
  timeline?: RoundTimes[];
  /** A generation without `mode`: the engine's choice and what it measured to make it. */
  auto?: {
    mode: Mode;
    /** K at load; SD chooses it again after every round from the acceptance so far (`timeline`
     * shows each round's proposal). */
    k: number;
    expectedSpeedup: number;
    /** Per-token acceptance assumed, refined after each speculative generation. */
    acceptance: number;
    /** `treeStep`: [rows, ms] of a draft forward as wide as SSD's tree steps, timed where the draft
     * runs beside the target (SSD is chosen only when its speculation fits behind the verify). */
    costs: { decodeMs: number; verifyMs: [number, number][]; draftStepMs: number; treeStep: [number, number] | null; parallel: boolean };
  };
}

export interface RoundTimes {
  /** The target's verification. */
  verify: [number, number];
  /** The draft's work for the next round (SSD: glue pass + tree, overlapping `verify`). */
  draft: [number, number] | null;
  accepted: number;
  proposed: number;
  /** SSD: whether this round's proposal came from the speculation cache. */
  hit: boolean | null;
}

export interface GenerateResult {
  text: string;
  /** Generated ids, including the end-of-sequence token that ended generation. */
  tokens: number[];
  promptTokens: number;
  finish: 'eos' | 'max_tokens' | 'cancelled' | 'context_full';
  stats: Stats;
}

export interface EngineInfo {
  /** The target's backend, e.g. 'cpu (2 threads, simd128)'. */
  targetBackend: string;
  /** Threads the engine's CPU work runs on (see `LoadOptions.threads`). */
  threads: number;
  /** 'server' for a server target. */
  backend: Backend | 'server';
  draftBackend: Backend | null;
  /** Where the draft model computes, as its backend names itself, e.g. 'gpu (BrowserWebGpu)' (a
   * browser may withhold the adapter's name) or 'cpu (1 threads, simd128)'; null without a draft
   * model. */
  draftDevice: string | null;
  /** Whether the draft runs in its own Web Worker (serving SSD, and SD with it). */
  draftWorker: boolean;
  hasDraft: boolean;
  defaultMode: Mode;
  vocabSize: number;
  contextLength: number;
  stopTexts: string[];
  /** The engine worker's wasm memory in bytes, its peak so far (wasm memory only grows). A target
   * on WebGPU streams to the GPU tensor by tensor and is never held whole there. */
  wasmMemoryBytes: number;
}

export interface ChatCompletionRequest {
  messages: ChatMessage[];
  max_tokens?: number;
  temperature?: number;
  top_p?: number;
  seed?: number;
  stream?: boolean;
  mode?: Mode;
  signal?: AbortSignal;
}

export interface ChatCompletion {
  id: string;
  object: 'chat.completion';
  created: number;
  model: string;
  choices: { index: number; message: { role: 'assistant'; content: string }; finish_reason: 'stop' | 'length' }[];
  usage: { prompt_tokens: number; completion_tokens: number; total_tokens: number };
  stats: Stats;
}

export interface ChatCompletionChunk {
  id: string;
  object: 'chat.completion.chunk';
  created: number;
  model: string;
  choices: { index: number; delta: { role?: 'assistant'; content?: string }; finish_reason: 'stop' | 'length' | null }[];
  usage?: ChatCompletion['usage'];
}

/** Leaving the loop early (`break`, `return`, a throw) aborts the generation. */
export interface TextStream extends AsyncIterable<string> {
  /** The whole result once the stream ends; rejects as the loop throws when the generation
   * fails, and with 'aborted' when the loop was left early. */
  result: Promise<GenerateResult>;
}

export declare class Saguaro {
  /** The models kept in this browser's stores. */
  static readonly cache: ModelCache;
  static load(models: { target: ModelSource | ServerTarget; draft?: ModelSource }, options?: LoadOptions): Promise<Saguaro>;
  readonly info: EngineInfo;
  generate(prompt: Prompt, options?: GenerateOptions): Promise<GenerateResult>;
  stream(prompt: Prompt, options?: GenerateOptions): TextStream;
  readonly chat: {
    completions: {
      create(req: ChatCompletionRequest & { stream: true }): Promise<AsyncIterable<ChatCompletionChunk>>;
      create(req: ChatCompletionRequest & { stream?: false }): Promise<ChatCompletion>;
    };
  };
  dispose(): Promise<void>;
}
