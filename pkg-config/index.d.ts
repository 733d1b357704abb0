// The types Rust knows (options, results, info, defaults, limits, error codes) are generated from
// it: contract.generated.d.ts. This file adds what only the package has.
import type {
  Backend,
  EngineGenerateOptions,
  EngineInfoBase,
  EngineLoadOptions,
  ErrorCode,
  GenerateResult,
  Mode,
  ServerTarget,
  Stats,
  Tool,
} from './contract.generated.js';

export * from './contract.generated.js';

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

export interface LoadOptions extends EngineLoadOptions {
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
}

export interface GenerateOptions extends EngineGenerateOptions {
  /** Stops the generation at its next round (SSD's draft worker drops its speculation at once);
   * the promise rejects with code 'aborted' and the result so far in `partial`. */
  signal?: AbortSignal;
  /** Called once per round with the new text (never half a character; may be empty when a
   * character is still incomplete) and the number of tokens the round added. */
  onToken?: (piece: string, tokens: number) => void;
}

export interface ChatMessage {
  role: 'system' | 'user' | 'assistant' | 'tool';
  /** `null` for an assistant turn that only called tools. */
  content: string | null;
  /** An assistant turn's calls, as a chat completion returned them. */
  tool_calls?: ChatToolCall[];
}

/** A call as OpenAI's API writes it: the arguments as JSON text. */
export interface ChatToolCall {
  id: string;
  type: 'function';
  function: { name: string; arguments: string };
}

export type Prompt = string | { messages: ChatMessage[] };

export interface EngineInfo extends EngineInfoBase {
  /** 'server' for a server target. */
  backend: Backend | 'server';
  draftBackend: Backend | null;
  /** Whether the draft runs in its own Web Worker (serving SSD, and SD with it). */
  draftWorker: boolean;
}

/** OpenAI's `response_format`, as `GenerateOptions.responseFormat` takes it. */
export type ResponseFormat = NonNullable<EngineGenerateOptions['responseFormat']>;

export interface ChatCompletionRequest {
  messages: ChatMessage[];
  max_tokens?: number;
  temperature?: number;
  top_p?: number;
  seed?: number;
  stream?: boolean;
  mode?: Mode;
  signal?: AbortSignal;
  /** The output's format (OpenAI's: text, any JSON object, or a JSON schema); the engine's
   * `responseFormat`. An invalid schema rejects with code 'invalid_grammar'. */
  response_format?: ResponseFormat | null;
  /** A Lark grammar the output matches (`GenerateOptions.grammar`; not OpenAI's). */
  grammar?: string;
  /** A regular expression the whole output matches (`GenerateOptions.regex`; not OpenAI's). */
  regex?: string;
  /** Functions the model may call (a model whose chat template lists tools, such as Qwen2.5):
   * each call's arguments follow its schema, and a reply that calls ends with 'tool_calls'. */
  tools?: Tool[];
  tool_choice?: EngineGenerateOptions['toolChoice'];
  /** Choices to generate (default 1), choice i sampling with seed + i; in one batch where the
   * engine was loaded with `parallel` of at least n, else one after another. */
  n?: number;
}

export interface ChatCompletion {
  id: string;
  object: 'chat.completion';
  created: number;
  model: string;
  choices: {
    index: number;
    message: { role: 'assistant'; content: string | null; tool_calls?: (ChatToolCall & { index: number })[] };
    finish_reason: 'stop' | 'length' | 'tool_calls';
  }[];
  usage: { prompt_tokens: number; completion_tokens: number; total_tokens: number };
  /** The first choice's statistics. */
  stats: Stats;
}

export interface ChatCompletionChunk {
  id: string;
  object: 'chat.completion.chunk';
  created: number;
  model: string;
  choices: {
    index: number;
    delta: { role?: 'assistant'; content?: string; tool_calls?: (ChatToolCall & { index: number })[] };
    finish_reason: 'stop' | 'length' | 'tool_calls' | null;
  }[];
  /** On the last chunk; with n above 1, on a last chunk of its own whose `choices` is empty. */
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
