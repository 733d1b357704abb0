// SD with its draft in the draft worker (the package's placement whenever SSD is prepared too:
// one copy of the draft, in its own Web Worker) against SD with the draft in the engine worker
// (modes ['ar', 'sd']: no draft worker), in headless Chromium, the target on the wasm CPU
// backend. Both engines are loaded in one page and their runs alternate, so that the machine's
// load falls on both alike; each run is greedy (or sampled with --sampled, one seed per round,
// the same for both) SD with K = 4 from the same prompt. scripts/serve.mjs serves the page cross-
// origin isolated, so both workers compute on pools of `--threads` threads (default: the
// package's, one per core up to 8). A round's trip to the draft worker is
// the time the engine waited for its draft tokens (the timeline's draft spans) less the time the
// worker drafted them (stats.draftBusyMs), averaged over every round of every run. With --ssd,
// SSD runs too (the draft worker's engine), alternated with the others: AR, SD and SSD with both
// models on CPU workers with their own threads.
//
// Machines differ and the project's machines have 2 cores shared with other processes, so only
// figures within one run mean anything.
//
// Usage: node scripts/bench-draft-worker.mjs [--pair qwen|smollm] [--tokens N] [--rounds N]
//        [--threads N] [--sampled] [--ssd] [--json]
// Needs: pkg/ (scripts/build-web.sh), models/ (scripts/fetch-models.sh), npm ci (playwright-core),
// Debian's /usr/bin/chromium (or CHROMIUM=path).
import { spawn } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const args = process.argv.slice(2);
function opt(name, fallback) {
  const i = args.indexOf(`--${name}`);
  return i >= 0 && i + 1 < args.length ? args[i + 1] : fallback;
}
const PAIRS = {
  qwen: { target: '/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf', draft: '/models/qwen2.5-coder-0.5b-instruct.gguf' },
  smollm: { target: '/models/smollm2-135m-instruct-q4_1.gguf', draft: '/models/smollm2-135m-instruct-q4_1.gguf' },
};
const pair = opt('pair', 'smollm');
if (!PAIRS[pair]) throw new Error(`--pair: one of ${Object.keys(PAIRS).join(', ')}`);
const tokens = Number(opt('tokens', pair === 'qwen' ? 32 : 64));
const rounds = Number(opt('rounds', 5));
const sampled = args.includes('--sampled');
const withSsd = args.includes('--ssd');
const threads = opt('threads') && Number(opt('threads'));
const prompt = 'def quicksort(arr):\n    """Sort a list with quicksort."""\n';

const port = 7000 + Math.floor(Math.random() * 1000);
const server = spawn('node', ['scripts/serve.mjs', '.', String(port)], { cwd: root, stdio: ['ignore', 'pipe', 'inherit'] });
await new Promise((resolve) => server.stdout.once('data', resolve));
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-background-networking', '--disable-component-update', '--no-first-run', '--disable-sync'],
});
try {
  const page = await browser.newPage();
  page.on('pageerror', (e) => console.log(`[page error] ${e.message}`));
  await page.goto(`http://127.0.0.1:${port}/www/`);
  const out = await page.evaluate(async ([models, prompt, tokens, rounds, sampled, threads, withSsd]) => {
    const { Saguaro } = await import('/pkg/index.js');
    const opts = { backend: 'cpu', cache: false, ...(threads && { threads }) };
    const engines = {
      worker: await Saguaro.load(models, opts),
      local: await Saguaro.load(models, { ...opts, modes: ['ar', 'sd'] }),
    };
    const res = { info: engines.worker.info, runs: { worker: [], local: [] }, ssd: [] };
    res.ar = (await engines.worker.generate(prompt, { mode: 'ar', maxTokens: tokens })).stats.tokensPerS;
    for (let i = 0; i < rounds; i++) {
      const order = i % 2 ? ['local', 'worker'] : ['worker', 'local'];
      for (const name of order) {
        const opts = { mode: 'sd', maxTokens: tokens, specK: 4, ...(sampled && { temperature: 0.8, seed: i }) };
        const r = await engines[name].generate(prompt, opts);
        const waited = r.stats.timeline.reduce((a, t) => a + (t.draft[1] - t.draft[0]), 0);
        res.runs[name].push({ tps: r.stats.tokensPerS, rounds: r.stats.rounds, waited, busy: r.stats.draftBusyMs, verify: r.stats.verifyMsMean, acceptance: r.stats.acceptanceRate, tokens: r.tokens });
      }
      if (withSsd) {
        const opts = { mode: 'ssd', maxTokens: tokens, specK: 4, ...(sampled && { temperature: 0.8, seed: i }) };
        const r = await engines.worker.generate(prompt, opts);
        res.ssd.push({ tps: r.stats.tokensPerS, tokens: r.tokens });
      }
    }
    for (const e of Object.values(engines)) await e.dispose();
    return res;
  }, [PAIRS[pair], prompt, tokens, rounds, sampled, threads, withSsd]);

  const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
  const sum = (xs) => xs.reduce((a, b) => a + b, 0);
  const summary = { pair, tokens, rounds, sampled, threads: out.info.threads, arTokensPerS: out.ar };
  for (const name of ['worker', 'local']) {
    const r = out.runs[name];
    const n = sum(r.map((x) => x.rounds));
    summary[name] = {
      tokensPerS: median(r.map((x) => x.tps)),
      draftMsPerRound: sum(r.map((x) => x.waited)) / n,
      verifyMs: median(r.map((x) => x.verify)),
      acceptance: sum(r.map((x) => x.acceptance)) / r.length,
    };
    if (name === 'worker') summary.tripMsPerRound = (sum(r.map((x) => x.waited)) - sum(r.map((x) => x.busy))) / n;
  }
  summary.sameTokens = out.runs.worker.every((x, i) => JSON.stringify(x.tokens) === JSON.stringify(out.runs.local[i].tokens));
  if (withSsd) {
    // Greedy, SSD gives SD's tokens (both are AR's).
    const same = sampled || out.ssd.every((x, i) => JSON.stringify(x.tokens) === JSON.stringify(out.runs.worker[i].tokens));
    summary.ssd = { tokensPerS: median(out.ssd.map((x) => x.tps)), runs: out.ssd.map((x) => x.tps), sameTokensAsSd: same };
  }
  if (args.includes('--json')) console.log(JSON.stringify(summary));
  else {
    const f = (x) => x.toFixed(2);
    console.log(`${pair}, ${tokens} tokens, ${rounds} alternated rounds, ${sampled ? 'sampled' : 'greedy'}, ${out.info.threads} threads; AR ${f(out.ar)} tok/s`);
    for (const name of ['worker', 'local']) {
      const s = summary[name];
      console.log(`SD, draft in the ${name === 'worker' ? 'draft worker ' : 'engine worker'}: ${f(s.tokensPerS)} tok/s (median; runs ${out.runs[name].map((x) => f(x.tps)).join(' ')}), ` +
        `drafting ${s.draftMsPerRound.toFixed(1)} ms/round, verify ${s.verifyMs.toFixed(1)} ms, acceptance ${f(s.acceptance)}`);
    }
    if (withSsd) {
      console.log(`SSD, draft in the draft worker: ${f(summary.ssd.tokensPerS)} tok/s (median; runs ${summary.ssd.runs.map(f).join(' ')})` +
        `${sampled ? '' : `, the same tokens as SD: ${summary.ssd.sameTokensAsSd}`}`);
    }
    console.log(`a round's trip to the draft worker: ${summary.tripMsPerRound.toFixed(2)} ms; the same tokens in both placements: ${summary.sameTokens}`);
  }
} finally {
  await browser.close();
  server.kill();
}
