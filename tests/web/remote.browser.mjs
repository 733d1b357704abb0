// The package in Chromium with its target on `saguaro serve` at another origin (CORS): the page's
// engine worker verifies over fetch what the SmolLM2 draft proposes, SSD's draft speculating in
// its own worker while each request is on the wire. Remote AR, SD and SSD equal the golden greedy
// ids; an abort settles; a server killed mid-generation ends it with `server_error` and the text
// so far, and the engine goes on once the server is back.
// Usage: node --test tests/web/remote.browser.mjs   (after scripts/build-web.sh and cargo build --release; needs models/)
import { spawn } from 'node:child_process';
import { after, test } from 'node:test';
import { chromium } from 'playwright-core';
import { check, golden, greedyMismatch } from './golden.mjs';
import { bin } from './native.mjs';
import { startServe } from './saguaro-serve.mjs';

const model = 'models/smollm2-135m-instruct-q4_1.gguf';
const port = 9000 + Math.floor(Math.random() * 1000);
const pages = spawn('node', ['scripts/serve.mjs', '.', String(port)], { stdio: ['ignore', 'pipe', 'inherit'] });
await new Promise((resolve) => pages.stdout.once('data', resolve));
let serve = await startServe(bin, model);
const g = golden();
const n = 24;

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-background-networking', '--disable-component-update', '--no-first-run', '--disable-sync'],
});
after(async () => {
  await browser.close();
  await serve.stop();
  pages.kill();
});
const page = await browser.newPage();
page.on('console', (m) => console.log(`[page ${m.type()}] ${m.text()}`));
page.on('pageerror', (e) => console.log(`[page error] ${e.message}`));
await page.goto(`http://127.0.0.1:${port}/www/`);
let run;

test('AR, SD and SSD through a server at another origin', async (t) => {
  run = await page.evaluate(async ([server, prompt, n]) => {
    const { Saguaro } = await import('/pkg/index.js');
    const engine = (window.engine = await Saguaro.load({ target: { server, retries: 1, timeoutMs: 20_000 }, draft: '/models/smollm2-135m-instruct-q4_1.gguf' }));
    const out = { info: engine.info };
    for (const mode of ['ar', 'sd', 'ssd']) {
      const r = await engine.generate(prompt, { mode, maxTokens: n });
      out[mode] = { tokens: r.tokens, text: r.text, stats: r.stats };
    }
    return out;
  }, [serve.url, g.prompt, n]);
  await check(t, run.info.backend === 'server' && run.info.draftWorker, `loaded with the target on the server, SSD's draft in its worker (${JSON.stringify(run.info)})`);
  await check(t, greedyMismatch(run.ar.tokens, g) === null && run.ar.tokens.length === n, `remote AR equals the golden greedy ids (${greedyMismatch(run.ar.tokens, g)})`);
  for (const mode of ['sd', 'ssd']) {
    const r = run[mode];
    await check(t, JSON.stringify(r.tokens) === JSON.stringify(run.ar.tokens) && r.text === run.ar.text, `${mode.toUpperCase()} through the server (cross-origin) equals AR`);
    await check(t, r.stats.remote.roundTrips < n * 0.75, `${mode.toUpperCase()}: ${r.stats.remote.roundTrips} requests for ${n} tokens`);
    console.log(`metrics: chromium, server target: ${mode.toUpperCase()} ${r.stats.tokensPerS.toFixed(1)} tok/s${r.stats.overlapMs !== undefined ? `, speculation overlapping the requests ${r.stats.overlapMs.toFixed(0)} of ${r.stats.targetBusyMs.toFixed(0)} ms` : ''}`);
  }
  console.log(`metrics: chromium, server target: remote AR ${run.ar.stats.tokensPerS.toFixed(1)} tok/s; default mode ${run.info.defaultMode}`);
  await check(t, run.ssd.stats.overlapMs > 0, `SSD's draft speculates while the request is on the wire (${run.ssd.stats.overlapMs} ms)`);
});

// An abort settles promptly; a server that dies mid-generation ends it with what it had.
const counting = 'Count from 1 to 500, one number per line: 1, 2, 3,';

test('an abort settles', async (t) => {
  const aborted = await page.evaluate(async (prompt) => {
    const ctrl = new AbortController();
    let at = null;
    const p = window.engine.generate(prompt, { mode: 'ssd', maxTokens: 300, signal: ctrl.signal, onToken: () => { if (at === null) { at = performance.now(); ctrl.abort(); } } });
    const code = await p.then(() => 'resolved', (e) => e.code);
    return { code, ms: performance.now() - at };
  }, counting);
  await check(t, aborted.code === 'aborted' && aborted.ms < 5000, `an abort settles (${JSON.stringify(aborted)})`);});

test('a server killed mid-generation, then restarted', async (t) => {
  const started = page.evaluate((prompt) => {
    window.dying = { tokens: 0 };
    window.dying.done = window.engine
      .generate(prompt, { mode: 'ssd', maxTokens: 300, onToken: (_, k) => (window.dying.tokens += k) })
      .then(() => ({ code: 'resolved' }), (e) => ({ code: e.code, message: e.message, partial: e.partial }));
  }, counting);
  await started;
  await page.waitForFunction(() => window.dying.tokens >= 8, null, { timeout: 120_000 });
  await serve.stop();
  const died = await page.evaluate(() => window.dying.done);
  await check(t, died.code === 'server_error' && died.partial?.generated >= 8 && died.partial.text.length > 0,
    `a server killed mid-generation: server_error with the text so far (${died.message}; ${died.partial?.generated} tokens)`);
  serve = await startServe(bin, model, serve.url.replace('http://', ''));
  const again = await page.evaluate(([prompt, n]) => window.engine.generate(prompt, { mode: 'ssd', maxTokens: n }).then((r) => r.tokens, (e) => e.message), [g.prompt, n]);
  await check(t, JSON.stringify(again) === JSON.stringify(run.ar.tokens), `the server restarted: the engine generates again, equal to AR (${JSON.stringify(again)})`);
});
