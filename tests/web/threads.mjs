// The threads build in Debian's Chromium, driven by playwright-core: on a cross-origin isolated
// page (COOP/COEP) the CPU backend computes on a pool of workers sharing wasm memory, and its
// greedy output equals the golden ids and the single-thread build's; SD and SSD (the target on the
// pool, the draft in its own worker on a pool of its own, drafting for both) equal AR; an abort
// still stops a generation; a panic still ends the engine's calls; on a page that is not
// isolated the engine says why in the console and computes on one thread.
// Usage: node --test tests/web/threads.mjs   (after scripts/build-web.sh; needs models/)
import { spawn } from 'node:child_process';
import { createServer, request } from 'node:http';
import { after, test } from 'node:test';
import { chromium } from 'playwright-core';
import { check, golden, greedyMismatch } from './golden.mjs';
import { dropFirstQ } from './faults.mjs';

const ISOLATION = {
  'cross-origin-opener-policy': 'same-origin',
  'cross-origin-embedder-policy': 'require-corp',
  'cross-origin-resource-policy': 'same-origin',
};

/** A proxy in front of the demo server that sets (`isolate`) or removes the isolation headers,
 * whatever the server sends. */
function proxy(upstream, isolate) {
  const server = createServer((req, res) => {
    const up = request({ host: '127.0.0.1', port: upstream, path: req.url, method: req.method, headers: req.headers }, (r) => {
      const headers = { ...r.headers };
      for (const h of Object.keys(ISOLATION)) delete headers[h];
      res.writeHead(r.statusCode, isolate ? { ...headers, ...ISOLATION } : headers);
      r.pipe(res);
    });
    up.on('error', () => res.destroy());
    req.pipe(up);
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve({ server, port: server.address().port })));
}

const port = 8000 + Math.floor(Math.random() * 1000);
const demo = spawn('node', ['scripts/serve.mjs', '.', String(port)], { stdio: ['ignore', 'pipe', 'inherit'] });
await new Promise((resolve) => demo.stdout.once('data', resolve));
const isolated = await proxy(port, true);
const plain = await proxy(port, false);
const g = golden('smollm2-135m-instruct-q4_1', 0);
const model = '/models/smollm2-135m-instruct-q4_1.gguf';
const n = 24;

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-background-networking', '--disable-component-update', '--no-first-run', '--disable-sync'],
});
after(async () => {
  await browser.close();
  demo.kill();
  isolated.server.close();
  plain.server.close();
});

/** In the page: load `models` with `opts`, run `gens` ([name, generate options]); the info and
 * each run's tokens, text and rate. */
function run(page, models, opts, gens) {
  return page.evaluate(
    async ([models, opts, gens]) => {
      const { Saguaro } = await import('/pkg/index.js');
      const e = await Saguaro.load(models, opts);
      const out = { info: e.info, runs: {} };
      try {
        for (const [name, o] of gens) {
          const r = await e.generate(o.prompt, { ...o, prompt: undefined });
          out.runs[name] = { tokens: r.tokens, text: r.text, tps: r.stats.tokensPerS, mode: r.stats.mode };
        }
        // An abort stops a generation on the pool too.
        const ctrl = new AbortController();
        let seen = 0;
        const code = await e
          .generate(gens[0][1].prompt, { mode: 'ar', maxTokens: 400, signal: ctrl.signal, onToken: (_, k) => (seen += k) >= 4 && ctrl.abort() })
          .then(() => 'resolved', (err) => err.code);
        out.abort = { code, seen };
      } finally {
        await e.dispose();
      }
      return out;
    },
    [models, opts, gens],
  );
}

const page = await browser.newPage();
page.on('console', (m) => console.log(`[page ${m.type()}] ${m.text()}`));
page.on('pageerror', (e) => console.log(`[page error] ${e.message}`));
await page.goto(`http://127.0.0.1:${isolated.port}/www/`);
const ar = (extra = {}) => ['ar', { prompt: g.prompt, mode: 'ar', maxTokens: n, ...extra }];
let one;

test('AR on a pool of 2 threads', async (t) => {
  await check(t, await page.evaluate(() => crossOriginIsolated), 'the page is cross-origin isolated (COOP/COEP)');
  // 1. AR on the pool (2 threads) against the golden ids, and against the single-thread build.
  const two = await run(page, { target: model }, { backend: 'cpu', threads: 2, modes: ['ar'], cache: false }, [ar()]);
  one = await run(page, { target: model }, { backend: 'cpu', threads: 1, modes: ['ar'], cache: false }, [ar()]);
  console.log(`metrics: chromium wasm CPU AR: ${one.runs.ar.tps.toFixed(1)} tok/s on 1 thread, ${two.runs.ar.tps.toFixed(1)} on 2`);
  await check(t, two.info.threads === 2 && /\b2 threads\b/.test(two.info.targetBackend),
    `threads: 2 runs the threads build on a pool of 2 (${two.info.targetBackend}, info.threads ${two.info.threads})`);
  await check(t, one.info.threads === 1 && /\b1 threads\b/.test(one.info.targetBackend), `threads: 1 runs the single-thread build (${one.info.targetBackend})`);
  const miss = greedyMismatch(two.runs.ar.tokens, g);
  await check(t, miss === null && two.runs.ar.tokens.length === n, `2 threads: AR equals the golden greedy ids (${miss})`);
  await check(t, JSON.stringify(two.runs.ar.tokens) === JSON.stringify(one.runs.ar.tokens) && two.runs.ar.text === one.runs.ar.text,
    '2 threads: the same tokens and text as the single-thread build');
  await check(t, two.abort.code === 'aborted' && two.abort.seen < 50, `2 threads: an abort stops the generation (${JSON.stringify(two.abort)})`);
});

test('SD and SSD with a pooled target', async (t) => {
  // 2. With a draft: the target on the engine worker's pool, the draft in its own worker on a
  //    pool of its own, drafting for SD and SSD alike; both equal AR.
  const spec = await run(page, { target: model, draft: model }, { backend: 'cpu', threads: 2, cache: false },
    [ar(), ['sd', { prompt: g.prompt, mode: 'sd', maxTokens: n }], ['ssd', { prompt: g.prompt, mode: 'ssd', maxTokens: n }]]);
  await check(t, spec.info.threads === 2 && spec.info.draftWorker, `with a draft: the engine on 2 threads, the draft in its worker (${JSON.stringify(spec.info)})`);
  await check(t, JSON.stringify(spec.runs.ar.tokens) === JSON.stringify(one.runs.ar.tokens), 'with a draft: AR equals the single-thread build');
  await check(t, JSON.stringify(spec.runs.sd.tokens) === JSON.stringify(spec.runs.ar.tokens) && spec.runs.sd.mode === 'sd', 'SD with a pooled target, drafting in the draft worker, equals AR');
  await check(t, JSON.stringify(spec.runs.ssd.tokens) === JSON.stringify(spec.runs.ar.tokens) && spec.runs.ssd.mode === 'ssd', 'SSD with a pooled target equals AR');
});

test('the default thread count', async (t) => {
  // 3. The default thread count (hardwareConcurrency, capped) uses the pool where there is more
  //    than one core.
  const { cores, cap } = await page.evaluate(async () => {
    const { DEFAULTS } = await import('/pkg/index.js');
    return { cores: navigator.hardwareConcurrency, cap: DEFAULTS.threadCap };
  });
  const auto = await run(page, { target: model }, { backend: 'cpu', modes: ['ar'], cache: false }, [ar()]);
  await check(t, auto.info.threads === Math.min(cores, cap) && JSON.stringify(auto.runs.ar.tokens) === JSON.stringify(one.runs.ar.tokens),
    `by default ${Math.min(cores, cap)} threads (${cores} cores, at most ${cap}), the same tokens`);
});

test("a panic on the engine's thread", async (t) => {
  // 4. A panic on the engine's thread (a draft worker that sends a sampled proposal without its
  //    distributions trips verification's assertion) still closes the engine worker, its compute
  //    threads with it: the generation and every later call reject with 'internal'.
  // An earlier engine's draft worker may still be winding down (its compute threads ending): the
  // liar is the draft worker this load started.
  const before = new Set(page.workers());
  await page.evaluate(async (model) => {
    const { Saguaro } = await import('/pkg/index.js');
    window.spec = await Saguaro.load({ target: model, draft: model }, { backend: 'cpu', threads: 2, cache: false });
  }, model);
  const liar = page.workers().find((w) => w.url().endsWith('/draft-worker.js') && !before.has(w));
  await check(t, !!liar, 'the draft worker is found');
  await dropFirstQ(liar);
  const panicked = await page.evaluate(async (prompt) => {
    const e = window.spec;
    const code = (p) => Promise.race([p.then(() => 'resolved', (err) => err.code), new Promise((r) => setTimeout(() => r('hung'), 30_000))]);
    const during = await code(e.generate(prompt, { mode: 'ssd', maxTokens: 16, temperature: 0.8, seed: 3 }));
    const later = await code(e.generate(prompt, { mode: 'ar', maxTokens: 4 }));
    await e.dispose();
    return { during, later };
  }, g.prompt);
  await check(t, panicked.during === 'internal' && panicked.later === 'internal',
    `2 threads: after a panic in the engine worker, calls reject with internal (${JSON.stringify(panicked)})`);
});

test('a page that is not cross-origin isolated', async (t) => {
  // 5. Not isolated: one thread, and a console note that says why.
  const p2 = await browser.newPage();
  const plainNotes = [];
  p2.on('console', (m) => plainNotes.push(m.text()));
  await p2.goto(`http://127.0.0.1:${plain.port}/www/`);
  await check(t, !(await p2.evaluate(() => crossOriginIsolated)), 'a page served without COOP/COEP is not isolated');
  const single = await run(p2, { target: model }, { backend: 'cpu', threads: 2, modes: ['ar'], cache: false }, [ar()]);
  await check(t, single.info.threads === 1 && JSON.stringify(single.runs.ar.tokens) === JSON.stringify(one.runs.ar.tokens),
    `not isolated: threads: 2 computes on one thread (${single.info.targetBackend}), the same tokens`);
  await check(t, plainNotes.some((t) => /not cross-origin isolated/.test(t)), 'not isolated: a console note says why');
});
