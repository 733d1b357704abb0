// The package's two Web Workers in Debian's Chromium, driven by playwright-core, with SmolLM2 as
// target (CPU) and draft (its own worker, serving SSD and SD): SD drafts through the draft worker
// and equals AR; an abort of an SSD or SD generation settles within a round, not after the
// draft's discarded speculation; sampled SSD and SD move the draft's distributions as typed
// arrays; a draft worker that dies mid-generation (SSD or SD) ends it with an error that says so
// and the text so far, the engine keeps decoding plainly, and a new draft worker takes its place;
// with SD and SSD prepared the draft is downloaded and held once (the engine worker never reads
// it), SD through the worker giving the in-process drafter's tokens seed for seed; sampled SSD and
// SD give the native engine's tokens for their seed; an engine with `parallel` runs two calls at
// once in its worker; a panic in the engine worker ends its calls rather than hanging them.
// Usage: node --test tests/web/worker.mjs   (after scripts/build-web.sh and cargo build --release
// --bin saguaro; needs models/)
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { after, test } from 'node:test';
import { chromium } from 'playwright-core';
import { check, golden, greedyMismatch } from './golden.mjs';
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
after(async () => {
  await browser.close();
  server.kill();
});

/** Start a generation of `prompt` in `mode` in the page; resolves once `after` tokens have
 * streamed. */
function start(page, prompt, after, mode = 'ssd') {
  return page.evaluate(
    ([prompt, after, mode]) =>
      new Promise((started) => {
        const run = (window.run = { tokens: 0, text: '', outcome: null });
        run.ctrl = new AbortController();
        run.done = window.demo.engine
          .generate(prompt, {
            mode,
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
    [prompt, after, mode],
  );
}

/** Abort the generation `start` began; how it ended and how soon. */
function abortRun(page) {
  return page.evaluate(async () => {
    const t = performance.now();
    window.run.ctrl.abort();
    await window.run.done;
    const o = window.run.outcome;
    return { code: o.code, settleMs: o.at - t, stats: o.partial?.stats };
  });
}

/** Count, in the draft worker `worker`, the replies it posts: SD drafts and SSD proposals, their
 * distributions as Float32Arrays (`rows`) or left in the reply as plain numbers (`plain`), and the
 * buffers transferred. */
function watchReplies(worker) {
  return worker.evaluate(() => {
    const post = MessagePort.prototype.postMessage;
    self.wire = { drafted: 0, proposals: 0, rows: 0, plain: 0, transferred: 0 };
    MessagePort.prototype.postMessage = function (msg, transfer) {
      const ok = msg?.reply?.ok;
      if (ok?.Drafted) self.wire.drafted++;
      if (ok?.Proposal) self.wire.proposals++;
      for (const row of msg?.q ?? []) self.wire[row instanceof Float32Array ? 'rows' : 'plain']++;
      self.wire.plain += (ok?.Drafted ?? ok?.Proposal)?.proposal?.q?.length ?? 0;
      self.wire.transferred += transfer?.length ?? 0;
      return post.call(this, msg, transfer);
    };
  });
}

const wireOf = (worker) => worker.evaluate(() => ({ ...self.wire }));
const reset = (worker) => worker.evaluate(() => Object.keys(self.wire).forEach((k) => (self.wire[k] = 0)));
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
/** Mean ms of an SD round's drafting, as the engine saw it (the worker's round trip included). */
const draftMs = (stats) => stats.timeline.reduce((a, r) => a + (r.draft[1] - r.draft[0]), 0) / stats.timeline.length;

const model = 'models/smollm2-135m-instruct-q4_1.gguf';
const page = await browser.newPage();
page.on('console', (m) => console.log(`[page ${m.type()}] ${m.text()}`));
page.on('pageerror', (e) => console.log(`[page error] ${e.message}`));
const q = new URLSearchParams({ pair: 'smollm', prompt: g.prompt, autoload: '1', backend: 'cpu', draftBackend: 'cpu', modes: 'ar,sd,ssd' });
await page.goto(`http://127.0.0.1:${port}/www/?${q}`);
await page.waitForFunction(() => window.demo?.engine || window.demo?.error, null, { timeout });
const prompt = g.prompt;
let draftWorker, ar;

test('the demo loads the draft into its own worker', async (t) => {
  const info = await page.evaluate(() => window.demo.error ?? window.demo.engine.info);
  await check(t, info.backend === 'cpu' && info.draftWorker && /^cpu \(/.test(info.draftDevice ?? ''), `CPU target, draft in its own worker on the CPU (${JSON.stringify(info)})`);
  draftWorker = page.workers().find((w) => w.url().endsWith('/draft-worker.js'));
  await check(t, !!draftWorker, 'the draft worker is found');
  await watchReplies(draftWorker);
});

test('SD drafts through the draft worker', async (t) => {
  // 1. SD drafts through the draft worker (the engine worker holds no draft): greedy SD equals
  //    the golden ids and AR, each round's tokens a reply from the draft worker.
  const greedy = await page.evaluate(async (prompt) => {
    const e = window.demo.engine;
    const sd = await e.generate(prompt, { mode: 'sd', maxTokens: 24 });
    const ar = await e.generate(prompt, { mode: 'ar', maxTokens: 24 });
    return { sd: sd.tokens, rounds: sd.stats.rounds, tps: sd.stats.tokensPerS, ar: ar.tokens };
  }, prompt);
  const drafted = await wireOf(draftWorker);
  console.log(`metrics: greedy SD through the draft worker ${greedy.tps.toFixed(1)} tok/s, ${greedy.rounds} rounds`);
  // Two empty outputs would also match each other and the golden prefix: all 24 tokens must come.
  await check(t, greedy.sd.length === 24 && greedyMismatch(greedy.sd, g) === null && JSON.stringify(greedy.sd) === JSON.stringify(greedy.ar),
    `greedy SD through the draft worker gives 24 tokens, equal to AR and the golden ids (${greedy.sd.length} tokens; ${greedyMismatch(greedy.sd, g)})`);
  await check(t, drafted.drafted === greedy.rounds && drafted.proposals === 0, `each SD round's draft came from the draft worker (${JSON.stringify(drafted)})`);
});

test('an abort settles within a round', async (t) => {
  // 2. Abort mid-SSD and mid-SD: the promise settles within about one round.
  await start(page, prompt, 8);
  const abort = await abortRun(page);
  const s = abort.stats;
  const round = (s?.verifyMsMean ?? 0) + (s?.glueMsMean ?? 0) + (s?.treeStepMsMean ?? 0);
  console.log(`metrics: SSD abort settled in ${abort.settleMs.toFixed(0)} ms (verify ${s?.verifyMsMean?.toFixed(1)} ms, ` +
    `glue ${s?.glueMsMean?.toFixed(1)} ms, tree step ${s?.treeStepMsMean?.toFixed(1)} ms)`);
  await check(t, abort.code === 'aborted', `abort rejects with aborted (${abort.code})`);
  // One round at most: what remains of a tree step, the next proposal and one verify.
  await check(t, abort.settleMs < 2 * round + 100, `the abort settles within a round (${abort.settleMs.toFixed(0)} ms, a round ~${round.toFixed(0)} ms)`);
  await start(page, prompt, 8, 'sd');
  const sdAbort = await abortRun(page);
  const sdRound = (sdAbort.stats?.verifyMsMean ?? 0) + (sdAbort.stats ? draftMs(sdAbort.stats) : 0);
  console.log(`metrics: SD abort settled in ${sdAbort.settleMs.toFixed(0)} ms (a round ~${sdRound.toFixed(0)} ms)`);
  await check(t, sdAbort.code === 'aborted' && sdAbort.settleMs < 2 * sdRound + 100,
    `an SD abort settles within a round (${sdAbort.code}, ${sdAbort.settleMs.toFixed(0)} ms, a round ~${sdRound.toFixed(0)} ms)`);
});

test('sampled SSD and SD', async (t) => {
  // 3. Sampled SSD and SD: each proposal's distributions cross from the draft worker as
  //    transferred Float32Arrays; the same seed gives the same tokens.
  await reset(draftWorker);
  const sampled = await page.evaluate(async (prompt) => {
    const out = {};
    for (const mode of ['ssd', 'sd']) {
      const opts = { mode, maxTokens: 24, temperature: 0.8, seed: 7 };
      const a = await window.demo.engine.generate(prompt, opts);
      const b = await window.demo.engine.generate(prompt, opts);
      out[mode] = { a: a.tokens, b: b.tokens, acceptance: a.stats.acceptanceRate, tps: a.stats.tokensPerS };
    }
    return out;
  }, prompt);
  const wire = await wireOf(draftWorker);
  for (const mode of ['ssd', 'sd']) {
    const r = sampled[mode];
    console.log(`metrics: sampled ${mode.toUpperCase()} ${r.tps.toFixed(1)} tok/s, acceptance ${r.acceptance.toFixed(2)}`);
    await check(t, r.a.length === 24 && JSON.stringify(r.a) === JSON.stringify(r.b), `sampled ${mode.toUpperCase()} with a seed repeats itself`);
  }
  console.log(`metrics: ${wire.rows} q rows sent`);
  await check(t, wire.drafted > 0 && wire.proposals > 0 && wire.rows > 0 && wire.plain === 0 && wire.transferred === wire.rows,
    `sampled SD and SSD proposals send q as transferred Float32Arrays (${JSON.stringify(wire)})`);
});

test('a dead draft worker', async (t) => {
  // 4. The draft worker dies mid-SSD, then (its replacement) mid-SD: each generation ends with an
  //    error and its text so far; the engine decodes plainly meanwhile, and a new draft worker
  //    replaces each (the model comes from the Cache API): SSD and SD fail at once until it is
  //    ready, then give the AR tokens again.
  for (const mode of ['ssd', 'sd']) {
    const victim = page.workers().find((w) => w.url().endsWith('/draft-worker.js'));
    await start(page, prompt, 8, mode);
    const killedAt = await page.evaluate(() => performance.now());
    await victim.evaluate(() => self.close()).catch(() => {});
    await page.waitForFunction(() => window.run.outcome, null, { timeout: 120_000 });
    const dead = await page.evaluate(() => ({ ...window.run.outcome, streamed: window.run.text }));
    console.log(`metrics: a dead draft worker ended the ${mode.toUpperCase()} generation in ${(dead.at - killedAt).toFixed(0)} ms`);
    await check(t, dead.code === 'internal' && dead.message.includes('draft worker stopped'),
      `${mode.toUpperCase()}: a dead draft worker fails the generation, saying so (${dead.code}: ${dead.message})`);
    await check(t, dead.partial?.generated >= 8 && dead.partial.text === dead.streamed, `${mode.toUpperCase()}: error.partial holds what was streamed (${dead.partial?.generated} tokens)`);
    ar = await page.evaluate((prompt) => window.demo.engine.generate(prompt, { mode: 'ar', maxTokens: 8 }).then((r) => r.tokens, (e) => e.code), prompt);
    await check(t, ar.length === 8, `the engine still decodes plainly (${ar})`);
    const restart = await page.evaluate(async (prompt) => {
      const t0 = performance.now();
      const failures = new Set();
      const out = {};
      while (performance.now() - t0 < 60_000 && !out.sd) {
        try {
          for (const mode of ['ssd', 'sd']) out[mode] ??= (await window.demo.engine.generate(prompt, { mode, maxTokens: 8 })).tokens;
        } catch (e) {
          failures.add(e.code);
          await new Promise((r) => setTimeout(r, 200));
        }
      }
      return { ...out, ms: performance.now() - t0, failures: [...failures] };
    }, prompt);
    console.log(`metrics: SSD and SD ran again ${restart.ms.toFixed(0)} ms after the draft worker died`);
    await check(t, JSON.stringify(restart.ssd) === JSON.stringify(ar) && JSON.stringify(restart.sd) === JSON.stringify(ar) && restart.failures.every((c) => c === 'internal'),
      `a new draft worker takes over: SSD and SD equal AR again (${JSON.stringify(restart)})`);
    // The closed worker goes once its compute threads (on an isolated page) have ended too.
    const drafts = () => page.workers().filter((w) => w.url().endsWith('/draft-worker.js')).length;
    for (let i = 0; i < 50 && drafts() > 1; i++) await new Promise((r) => setTimeout(r, 200));
    await check(t, drafts() === 1, 'one draft worker runs, not two');
  }
});

test('one copy of the draft', async (t) => {
  // 5. One copy of the draft: with SD and SSD prepared (the default modes), the draft is read by
  //    its worker alone. Target and draft (SmolLM2 drafting for itself) come from two URLs of a
  //    server that counts the requests for each, with the Cache API off, so that every read is a
  //    download. An engine with SD alone holds the draft in its engine worker: SD through the
  //    draft worker gives that in-process drafter's tokens, greedy and sampled seed for seed, and
  //    the difference in pace is what a round's trip to the draft worker costs.
  const requests = {};
  const bytes = readFileSync(model);
  const counting = createServer((req, res) => {
    requests[req.url] = (requests[req.url] ?? 0) + 1;
    // no-store: the browser's HTTP cache must not stand in for the package's Cache API.
    res.writeHead(200, { 'content-length': bytes.length, 'access-control-allow-origin': '*', 'cache-control': 'no-store' });
    res.end(bytes);
  });
  await new Promise((resolve) => counting.listen(0, '127.0.0.1', resolve));
  const base = `http://127.0.0.1:${counting.address().port}`;
  const fresh = await browser.newContext();
  const p2 = await fresh.newPage();
  p2.on('console', (m) => console.log(`[page ${m.type()}] ${m.text()}`));
  await p2.goto(`http://127.0.0.1:${port}/www/`);
  const models = { target: `${base}/target.gguf`, draft: `${base}/draft.gguf` };
  const loaded = await p2.evaluate(async (models) => {
    const { Saguaro } = await import('/pkg/index.js');
    window.viaWorker = await Saguaro.load(models, { backend: 'cpu', cache: false });
    return window.viaWorker.info;
  }, models);
  await check(t, loaded.draftWorker && loaded.hasDraft, `SD and SSD prepared, the draft in its worker (${JSON.stringify(loaded)})`);
  await check(t, requests['/target.gguf'] === 1 && requests['/draft.gguf'] === 1,
    `the draft is downloaded once, by the draft worker alone (${JSON.stringify(requests)})`);
  const one = await p2.evaluate(async ([models, prompt]) => {
    const { Saguaro } = await import('/pkg/index.js');
    const w = window.viaWorker;
    const local = await Saguaro.load(models, { backend: 'cpu', cache: false, modes: ['ar', 'sd'] });
    const out = { chosen: await w.generate(prompt, { maxTokens: 8 }), localInfo: local.info, pace: { worker: [], local: [] } };
    for (const [name, e] of [['worker', w], ['local', local]]) {
      out[name] = {
        greedy: (await e.generate(prompt, { mode: 'sd', maxTokens: 24 })).tokens,
        sampled: (await e.generate(prompt, { mode: 'sd', maxTokens: 24, temperature: 0.8, seed: 11 })).tokens,
      };
    }
    out.ar = (await w.generate(prompt, { mode: 'ar', maxTokens: 24 })).tokens;
    // Alternated, so that other work on the machine weighs on both alike.
    for (let i = 0; i < 3; i++) {
      for (const [name, e] of [['worker', w], ['local', local]]) {
        const r = await e.generate(prompt, { mode: 'sd', maxTokens: 48 });
        out.pace[name].push({ tps: r.stats.tokensPerS, timeline: r.stats.timeline, verifyMsMean: r.stats.verifyMsMean, busy: r.stats.draftBusyMs });
      }
    }
    await local.dispose();
    await w.dispose();
    return out;
  }, [models, prompt]);
  await check(t, requests['/draft.gguf'] === 2 && one.localInfo.draftWorker === false, `an engine with SD alone reads the draft itself (${JSON.stringify(requests)})`);
  const auto = one.chosen.stats.auto;
  await check(t, auto?.costs?.draftStepMs > 0 && auto.costs.decodeMs > 0,
    `the engine chose its mode from the draft's step timed in the draft worker (${auto?.mode} k=${auto?.k}, draft step ${auto?.costs?.draftStepMs?.toFixed(1)} ms)`);
  await check(t, JSON.stringify(one.worker.greedy) === JSON.stringify(one.ar) && JSON.stringify(one.local.greedy) === JSON.stringify(one.ar),
    'greedy SD through the draft worker and with the draft in the engine worker both equal AR');
  await check(t, JSON.stringify(one.worker.sampled) === JSON.stringify(one.local.sampled),
    `sampled SD through the draft worker gives the in-process drafter's tokens, seed for seed (${one.worker.sampled} / ${one.local.sampled})`);
  const pace = (name) => ({
    tps: median(one.pace[name].map((p) => p.tps)),
    draft: median(one.pace[name].map((p) => draftMs(p))),
    verify: median(one.pace[name].map((p) => p.verifyMsMean)),
  });
  const [viaWorker, local] = [pace('worker'), pace('local')];
  // What the engine waited for its draft tokens less what the worker spent drafting them.
  const runs = one.pace.worker;
  const trip = runs.reduce((a, p) => a + draftMs(p) * p.timeline.length - p.busy, 0) / runs.reduce((a, p) => a + p.timeline.length, 0);
  console.log(`metrics: SmolLM2 SD (K=4), medians of 3: through the draft worker ${viaWorker.tps.toFixed(1)} tok/s, drafting ${viaWorker.draft.toFixed(1)} ms/round ` +
    `(of which ${trip.toFixed(2)} ms the trip to the worker), verify ${viaWorker.verify.toFixed(1)} ms; ` +
    `draft in the engine worker ${local.tps.toFixed(1)} tok/s, drafting ${local.draft.toFixed(1)} ms/round, verify ${local.verify.toFixed(1)} ms`);
  await check(t, trip >= 0 && trip < 50, `a round's trip to the draft worker is short (${trip.toFixed(2)} ms)`);
  await fresh.close();

  // The demo's pair drafts with the target's own file: with the Cache API it is downloaded once,
  // the draft worker reading it after the engine worker has.
  for (const k of Object.keys(requests)) delete requests[k];
  const p3 = await (await browser.newContext()).newPage();
  await p3.goto(`http://127.0.0.1:${port}/www/`);
  const same = await p3.evaluate(async ([url, prompt]) => {
    const { Saguaro } = await import('/pkg/index.js');
    const e = await Saguaro.load({ target: url, draft: url }, { backend: 'cpu' });
    const sd = await e.generate(prompt, { mode: 'sd', maxTokens: 8 });
    const ssd = await e.generate(prompt, { mode: 'ssd', maxTokens: 8 });
    const info = e.info;
    await e.dispose();
    return { info, sd: sd.tokens, ssd: ssd.tokens };
  }, [`${base}/model.gguf`, prompt]);
  await check(t, same.info.draftWorker && JSON.stringify(same.sd) === JSON.stringify(ar) && JSON.stringify(same.ssd) === JSON.stringify(ar),
    'one file as target and draft: SD and SSD (both drafting in the draft worker) equal AR');
  await check(t, requests['/model.gguf'] === 1, `one file as target and draft is downloaded once (${JSON.stringify(requests)})`);
  await p3.context().close();
  counting.close();
});

test('parallel: calls at once in the engine worker', async (t) => {
  // 7. An engine loaded with `parallel` runs calls made together in one batch in its worker (the
  //    draft there too, for SD): their pieces interleave, and each gives its output alone.
  const other = 'def fibonacci(n):';
  const out = await page.evaluate(async ([url, prompts]) => {
    const { Saguaro } = await import('/pkg/index.js');
    const alone = [];
    for (const p of prompts) alone.push((await window.demo.engine.generate(p, { mode: 'ar', maxTokens: 24 })).tokens);
    const e = await Saguaro.load({ target: url, draft: url }, { backend: 'cpu', parallel: 2 });
    const order = [];
    const rs = await Promise.all(prompts.map((p, i) => e.generate(p, { maxTokens: 24, onToken: () => order.push(i) })));
    const info = e.info;
    await e.dispose();
    return { info, alone, together: rs.map((r) => r.tokens), modes: rs.map((r) => r.stats.mode), order: order.join('') };
  }, [`/${model}`, [prompt, other]]);
  await check(t, out.info.parallel === 2 && out.info.hasDraft && !out.info.draftWorker, `2 sequences, the draft in the engine worker (${JSON.stringify(out.info)})`);
  await check(t, JSON.stringify(out.together) === JSON.stringify(out.alone), `2 calls at once (${out.modes}) each equal their AR output alone`);
  await check(t, out.order.indexOf('1') < out.order.lastIndexOf('0'), `their pieces interleave (${out.order})`);
});

test('a panic in the engine worker', async (t) => {
  // 6. A panic in the engine worker (here: a draft worker that sends a sampled proposal without
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
  await check(t, panicked.during === 'internal' && panicked.later === 'internal',
    `after a panic in the engine worker, calls reject with internal (${JSON.stringify(panicked)})`);
});
