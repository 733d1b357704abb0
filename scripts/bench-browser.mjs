// Side-by-side decode benchmark in headless Chromium: wllama (npm @wllama/wllama, llama.cpp
// compiled to wasm, WebGPU off) against Saguaro's wasm CPU backend (pkg/, its engine Web Worker),
// each at the same thread counts (default 1 and 2), on the same GGUF files (default SmolLM2 135M
// Q4_1 and Qwen2.5-Coder 0.5B), greedy decoding of the same raw prompt, the same number of
// generated tokens. The page is cross-origin isolated (COOP/COEP, as scripts/serve.mjs serves
// every page), which both need for more than one thread: wllama's pthreads build, our
// threads build (a pool of workers sharing wasm memory; 1 thread loads the single-thread build).
// Per model all engines are loaded once (one at a time) and warmed up, then runs alternate
// (wllama 1 thread, saguaro 1 thread, wllama 2 threads, saguaro 2 threads, ...), so that the
// machine's load falls on all of them alike. The figure compared is the decode rate with the
// prompt processing excluded: (generated - 1) / decode time for both (Saguaro's stats.tokensPerS;
// for wllama the same from llama.cpp's timings). Medians over the rounds; the goals checked:
// saguaro at N threads >= 2x wllama at N threads, and saguaro at 2 threads >= 1.7x saguaro at 1.
//
// Machines differ and the project's machines have 2 cores shared with other processes, so only
// the ratios within one run mean anything; absolute tok/s are not comparable between runs.
//
// Usage: node scripts/bench-browser.mjs [--models smollm2,qwen0.5b] [--threads 1,2] [--tokens N]
//        [--rounds N] [--json]   (also --warmup N, --prompt TEXT, --model /models/FILE.gguf for one
//        other file, --only wllama|saguaro, --verbose)
// Needs: pkg/ (scripts/build-web.sh), models/ (scripts/fetch-models.sh), npm ci (playwright-core,
// @wllama/wllama), Debian's /usr/bin/chromium (or CHROMIUM=path).
import { spawn, execSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { createServer, request } from 'node:http';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const args = process.argv.slice(2);
function opt(name, fallback) {
  const i = args.indexOf(`--${name}`);
  return i >= 0 && i + 1 < args.length ? args[i + 1] : fallback;
}
const MODELS = {
  smollm2: '/models/smollm2-135m-instruct-q4_1.gguf',
  'qwen0.5b': '/models/qwen2.5-coder-0.5b-instruct.gguf',
};
const json = args.includes('--json');
const verbose = args.includes('--verbose');
const tokens = Number(opt('tokens', 64));
const rounds = Number(opt('rounds', 2));
const warmup = Number(opt('warmup', 8));
const models = opt('model', null) ? [opt('model')] : opt('models', 'smollm2,qwen0.5b').split(',').map((m) => MODELS[m] ?? m);
const threads = opt('threads', '1,2').split(',').map(Number);
const prompt = opt('prompt', 'The history of the printing press begins in the fifteenth century, when Johannes Gutenberg');
const only = opt('only', null);
const err = (s) => process.stderr.write(`${s}\n`);

if (!Number.isInteger(tokens) || tokens < 2 || !Number.isInteger(rounds) || rounds < 1 || !threads.every((t) => Number.isInteger(t) && t >= 1)) {
  err('usage: node scripts/bench-browser.mjs [--models smollm2,qwen0.5b] [--threads 1,2] [--tokens N>=2] [--rounds N>=1] [--json]');
  process.exit(2);
}
for (const m of models) {
  if (!existsSync(join(root, m))) {
    err(`missing ${m}: run scripts/fetch-models.sh`);
    process.exit(1);
  }
}
if (only !== 'wllama' && !existsSync(join(root, 'pkg/index.js'))) {
  err('missing pkg/index.js: run scripts/build-web.sh');
  process.exit(1);
}

let isa = '';
try {
  isa = execSync("grep -o 'avx512[a-z_]*\\|avx2' /proc/cpuinfo | sort -u", { encoding: 'utf8' }).trim().split('\n').join(' ');
} catch {}
let cores = '?';
try {
  cores = execSync('nproc', { encoding: 'utf8' }).trim();
} catch {}

// The demo server (cross-origin isolated), and in front of it a proxy that answers /bench.html
// with an empty page, isolated alike, to run the benchmark in.
const upstream = await new Promise((resolve, reject) => {
  const s = createServer();
  s.listen(0, '127.0.0.1', () => {
    const { port } = s.address();
    s.close(() => resolve(port));
  });
  s.once('error', reject);
});
const server = spawn(process.execPath, [join(root, 'scripts/serve.mjs'), root, String(upstream)], { stdio: ['ignore', 'pipe', 'inherit'] });
await new Promise((resolve, reject) => {
  server.stdout.once('data', resolve);
  server.once('exit', (code) => reject(new Error(`server exited with ${code}`)));
});
const ISOLATION = { 'cross-origin-opener-policy': 'same-origin', 'cross-origin-embedder-policy': 'require-corp' };
const proxy = createServer((req, res) => {
  if (req.url === '/bench.html') {
    res.writeHead(200, { 'content-type': 'text/html; charset=utf-8', ...ISOLATION });
    return res.end('<!doctype html><meta charset="utf-8"><link rel="icon" href="data:,"><title>bench</title>');
  }
  const up = request({ host: '127.0.0.1', port: upstream, path: req.url, method: req.method, headers: req.headers }, (r) => {
    res.writeHead(r.statusCode, r.headers);
    r.pipe(res);
  });
  up.on('error', () => res.destroy());
  req.pipe(up);
});
await new Promise((resolve) => proxy.listen(0, '127.0.0.1', resolve));

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-background-networking', '--disable-component-update', '--no-first-run', '--disable-sync'],
});
const chromiumVersion = browser.version();

/** In the page: load the engine `name` ('wllama' | 'saguaro') on `threads` threads with `model`;
 * it is kept as window.engines[key]. Returns what it says about itself. */
async function loadEngine({ key, name, threads, model }) {
  window.engines ??= {};
  window.wllamaLogs ??= [];
  const t0 = performance.now();
  if (name === 'wllama') {
    const { Wllama } = await import('/node_modules/@wllama/wllama/esm/index.js');
    const keep = (level) => (...a) => window.wllamaLogs.push(`${level}: ${a.map(String).join(' ')}`);
    const logger = { debug: keep('debug'), log: keep('log'), warn: keep('warn'), error: keep('error') };
    const wllama = new Wllama({ default: '/node_modules/@wllama/wllama/esm/wasm/wllama.wasm' }, { logger, parallelDownloads: 1 });
    // A plain fetch (no OPFS cache manager); n_gpu_layers 0 keeps llama.cpp off WebGPU.
    const blob = await (await fetch(model)).blob();
    await wllama.loadModel([blob], { n_threads: threads, n_gpu_layers: 0, n_ctx: 1024, n_parallel: 1 });
    window.engines[key] = async (prompt, n) => {
      const t = performance.now();
      const r = await wllama.createCompletion({ prompt, max_tokens: n, temperature: 0, top_k: 1, cache_prompt: false, stream: false });
      const wallMs = performance.now() - t;
      const tm = r.timings ?? {};
      const generated = tm.predicted_n ?? r.usage?.completion_tokens;
      return {
        generated,
        promptTokens: tm.prompt_n ?? r.usage?.prompt_tokens,
        decodeTokPerS: tm.predicted_ms > 0 ? ((generated - 1) * 1000) / tm.predicted_ms : null,
        prefillMs: tm.prompt_ms ?? null,
        e2eTokPerS: (generated * 1000) / wallMs,
        finish: r.choices?.[0]?.finish_reason ?? null,
        text: r.choices?.[0]?.text ?? '',
      };
    };
    window.engines[`${key}:dispose`] = () => wllama.exit();
    return { loadMs: performance.now() - t0, threads: wllama.getNumThreads(), multithread: wllama.isMultithread() };
  }
  const { Saguaro } = await import('/pkg/index.js');
  const engine = await Saguaro.load({ target: new URL(model, location.href).href }, { backend: 'cpu', cache: false, context: 1024, modes: ['ar'], threads });
  window.engines[key] = async (prompt, n) => {
    const t = performance.now();
    // Every sampling option spelled out: greedy, a raw prompt (no chat template).
    const r = await engine.generate(prompt, { mode: 'ar', maxTokens: n, temperature: 0, topK: 0, topP: 1, seed: 0, chat: false });
    const wallMs = performance.now() - t;
    const s = r.stats;
    return {
      generated: s.generated,
      promptTokens: s.promptTokens,
      decodeTokPerS: s.tokensPerS,
      prefillMs: s.prefillMs,
      e2eTokPerS: (s.generated * 1000) / wallMs,
      finish: r.finish,
      text: r.text,
    };
  };
  window.engines[`${key}:dispose`] = () => engine.dispose();
  return { loadMs: performance.now() - t0, threads: engine.info.threads, targetBackend: engine.info.targetBackend };
}

const names = ['wllama', 'saguaro'].filter((n) => !only || n === only);
const results = [];
let failure = null;
try {
  const page = await browser.newPage();
  page.on('console', (m) => {
    if (verbose || m.type() === 'error') err(`[page ${m.type()}] ${m.text()}`);
  });
  page.on('pageerror', (e) => err(`[page error] ${e.message}`));
  await page.goto(`http://127.0.0.1:${proxy.address().port}/bench.html`);
  if (!(await page.evaluate(() => crossOriginIsolated))) throw new Error('the bench page is not cross-origin isolated');
  for (const model of models) {
    const engines = {};
    const order = [];
    // Load one at a time so that no load competes with another.
    for (const t of threads) {
      for (const name of names) {
        const key = `${name}@${t}`;
        engines[key] = { name, requested: t, ...(await page.evaluate(loadEngine, { key, name, threads: t, model })) };
        order.push(key);
        err(`[bench] ${model}: ${key} loaded in ${engines[key].loadMs.toFixed(0)} ms (${engines[key].targetBackend ?? `${engines[key].threads} thread(s), multithread ${engines[key].multithread}`})`);
      }
    }
    const runOne = (key, n) => page.evaluate(([key, prompt, n]) => window.engines[key](prompt, n), [key, prompt, n]);
    if (warmup > 0) for (const key of order) await runOne(key, warmup);
    const runs = [];
    for (let round = 1; round <= rounds; round++) {
      for (const key of order) {
        const r = { model, round, engine: key, ...(await runOne(key, tokens)) };
        runs.push(r);
        err(`[bench] ${model} round ${round} ${key}: ${r.generated} tokens, decode ${r.decodeTokPerS?.toFixed(2)} tok/s, prefill ${r.prefillMs?.toFixed(0)} ms`);
      }
    }
    for (const key of order) await page.evaluate((key) => window.engines[`${key}:dispose`](), key);
    results.push({ model, engines, runs });
  }
} catch (e) {
  failure = e.message;
} finally {
  await browser.close().catch(() => {});
  proxy.close();
  server.kill();
}
if (failure) {
  err(`FAIL: ${failure}`);
  if (/\/pkg\//.test(failure)) err('hint: pkg/ missing or being rebuilt (scripts/build-web.sh deletes it first); run again once pkg/index.js is back');
  process.exit(1);
}

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length ? (s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2) : null;
};
const f = (x, d = 2) => (typeof x === 'number' && Number.isFinite(x) ? x.toFixed(d) : '-');
const machine = { isa: isa || 'none of avx2/avx512', cores, chromium: chromiumVersion };
let bad = 0;
const summaries = results.map(({ model, engines, runs }) => {
  const med = Object.fromEntries(Object.keys(engines).map((k) => [k, median(runs.filter((r) => r.engine === k).map((r) => r.decodeTokPerS))]));
  const goals = [];
  for (const t of threads) {
    if (med[`saguaro@${t}`] && med[`wllama@${t}`]) goals.push({ goal: `saguaro ${t}T >= 2x wllama ${t}T`, ratio: med[`saguaro@${t}`] / med[`wllama@${t}`], target: 2 });
  }
  for (const t of threads.filter((t) => t > 1)) {
    if (med[`saguaro@${t}`] && med['saguaro@1']) goals.push({ goal: `saguaro ${t}T >= 1.7x saguaro 1T`, ratio: med[`saguaro@${t}`] / med['saguaro@1'], target: 1.7 });
  }
  for (const g of goals) g.met = g.ratio >= g.target;
  const texts = new Set(runs.filter((r) => r.engine.startsWith('saguaro')).map((r) => r.text));
  bad += runs.filter((r) => !(r.decodeTokPerS > 0) || !(r.generated >= 2)).length;
  return { model, engines, medians: med, goals, saguaroSameText: texts.size <= 1 };
});

if (json) {
  console.log(JSON.stringify({ machine, config: { tokens, rounds, warmup, threads, prompt }, results, summaries }, null, 2));
} else {
  console.log(`CPU ISA: ${machine.isa}; ${cores} cores, shared with other processes: compare the ratios within this run, not absolute tok/s across runs`);
  console.log(`Chromium ${machine.chromium}, cross-origin isolated; ${tokens} generated tokens, greedy, ${rounds} round(s), warm-up ${warmup} tokens; decode tok/s (prefill excluded), medians`);
  for (const s of summaries) {
    console.log('');
    console.log(`${s.model}:`);
    const rows = [['engine', 'threads', 'decode tok/s', 'per round', 'load ms']];
    for (const [k, e] of Object.entries(s.engines)) {
      const per = results.find((r) => r.model === s.model).runs.filter((r) => r.engine === k).map((r) => f(r.decodeTokPerS, 1)).join(' ');
      rows.push([`${e.name}${e.targetBackend ? ` (${e.targetBackend})` : e.multithread ? ' (pthreads)' : ''}`, String(e.threads), f(s.medians[k]), per, f(e.loadMs, 0)]);
    }
    const widths = rows[0].map((_, j) => Math.max(...rows.map((row) => row[j].length)));
    for (const row of rows) console.log(`  ${row.map((x, j) => (j === 0 ? x.padEnd(widths[j]) : x.padStart(widths[j]))).join('  ')}`);
    for (const g of s.goals) console.log(`  ${g.goal}: ${f(g.ratio)}x (${g.met ? 'met' : 'not met'})`);
    if (!s.saguaroSameText) console.log('  note: saguaro runs differ in text between thread counts or rounds');
  }
}
process.exit(bad ? 1 : 0);
