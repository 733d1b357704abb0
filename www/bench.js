// Decode-speed benchmark page (see scripts/bench-browser.mjs, which drives it headless).
// Loads the same GGUF into wllama (llama.cpp compiled to wasm, single-thread build, no WebGPU)
// and into Saguaro's wasm CPU backend (its engine Web Worker, one thread), warms both up, then
// alternates greedy generations of the same raw prompt: wllama, saguaro, wllama, saguaro, ...
// Each run's decode rate excludes the prompt: Saguaro's stats.tokensPerS is (generated - 1) /
// decode time (the first token comes out of the prefill); for wllama the same definition is
// computed from llama.cpp's timings, (predicted_n - 1) / predicted_ms, which is also what this
// llama.cpp build reports as predicted_per_second (kept as reportedTokPerS). Wall-clock
// end-to-end rates (prefill included, no prompt cache on either side) are kept too, as an
// engine-independent cross-check.
// Results: window.bench = { status: 'loading' | 'running' | 'done' | 'error', runs, ... }.
const q = new URLSearchParams(location.search);
const tokens = Number(q.get('tokens') ?? 64);
const rounds = Number(q.get('rounds') ?? 2);
const warmup = Number(q.get('warmup') ?? 8);
const model = q.get('model') ?? '/models/smollm2-135m-instruct-q4_1.gguf';
const prompt =
  q.get('prompt') ??
  'The history of the printing press begins in the fifteenth century, when Johannes Gutenberg';
const only = q.get('only'); // 'wllama' or 'saguaro' to run one engine (debugging)
const verbose = q.get('verbose') === '1';

const bench = (window.bench = {
  status: 'loading',
  config: { tokens, rounds, warmup, model, prompt, only, threads: 1 },
  engines: {},
  runs: [],
  logs: [],
  error: null,
});

const logEl = document.getElementById('log');
function log(line) {
  console.log(`[bench] ${line}`);
  logEl.textContent += `${line}\n`;
}

function nativeLogger() {
  const keep = (level) => (...args) => {
    const text = args.map(String).join(' ');
    bench.logs.push(`${level}: ${text}`);
    if (verbose) console.log(`[wllama ${level}] ${text}`);
  };
  return { debug: keep('debug'), log: keep('log'), warn: keep('warn'), error: keep('error') };
}

async function loadWllama() {
  const t0 = performance.now();
  const { Wllama } = await import('/node_modules/@wllama/wllama/esm/index.js');
  const wllama = new Wllama(
    { default: '/node_modules/@wllama/wllama/esm/wasm/wllama.wasm' },
    { logger: nativeLogger(), parallelDownloads: 1 },
  );
  // A plain fetch (no OPFS cache manager); n_gpu_layers 0 keeps llama.cpp off WebGPU, and
  // n_threads 1 selects the single-thread path (no pthread pool).
  const blob = await (await fetch(model)).blob();
  await wllama.loadModel([blob], { n_threads: 1, n_gpu_layers: 0, n_ctx: 1024, n_parallel: 1 });
  const info = {
    loadMs: performance.now() - t0,
    threads: wllama.getNumThreads(),
    multithread: wllama.isMultithread(),
    libllama: Wllama.getLibllamaVersion?.() ?? null,
  };
  // llama.cpp's log says where the weights went ("CPU model buffer size = ..." without WebGPU).
  const buffers = bench.logs.filter((l) => /model buffer size/.test(l)).map((l) => l.replace(/^.*load_tensors:\s*/, '').trim());
  if (buffers.length) info.offload = buffers.join('; ');
  bench.engines.wllama = info;
  log(`wllama loaded in ${info.loadMs.toFixed(0)} ms: ${info.threads} thread(s), multithread ${info.multithread}` +
    (info.offload ? `, ${info.offload}` : ''));

  return async function run(n) {
    const t0 = performance.now();
    const r = await wllama.createCompletion({
      prompt,
      max_tokens: n,
      temperature: 0,
      top_k: 1,
      cache_prompt: false,
      stream: false,
    });
    const wallMs = performance.now() - t0;
    const t = r.timings ?? {};
    const generated = t.predicted_n ?? r.usage?.completion_tokens;
    return {
      engine: 'wllama',
      generated,
      promptTokens: t.prompt_n ?? r.usage?.prompt_tokens,
      decodeTokPerS: t.predicted_ms > 0 ? ((generated - 1) * 1000) / t.predicted_ms : null,
      reportedTokPerS: t.predicted_per_second ?? null,
      prefillMs: t.prompt_ms ?? null,
      decodeMs: t.predicted_ms ?? null,
      wallMs,
      e2eTokPerS: (generated * 1000) / wallMs,
      finish: r.choices?.[0]?.finish_reason ?? null,
      timings: t,
      text: r.choices?.[0]?.text ?? '',
    };
  };
}

async function loadSaguaro() {
  const t0 = performance.now();
  const { Saguaro } = await import('/pkg/index.js');
  const engine = await Saguaro.load(
    { target: new URL(model, location.href).href },
    { backend: 'cpu', cache: false, context: 1024, modes: ['ar'] },
  );
  const info = { loadMs: performance.now() - t0, ...engine.info };
  bench.engines.saguaro = info;
  log(`saguaro loaded in ${info.loadMs.toFixed(0)} ms: backend ${info.backend} (${info.targetBackend})`);

  return async function run(n) {
    const t0 = performance.now();
    // Every sampling option spelled out (greedy; a raw prompt, no chat template), so that the
    // run does not depend on the package's defaults (one build rejected a call without `chat`).
    const r = await engine.generate(prompt, { mode: 'ar', maxTokens: n, temperature: 0, topK: 0, topP: 1, seed: 0, chat: false });
    const wallMs = performance.now() - t0;
    const s = r.stats;
    return {
      engine: 'saguaro',
      generated: s.generated,
      promptTokens: s.promptTokens,
      decodeTokPerS: s.tokensPerS,
      reportedTokPerS: s.tokensPerS,
      prefillMs: s.prefillMs,
      decodeMs: s.decodeMs,
      wallMs,
      e2eTokPerS: (s.generated * 1000) / wallMs,
      finish: r.finish,
      text: r.text,
    };
  };
}

async function main() {
  log(`model ${model}, ${tokens} tokens, ${rounds} round(s), warm-up ${warmup} tokens, 1 thread, greedy`);
  const runners = {};
  // Load one at a time so neither load competes with the other.
  if (only !== 'saguaro') runners.wllama = await loadWllama();
  if (only !== 'wllama') runners.saguaro = await loadSaguaro();
  const order = Object.keys(runners);

  bench.status = 'running';
  if (warmup > 0) {
    for (const name of order) {
      const r = await runners[name](warmup);
      log(`warm-up ${name}: ${r.generated} tokens, ${r.decodeTokPerS?.toFixed(2)} tok/s`);
    }
  }
  for (let round = 1; round <= rounds; round++) {
    for (const name of order) {
      const r = await runners[name](tokens);
      r.round = round;
      bench.runs.push(r);
      log(`round ${round} ${name}: ${r.generated} tokens, decode ${r.decodeTokPerS?.toFixed(2)} tok/s, ` +
        `prefill ${r.prefillMs?.toFixed(0)} ms for ${r.promptTokens} tokens, finish ${r.finish}`);
    }
  }
  bench.status = 'done';
  log('done');
}

main().catch((e) => {
  bench.error = `${e?.name ?? 'Error'}${e?.code ? ` (${e.code})` : ''}: ${e?.message ?? e}`;
  bench.status = 'error';
  log(`error: ${bench.error}`);
  console.error(e);
});
