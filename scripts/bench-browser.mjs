// Side-by-side decode benchmark in headless Chromium: wllama (npm @wllama/wllama, llama.cpp
// compiled to wasm, its single-thread build with WebGPU off) against Saguaro's wasm CPU backend
// (pkg/, simd128 kernels, its engine Web Worker), both on ONE thread, on the same file
// models/smollm2-135m-instruct-q4_1.gguf, greedy decoding of the same raw prompt, the same number
// of generated tokens. Both are loaded once and warmed up, then runs alternate (wllama, saguaro,
// wllama, saguaro, ...). The figure compared is the decode rate with the prompt processing
// excluded: (generated - 1) / decode time for both (Saguaro's stats.tokensPerS; for wllama the
// same from llama.cpp's timings). The ratio saguaro/wllama is given per round and for the medians;
// the project's goal is saguaro >= 2x wllama at 1 thread.
//
// Machines differ and the project's machines have 2 cores shared with other processes, so only
// the ratios within one run mean anything; absolute tok/s are not comparable between runs.
//
// Usage: node scripts/bench-browser.mjs [--tokens N] [--rounds N] [--json]
//        (also --warmup N, --prompt TEXT, --model /models/FILE.gguf, --only wllama|saguaro, --verbose)
// Needs: pkg/ (scripts/build-web.sh), models/ (scripts/fetch-models.sh), npm ci (playwright-core,
// @wllama/wllama), Debian's /usr/bin/chromium (or CHROMIUM=path). The page is www/bench.html.
import { spawn, execSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { createServer } from 'node:net';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const args = process.argv.slice(2);
function opt(name, fallback) {
  const i = args.indexOf(`--${name}`);
  return i >= 0 && i + 1 < args.length ? args[i + 1] : fallback;
}
const json = args.includes('--json');
const verbose = args.includes('--verbose');
const tokens = Number(opt('tokens', 64));
const rounds = Number(opt('rounds', 2));
const warmup = Number(opt('warmup', 8));
const model = opt('model', '/models/smollm2-135m-instruct-q4_1.gguf');
const prompt = opt('prompt', null);
const only = opt('only', null);
const timeoutMs = Number(opt('timeout', 45 * 60)) * 1000;
const err = (s) => process.stderr.write(`${s}\n`);

if (!Number.isInteger(tokens) || tokens < 2 || !Number.isInteger(rounds) || rounds < 1) {
  err('usage: node scripts/bench-browser.mjs [--tokens N>=2] [--rounds N>=1] [--json]');
  process.exit(2);
}
if (!existsSync(join(root, model))) {
  err(`missing ${model}: run scripts/fetch-models.sh`);
  process.exit(1);
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

async function freePort() {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

const port = await freePort();
const server = spawn(process.execPath, [join(root, 'scripts/serve.mjs'), root, String(port)], {
  stdio: ['ignore', 'pipe', 'inherit'],
});
await new Promise((resolve, reject) => {
  server.stdout.once('data', resolve);
  server.once('exit', (code) => reject(new Error(`server exited with ${code}`)));
});

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-background-networking', '--disable-component-update', '--no-first-run',
    '--disable-sync', '--enable-unsafe-webgpu'],
});

let result;
const chromiumVersion = browser.version();
let failure = null;
try {
  const page = await browser.newPage();
  page.on('console', (m) => {
    const t = m.text();
    if (t.startsWith('[bench] ')) err(t);
    else if (verbose || m.type() === 'error') err(`[page ${m.type()}] ${t}`);
  });
  page.on('pageerror', (e) => err(`[page error] ${e.message}`));
  const q = new URLSearchParams({ tokens: String(tokens), rounds: String(rounds), warmup: String(warmup), model });
  if (prompt !== null) q.set('prompt', prompt);
  if (only) q.set('only', only);
  if (verbose) q.set('verbose', '1');
  await page.goto(`http://127.0.0.1:${port}/www/bench.html?${q}`);
  await page.waitForFunction(() => window.bench && ['done', 'error'].includes(window.bench.status), null, {
    timeout: timeoutMs,
    polling: 1000,
  });
  result = await page.evaluate(() => {
    const { logs, ...rest } = window.bench;
    return { ...rest, wllamaLogTail: logs.slice(-20) };
  });
  if (result.status === 'error') failure = `page error: ${result.error}`;
} catch (e) {
  failure = e.message;
} finally {
  await browser.close().catch(() => {});
  server.kill();
}

if (failure) {
  err(`FAIL: ${failure}`);
  if (/\/pkg\//.test(failure)) err('hint: pkg/ missing or being rebuilt (scripts/build-web.sh deletes it first); run again once pkg/index.js is back');
  if ((verbose || !result?.engines?.wllama) && result?.wllamaLogTail?.length) err(`last wllama log lines:\n  ${result.wllamaLogTail.join('\n  ')}`);
  process.exit(1);
}

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};
const rate = (name) => result.runs.filter((r) => r.engine === name).map((r) => r.decodeTokPerS);
const w = rate('wllama');
const s = rate('saguaro');
const perRound = [];
for (let i = 0; i < Math.min(w.length, s.length); i++) perRound.push(s[i] / w[i]);
const summary = {
  wllamaMedian: w.length ? median(w) : null,
  saguaroMedian: s.length ? median(s) : null,
  ratioMedians: w.length && s.length ? median(s) / median(w) : null,
  ratioPerRound: perRound,
};
summary.goal2xMet = summary.ratioMedians === null ? null : summary.ratioMedians >= 2;
const runs = result.runs;
const texts = new Set(runs.map((r) => r.text));
const counts = new Set(runs.map((r) => r.generated));
const notes = [];
if (counts.size > 1) notes.push(`generated counts differ between runs: ${[...counts].join(', ')} (an early end of sequence?)`);
if (runs.some((r) => r.generated < tokens)) notes.push(`some runs stopped before ${tokens} tokens (finish: ${[...new Set(runs.map((r) => r.finish))].join(', ')})`);
const sameText = texts.size === 1;
// Greedy on the same weights: the texts should agree, up to near-ties that the two engines'
// different arithmetic can break either way. Say where they first part. (The default prompt has
// one after "... inventor, created": llama.cpp gives " the" -0.8074 and " a" -0.8118 logprob;
// wllama takes " the", Saguaro " a". Every step decodes one token either way.)
let textNote = null;
if (!sameText) {
  const a = runs.find((r) => r.engine === 'wllama')?.text ?? '';
  const b = runs.find((r) => r.engine === 'saguaro')?.text ?? '';
  let i = 0;
  while (i < a.length && i < b.length && a[i] === b[i]) i++;
  const per = (name) => new Set(runs.filter((r) => r.engine === name).map((r) => r.text)).size <= 1;
  textNote = `wllama runs agree: ${per('wllama') ? 'yes' : 'no'}; saguaro runs agree: ${per('saguaro') ? 'yes' : 'no'}; ` +
    `wllama and saguaro agree on the first ${i} characters, then ${JSON.stringify(a.slice(i, i + 24))} vs ${JSON.stringify(b.slice(i, i + 24))}`;
}
const bad = runs.filter((r) => !(r.decodeTokPerS > 0) || !(r.generated >= 2));
if (bad.length) notes.push(`${bad.length} run(s) without a decode rate`);

const machine = { isa: isa || 'none of avx2/avx512', cores, chromium: chromiumVersion };
if (json) {
  console.log(JSON.stringify({ machine, config: result.config, engines: result.engines, runs, summary, sameText, textNote, notes }, null, 2));
} else {
  const f = (x, d = 2) => (typeof x === 'number' && Number.isFinite(x) ? x.toFixed(d) : '-');
  const c = result.config;
  console.log(`CPU ISA: ${machine.isa}; ${cores} cores, shared with other processes: compare the ratios within this run, not absolute tok/s across runs`);
  console.log(`model ${c.model}; ${runs[0]?.promptTokens ?? '?'} prompt tokens; ${c.tokens} generated tokens requested; greedy; 1 thread each; warm-up ${c.warmup} tokens`);
  if (result.engines.wllama) {
    const e = result.engines.wllama;
    console.log(`wllama: ${e.threads} thread, multithread ${e.multithread}${e.offload ? `, ${e.offload}` : ''}, load ${f(e.loadMs, 0)} ms`);
  }
  if (result.engines.saguaro) {
    const e = result.engines.saguaro;
    console.log(`saguaro: backend ${e.backend} (${e.targetBackend}), load ${f(e.loadMs, 0)} ms`);
  }
  console.log('');
  const rows = [['round', 'engine', 'generated', 'decode tok/s', 'prefill ms', 'e2e tok/s', 'finish']];
  for (const r of runs) rows.push([String(r.round), r.engine, String(r.generated), f(r.decodeTokPerS), f(r.prefillMs, 0), f(r.e2eTokPerS), String(r.finish)]);
  const widths = rows[0].map((_, j) => Math.max(...rows.map((row) => row[j].length)));
  for (const row of rows) console.log(row.map((x, j) => (j < 2 ? x.padEnd(widths[j]) : x.padStart(widths[j]))).join('  '));
  console.log('');
  if (perRound.length) console.log(`ratio saguaro/wllama per round: ${perRound.map((x) => `${f(x)}x`).join(', ')}`);
  console.log(`median decode tok/s: wllama ${f(summary.wllamaMedian)}, saguaro ${f(summary.saguaroMedian)}; ratio ${f(summary.ratioMedians)}x` +
    (summary.goal2xMet === null ? '' : ` (goal >= 2x: ${summary.goal2xMet ? 'met' : 'not met'})`));
  console.log(`same generated text in every run: ${sameText ? 'yes' : `no (${textNote})`}`);
  for (const n of notes) console.log(`note: ${n}`);
}
process.exit(bad.length ? 1 : 0);
