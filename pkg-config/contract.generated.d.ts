// Generated from the Rust types (src/contract) by `scripts/gen-contract.sh`: do not edit.

/**
 * What kind of failure an error is, for programs: the JS API's `error.code`. Its string form is
 * serde's (`"invalid_argument"`), the one the package's TypeScript union is generated from.
 */
export type ErrorCode = "bad_model" | "vocab_mismatch" | "no_webgpu" | "device_lost" | "out_of_memory" | "invalid_argument" | "invalid_grammar" | "aborted" | "gpu_error" | "server_error" | "internal";

/**
 * A decoding strategy, as a generation asks for it.
 */
export type Mode = "ar" | "sd" | "ssd";

/**
 * Where a model computes, as the JS API names it.
 */
export type Backend = "gpu" | "cpu";

/**
 * What SSD does when the verification outcome is not in the speculation cache.
 */
export type Backup = "jit" | "fast";

/**
 * How a GPU backend's KV cache stores K and V; the CPU's holds f32. Attention computes in f32
 * either way.
 */
export type KvCache = "f16" | "f32";

/**
 * The engine's load options (those the package handles itself, such as `onProgress`, are added
 * in index.d.ts). Defaults are in `DEFAULTS`.
 */
export type EngineLoadOptions = { 
/**
 * Where the target runs. Default: 'gpu' when WebGPU has an adapter, else 'cpu' (with a
 * warning). Node: 'cpu'.
 */
backend?: Backend, 
/**
 * Where the draft runs. Default 'cpu'. With 'ssd' among the modes it runs in its own Web
 * Worker ('gpu': on a GPUDevice that worker requests for itself), SSD's speculation
 * overlapping the target, SD drafting there too; the engine's worker then holds no copy of
 * the draft.
 */
draftBackend?: Backend, 
/**
 * KV-cache size in tokens (prompt + output), capped by the model; default `DEFAULTS.context`.
 */
context?: number, 
/**
 * Draft tokens per round for SD/SSD (default `DEFAULTS.specK`).
 */
specK?: number, 
/**
 * SSD fan-out: 'uniform:F', 'geometric', 'geometric:B' or 'top-p:P' (default `DEFAULTS.fanout`).
 */
fanout?: string, 
/**
 * SSD on a cache miss: 'jit' (draft now) or 'fast' (verify the bonus token alone); default
 * `DEFAULTS.backup`.
 */
backup?: Backup, 
/**
 * Modes to prepare. Default: all three with a draft, ['ar'] without.
 */
modes?: Array<Mode>, 
/**
 * Draft SD's tokens by looking the text so far up in the prompt, with no draft model (use
 * mode 'sd'; not with a `draft`).
 */
promptLookup?: boolean, 
/**
 * Threads the CPU backend computes on, 1 to `LIMITS.maxThreads`. Default: one per logical
 * core (`navigator.hardwareConcurrency`, in Node `os.availableParallelism()`), at most
 * `DEFAULTS.threadCap`. Above 1 the package loads its threads build (a pool of workers
 * sharing wasm memory), which needs a cross-origin isolated page (served with
 * `Cross-Origin-Opener-Policy: same-origin` and `Cross-Origin-Embedder-Policy:
 * require-corp`); elsewhere, and when the target or the draft runs on WebGPU, the engine
 * computes on one thread (`info.threads` says). The draft worker computes on as many where
 * it drafts for SD, on one where it serves SSD alone. 1: the single-thread build. In Node
 * the first load picks the build for the process.
 */
threads?: number, 
/**
 * How a WebGPU model's KV cache stores K and V: 'f16' (default; half the GPU memory, so
 * twice the context in the same memory, and half the bytes attention reads) or 'f32'. A CPU
 * model's cache is f32.
 */
kvCache?: KvCache, 
/**
 * f16 arithmetic in a WebGPU model's matmul for decoding and verification: weights decoded
 * and multiplied in f16, added up in f32. The adapter must offer 'shader-f16' (elsewhere the
 * load fails with code 'gpu_error'). Off by default: logits move about 5x further from the
 * fp32 reference than with f32 arithmetic (greedy speculation still gives exactly the
 * target's tokens), and its speed on a GPU is not yet measured.
 */
shaderF16?: boolean, 
/**
 * Sequences that generate at once, 1 to `LIMITS.maxParallel` (default `DEFAULTS.parallel`).
 * Above 1, concurrent `generate`, `stream` and `chat.completions.create` calls (and a chat
 * completion's `n` choices) run as one batch, each forward reading the weights once for all
 * of them, and each call's output is what it would be alone. The engine then runs AR and SD
 * (the draft in the engine's worker; SSD's speculation serves one sequence and is not
 * offered), chooses between them for the batch size each call joins, and holds a KV cache of
 * `context` tokens per sequence. Calls beyond `parallel` wait for a sequence to free up.
 */
parallel?: number, };

/**
 * A target on a server that speaks SGLang's `/generate` (`saguaro serve`, or SGLang): every
 * round sends the draft's tokens there for verification in one request. Needs a `draft`, which
 * runs here and whose tokenizer must be the server's. Greedy output equals the server model's
 * own; sampled output is exact with `topK` between 1 and `topN` (other sampling is refused).
 */
export type ServerTarget = { 
/**
 * `http://HOST:PORT`. The server must allow this page's origin (`saguaro serve` does: CORS).
 */
server: string, 
/**
 * Likeliest tokens the server returns per verified position (default `DEFAULTS.serverTopN`).
 */
topN?: number, 
/**
 * Limit on one request, in ms (default `DEFAULTS.serverTimeoutMs`).
 */
timeoutMs?: number, 
/**
 * Further attempts after a failed request, with a doubling wait from
 * `DEFAULTS.serverBackoffMs` (default `DEFAULTS.serverRetries`).
 */
retries?: number, };

/**
 * The engine's generate options (those the package handles itself, such as `signal`, are
 * added in index.d.ts).
 */
export type EngineGenerateOptions = { 
/**
 * Default: the engine's own choice (`info.defaultMode`), made from the cost of each mode it
 * measured at load and refined by the acceptance later generations see; with it the engine
 * also picks K, and `stats.auto` says what it measured.
 */
mode?: Mode, 
/**
 * Upper bound on generated tokens (default `DEFAULTS.maxTokens`).
 */
maxTokens?: number, 
/**
 * 0 (the default) is greedy decoding.
 */
temperature?: number, 
/**
 * Keep the K most likely tokens (0, the default: off).
 */
topK?: number, 
/**
 * Nucleus sampling, in (0, 1] (1, the default: off).
 */
topP?: number, 
/**
 * The same seed gives the same output.
 */
seed?: number, specK?: number, fanout?: string, 
/**
 * Wrap a string prompt as a user message in the model's chat template.
 */
chat?: boolean, 
/**
 * The output's format, as OpenAI's API takes it: `{ type: 'json_object' }` (any JSON
 * object), `{ type: 'json_schema', json_schema: { name, schema, strict } }`, or
 * `{ type: 'text' }` (the default: free text).
 */
responseFormat?: { "type": "text" } | { "type": "json_object" } | { "type": "json_schema", json_schema: { 
/**
 * What the schema is called (OpenAI requires one; it is not used here).
 */
name?: string, schema: Record<string, unknown>, 
/**
 * The output always follows the schema here: `false` is taken as `true`.
 */
strict?: boolean, }, }, 
/**
 * A Lark grammar (llguidance's dialect) the output matches.
 */
grammar?: string, 
/**
 * A regular expression the whole output matches.
 */
regex?: string, 
/**
 * Functions the model may call, OpenAI's `tools` (a chat prompt, a model whose chat template
 * lists tools): the result's `toolCalls` holds the calls made.
 */
tools?: Array<Tool>, 
/**
 * OpenAI's `tool_choice`: `'auto'` (the default: a call or text), `'required'`, `'none'`, or
 * `{ type: 'function', function: { name } }`.
 */
toolChoice?: 'auto' | 'required' | 'none' | { type: 'function', function: { name: string } }, };

/**
 * What the engine says of what it loaded (the package adds where each model runs).
 */
export type EngineInfoBase = { 
/**
 * The target's backend, e.g. 'cpu (2 threads, simd128)'.
 */
targetBackend: string, 
/**
 * Where the draft model computes, as its backend names itself, e.g. 'gpu (BrowserWebGpu)' (a
 * browser may withhold the adapter's name) or 'cpu (1 threads, simd128)'; null without a
 * draft model (or with prompt lookup).
 */
draftDevice: string | null, 
/**
 * Threads the engine's CPU work runs on (see `LoadOptions.threads`; 1 in the single-thread
 * builds).
 */
threads: number, hasDraft: boolean, defaultMode: Mode, vocabSize: number, contextLength: number, 
/**
 * The text of each token that ends generation (an OpenAI-style reply leaves it out).
 */
stopTexts: Array<string>, 
/**
 * The engine worker's wasm memory in bytes, its peak so far (wasm memory only grows). A
 * target on WebGPU streams to the GPU tensor by tensor and is never held whole there.
 */
wasmMemoryBytes: number, 
/**
 * Sequences that generate at once (the `parallel` option).
 */
parallel: number, };

/**
 * The result of one generation (the CLI's `--json` object and the JS API's result).
 */
export type GenerateResult = { text: string, 
/**
 * Generated ids, including the stop token that ended generation.
 */
tokens: Array<number>, promptTokens: number, finish: FinishReason, stats: Stats, 
/**
 * With tools: the calls the output made (none where it answered in text, or was cut short).
 */
toolCalls?: Array<ToolCall>, };

export type FinishReason = "eos" | "max_tokens" | "context_full" | "cancelled";

/**
 * Statistics of one generation (the `stats` object of the CLI's `--json` output).
 */
export type Stats = { mode: Mode, promptTokens: number, generated: number, tokensPerS: number, prefillMs: number, decodeMs: number, 
/**
 * Target forwards after prefill (one per token for AR, one per round for SD/SSD).
 */
rounds: number, acceptanceRate?: number, meanAccepted?: number, cacheHitRate?: number, 
/**
 * SSD: cache hits that supplied two or more draft tokens (their later tokens were drawn at
 * tree steps past the first, so a sampled one is verified against a q from such a step).
 */
multiTokenHits?: number, targetBusyMs: number, draftBusyMs?: number, overlapMs?: number, verifyMsMean?: number, treeStepMsMean?: number, glueMsMean?: number, 
/**
 * SD/SSD: each round's times, for drawing how draft and target overlap.
 */
timeline?: Array<RoundTimes>, 
/**
 * When the engine chose the mode and K: its choice and the costs it measured.
 */
auto?: Choice, 
/**
 * With a target on a server: what its requests cost.
 */
remote?: RemoteStats, 
/**
 * With a grammar: the tokens it forced and what its masks cost.
 */
grammar?: GrammarStats, };

/**
 * One SD/SSD round, in ms from the start of decoding (after the prefill).
 */
export type RoundTimes = { 
/**
 * The target's verification forward.
 */
verify: [number, number], 
/**
 * The draft's work on this round: SD's drafting before the verify; SSD's glue pass and
 * tree for the next round, which runs during the verify.
 */
draft: [number, number] | null, proposed: number, accepted: number, 
/**
 * SSD: whether the proposal came from the speculation cache.
 */
hit: boolean | null, };

/**
 * The mode and K a generation runs with when none is asked for, and why.
 */
export type Choice = { mode: Mode, k: number, 
/**
 * Tokens per second over AR's, as the arithmetic expects them.
 */
expectedSpeedup: number, 
/**
 * The per-token acceptance the choice assumed.
 */
acceptance: number, costs: Costs, };

/**
 * What one placement costs, in milliseconds.
 */
export type Costs = { 
/**
 * AR's time per token: a decode, or with a server target the server's own decode (remote AR
 * pays the round trip once per generation, not per token).
 */
decodeMs: number, 
/**
 * (tokens, ms) of target forwards over a causal batch, a decode (1 token) first.
 */
verifyMs: Array<[number, number]>, 
/**
 * One draft token (0 for prompt lookup).
 */
draftStepMs: number, 
/**
 * (rows, ms) of a draft forward as wide as SSD's tree steps: timed when the draft runs beside
 * the target, else `None` (and SSD is not considered).
 */
treeStep: [number, number] | null, 
/**
 * What rounds of generations really took, per mode and K: where the arithmetic's figure is
 * off (models that slow each other down more than they did timed apart, other work on the
 * machine), the observed one replaces it.
 */
observed: Array<Observed>, 
/**
 * Whether the draft runs beside the target rather than on the same cores (SSD can overlap).
 */
parallel: boolean, };

/**
 * Milliseconds per round (AR: per token) of generations in `mode` with `k` draft tokens, averaged
 * over generations with the latest weighing half.
 */
export type Observed = { mode: Mode, k: number, roundMs: number, };

/**
 * What talking to a server target cost, over the requests since its counters were last taken.
 */
export type RemoteStats = { 
/**
 * Requests answered (each one target forward on the server).
 */
roundTrips: number, 
/**
 * Failed attempts that were sent again.
 */
retries: number, bytesSent: number, bytesReceived: number, 
/**
 * Client-side time of the answered requests, and the server's own time for them.
 */
roundTripMs: number, serverMs: number, 
/**
 * Tokens sent that the server already held in its prefix cache, and all tokens sent.
 */
cachedTokens: number, inputTokens: number, };

/**
 * What a grammar cost and saved in one generation (the `grammar` object of a generation's stats).
 */
export type GrammarStats = { 
/**
 * Output tokens the grammar forced: committed without being sampled (AR runs them with the
 * next token's forward).
 */
forcedTokens: number, 
/**
 * Masks computed (forced positions need none).
 */
masks: number, 
/**
 * Milliseconds per mask: the median and the 99th percentile.
 */
maskMsMedian: number, maskMsP99: number, };

/**
 * A function the model may call: OpenAI's `{type: 'function', function: {name, description,
 * parameters}}`, as the chat template takes it.
 */
export type Tool = { type: string, function: Function, };

export type Function = { name: string, description?: string, 
/**
 * The arguments' JSON schema (default: any object).
 */
parameters?: Record<string, unknown>, };

/**
 * A call the model made.
 */
export type ToolCall = { name: string, 
/**
 * The arguments as JSON text, as OpenAI's API gives them (and so untouched by the JS API's
 * renaming of result keys).
 */
arguments: string, };

/**
 * What an option left out means (the package's `DEFAULTS`).
 */
export type Defaults = { 
/**
 * KV-cache size in tokens (prompt + output), capped by the model.
 */
context: number, 
/**
 * Upper bound on generated tokens.
 */
maxTokens: number, 
/**
 * `threads` is one per logical core, at most this many.
 */
threadCap: number, 
/**
 * The modes a load with a draft prepares (without one: 'ar' alone).
 */
modes: Array<Mode>, 
/**
 * The modes a load with a draft and `parallel` above 1 prepares: those that run in a batch.
 */
batchModes: Array<Mode>, 
/**
 * Sequences that generate at once.
 */
parallel: number, 
/**
 * Draft tokens per round for SD and SSD.
 */
specK: number, 
/**
 * SSD's fan-out.
 */
fanout: string, 
/**
 * SSD on a cache miss.
 */
backup: Backup, 
/**
 * 0 is greedy decoding.
 */
temperature: number, 
/**
 * 0 is off.
 */
topK: number, 
/**
 * 1 is off.
 */
topP: number, seed: number, 
/**
 * A server target's likeliest tokens returned per verified position.
 */
serverTopN: number, 
/**
 * A server target's limit on one request, in ms.
 */
serverTimeoutMs: number, 
/**
 * A server target's further attempts after a failed request.
 */
serverRetries: number, 
/**
 * The wait before a server target's first retry, in ms; doubled before each further one.
 */
serverBackoffMs: number, };

/**
 * The bounds of what the package takes (its `LIMITS`).
 */
export type Limits = { 
/**
 * The most threads the `threads` option takes.
 */
maxThreads: number, 
/**
 * The largest model (a CPU model, a draft: one computed on in wasm memory), in bytes.
 */
maxModelBytes: number, 
/**
 * The most sequences the `parallel` option takes.
 */
maxParallel: number, };

/** What an option left out means. */
export declare const DEFAULTS: Readonly<Defaults>;

/** The bounds of what the package takes. */
export declare const LIMITS: Readonly<Limits>;
