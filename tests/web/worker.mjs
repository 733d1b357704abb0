// The package's two Web Workers in Debian's Chromium, driven by playwright-core, with SmolLM2 as
// target (CPU) and draft (its own worker): an abort of an SSD generation settles within a round,
// not after the draft's discarded speculation; sampled SSD moves the draft's distributions as
// typed arrays; a draft worker that dies mid-generation ends it
// with an error that says so and the text so far, the engine keeps decoding plainly, and a new
// draft worker takes its place; with SD prepared too, the draft is downloaded once; a panic in
// the engine worker ends its calls rather than hanging them.
// Usage: node tests/web/worker.mjs   (after scripts/build-web.sh; needs models/)
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { chromium } from 'playwright-core';
import { check, golden } from './golden.mjs';
import { dropFirstQ } from './faults.mjs';

const port = 8000 + Math.floor(Math.random() * 1000);
const server = spawn('node', ['scripts/serve.mjs', '.', String(port)], { stdio: ['ignore', 'pipe', 'inherit'] });
await new Promise((resolve) => server.stdout.once('data', resolve));
const g = golden('smollm2-135m-instruct-q4_1', 0);
const timeout = 600_000;

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-background-networking', '--disable-component-update', '--no-first-run', '--disable-sync'],
});

/** Start an SSD generation of `prompt` in the page; resolves once `after` tokens have streamed. */
function startSsd(page, prompt, after) {
  return page.evaluate(
    ([prompt, after]) =>
      new Promise((started) => {
        const run = (window.run = { tokens: 0, text: '', outcome: null });
        run.ctrl = new AbortController();
        run.done = window.demo.engine
          .generate(prompt, {
            mode: 'ssd',
            maxTokens: 400,
            signal: run.ctrl.signal,
            onToken: (piece, n) => {
              run.text += piece;
              run.tokens += n;
              if (run.tokens >= after && !run.started) {
                run.started = true;
                started();
              }
            },
          })
          .then(
            (r) => (run.outcome = { ok: true, finish: r.finish, tokens: r.tokens.length, at: performance.now() }),
            (e) => (run.outcome = { code: e.code, message: e.message, partial: e.partial, at: performance.now() }),
          );
      }),
    [prompt, after],
  );
}

try {
  const page = await browser.newPage();
  page.on('console', (m) => console.log(`[page ${m.type()}] ${m.text()}`));
  page.on('pageerror', (e) => console.log(`[page error] ${e.message}`));
  const q = new URLSearchParams({ pair: 'smollm', prompt: g.prompt, autoload: '1', backend: 'cpu', draftBackend: 'cpu' });
  await page.goto(`http://127.0.0.1:${port}/www/?${q}`);
  await page.waitForFunction(() => window.demo?.engine || window.demo?.error, null, { timeout });
  const info = await page.evaluate(() => window.demo.error ?? window.demo.engine.info);
  check(info.backend === 'cpu' && info.draftWorker, `CPU target, draft in its own worker (${JSON.stringify(info)})`);

  // 1. Abort mid-SSD: the promise settles within about one round.
  const prompt = g.prompt;
  await startSsd(page, prompt, 8);
  const abort = await page.evaluate(async () => {
    const t = performance.now();
    window.run.ctrl.abort();
    await window.run.done;
    const o = window.run.outcome;
    return { code: o.code, settleMs: o.at - t, stats: o.partial?.stats };
  });
  const s = abort.stats;
  const round = (s?.verifyMsMean ?? 0) + (s?.glueMsMean ?? 0) + (s?.treeStepMsMean ?? 0);
  console.log(`metrics: SSD abort settled in ${abort.settleMs.toFixed(0)} ms (verify ${s?.verifyMsMean?.toFixed(1)} ms, ` +
    `glue ${s?.glueMsMean?.toFixed(1)} ms, tree step ${s?.treeStepMsMean?.toFixed(1)} ms)`);
  check(abort.code === 'aborted', `abort rejects with aborted (${abort.code})`);
  // One round at most: what remains of a tree step, the next proposal and one verify.
  check(abort.settleMs < 2 * round + 100, `the abort settles within a round (${abort.settleMs.toFixed(0)} ms, a round ~${round.toFixed(0)} ms)`);

  // 2. Sampled SSD: each proposal's distributions cross from the draft worker as transferred
  //    Float32Arrays; the same seed gives the same tokens.
  const draftWorker = page.workers().find((w) => w.url().endsWith('/draft-worker.js'));
  check(!!draftWorker, 'the draft worker is found');
  await draftWorker.evaluate(() => {
    const post = MessagePort.prototype.postMessage;
    self.wire = { rows: 0, plain: 0, transferred: 0 };
    MessagePort.prototype.postMessage = function (msg, transfer) {
      for (const row of msg?.q ?? []) self.wire[row instanceof Float32Array ? 'rows' : 'plain']++;
      if (Array.isArray(msg?.ok?.Proposal?.proposal?.q)) self.wire.plain += msg.ok.Proposal.proposal.q.length;
      self.wire.transferred += transfer?.length ?? 0;
      return post.call(this, msg, transfer);
    };
  });
  const sampled = await page.evaluate(async (prompt) => {
    const opts = { mode: 'ssd', maxTokens: 24, temperature: 0.8, seed: 7 };
    const a = await window.demo.engine.generate(prompt, opts);
    const b = await window.demo.engine.generate(prompt, opts);
    return { a: a.tokens, b: b.tokens, acceptance: a.stats.acceptanceRate, tps: a.stats.tokensPerS };
  }, prompt);
  const wire = await draftWorker.evaluate(() => self.wire);
  console.log(`metrics: sampled SSD ${sampled.tps.toFixed(1)} tok/s, acceptance ${sampled.acceptance.toFixed(2)}, ${wire.rows} q rows sent`);
  check(sampled.a.length === 24 && JSON.stringify(sampled.a) === JSON.stringify(sampled.b), 'sampled SSD with a seed repeats itself');
  check(wire.rows > 0 && wire.plain === 0 && wire.transferred === wire.rows,
    `sampled proposals send q as transferred Float32Arrays (${JSON.stringify(wire)})`);

  // 3. The draft worker dies mid-SSD: the generation ends with an error and its text so far.
  await startSsd(page, prompt, 8);
  const killedAt = await page.evaluate(() => performance.now());
  await draftWorker.evaluate(() => self.close()).catch(() => {});
  await page.waitForFunction(() => window.run.outcome, null, { timeout: 120_000 });
  const dead = await page.evaluate(() => ({ ...window.run.outcome, streamed: window.run.text }));
  console.log(`metrics: a dead draft worker ended the generation in ${(dead.at - killedAt).toFixed(0)} ms`);
  check(dead.code === 'internal' && dead.message.includes('draft worker stopped'),
    `a dead draft worker fails the generation, saying so (${dead.code}: ${dead.message})`);
  check(dead.partial?.generated >= 8 && dead.partial.text === dead.streamed, `error.partial holds what was streamed (${dead.partial?.generated} tokens)`);
  const ar = await page.evaluate((prompt) => window.demo.engine.generate(prompt, { mode: 'ar', maxTokens: 8 }).then((r) => r.tokens, (e) => e.code), prompt);
  check(ar.length === 8, `the engine still decodes plainly (${ar})`);
  // A new draft worker replaces it (the model comes from the Cache API); SSD fails at once
  // until it is ready, then gives the AR tokens again.
  const restart = await page.evaluate(async (prompt) => {
    const t0 = performance.now();
    const failures = new Set();
    while (performance.now() - t0 < 60_000) {
      try {
        const r = await window.demo.engine.generate(prompt, { mode: 'ssd', maxTokens: 8 });
        return { tokens: r.tokens, ms: performance.now() - t0, failures: [...failures] };
      } catch (e) {
        failures.add(e.code);
        await new Promise((r) => setTimeout(r, 200));
      }
    }
    return { failures: [...failures] };
  }, prompt);
  console.log(`metrics: SSD ran again ${restart.ms?.toFixed(0)} ms after the draft worker died`);
  check(JSON.stringify(restart.tokens) === JSON.stringify(ar) && restart.failures.every((c) => c === 'internal'),
    `a new draft worker takes over: SSD equals AR again (${JSON.stringify(restart)})`);
  check(page.workers().filter((w) => w.url().endsWith('/draft-worker.js')).length === 1, 'one draft worker runs, not two');
  // 4. With SD and SSD both prepared (the default modes), the engine worker and the draft worker
  //    each hold the draft, but each file is downloaded once, later reads coming from the Cache
  //    API. SmolLM2 drafts for itself (as in the demo's pair), so target and draft are one URL
  //    (the engine worker reads it first as the target), from a server that counts downloads.
  let draftRequests = 0;
  const model = readFileSync('models/smollm2-135m-instruct-q4_1.gguf');
  const counting = createServer((req, res) => {
    draftRequests++;
    // no-store: the browser's HTTP cache must not stand in for the package's Cache API.
    res.writeHead(200, { 'content-length': model.length, 'access-control-allow-origin': '*', 'cache-control': 'no-store' });
    res.end(model);
  });
  await new Promise((resolve) => counting.listen(0, '127.0.0.1', resolve));
  const draftUrl = `http://127.0.0.1:${counting.address().port}/draft.gguf`;
  const fresh = await browser.newContext();
  const p2 = await fresh.newPage();
  await p2.goto(`http://127.0.0.1:${port}/www/`);
  const both = await p2.evaluate(async ([prompt, draftUrl]) => {
    const { Saguaro } = await import('/pkg/index.js');
    const e = await Saguaro.load({ target: draftUrl, draft: draftUrl }, { backend: 'cpu' });
    const sd = await e.generate(prompt, { mode: 'sd', maxTokens: 8 });
    const ssd = await e.generate(prompt, { mode: 'ssd', maxTokens: 8 });
    const info = e.info;
    await e.dispose();
    return { info, sd: sd.tokens, ssd: ssd.tokens };
  }, [prompt, draftUrl]);
  check(both.info.draftWorker && JSON.stringify(both.sd) === JSON.stringify(ar) && JSON.stringify(both.ssd) === JSON.stringify(ar),
    'SD (draft in the engine worker) and SSD (draft in its worker) both equal AR');
  check(draftRequests === 1, `the model was downloaded once (${draftRequests} requests)`);
  await fresh.close();
  counting.close();

  // 5. A panic in the engine worker (here: a draft worker that sends a sampled proposal without
  //    its distributions trips verification's assertion) closes that worker: the generation and
  //    every later call reject with 'internal' instead of hanging or answering "busy".
  const liar = page.workers().find((w) => w.url().endsWith('/draft-worker.js'));
  await dropFirstQ(liar);
  const panicked = await page.evaluate(async (prompt) => {
    const e = window.demo.engine;
    const code = (p) => Promise.race([p.then(() => 'resolved', (err) => err.code), new Promise((r) => setTimeout(() => r('hung'), 30_000))]);
    const during = await code(e.generate(prompt, { mode: 'ssd', maxTokens: 16, temperature: 0.8, seed: 3 }));
    const later = await code(e.generate(prompt, { mode: 'ar', maxTokens: 4 }));
    return { during, later };
  }, prompt);
  check(panicked.during === 'internal' && panicked.later === 'internal',
    `after a panic in the engine worker, calls reject with internal (${JSON.stringify(panicked)})`);
  console.log('worker: all passed');
} finally {
  await browser.close();
  server.kill();
}
