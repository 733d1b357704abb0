// Where the package keeps models, in Debian's Chromium driven by playwright-core: every store
// (OPFS, the Cache API, none) keeps SmolLM2 as it downloads and gives it back with the same
// tokens; Saguaro.cache lists and removes what is kept; a file changed at its source is fetched
// again; a store without room (before the download, or midway: the engine worker's
// navigator.storage.estimate() and store writes stubbed to a small quota) is left out with a
// warning and no half file, the load going on; a file of no announced size is kept; `hf:` names
// resolve against a local stand-in for the hub (tests/web/hub.mjs); a model cut into three files
// gives the whole file's tokens on the CPU and streamed onto WebGPU, and a missing part is
// refused by name.
// Usage: node --test tests/web/storage.mjs   (after scripts/build-web.sh; needs models/)
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { after, before, test } from 'node:test';
import { chromium } from 'playwright-core';
import { golden, greedyMismatch } from './golden.mjs';
import { splitGguf, startHub } from './hub.mjs';

const MODEL = 'smollm2-135m-instruct-q4_1';
const g = golden(MODEL, 0);
const N = 8;
const whole = readFileSync(`models/${MODEL}.gguf`);
const MB = 1e6;

let server, browser, page, hub, origin;
/** Warnings the page and its workers printed. */
const warnings = [];

before(async () => {
  const port = 8000 + Math.floor(Math.random() * 1000);
  server = spawn('node', ['scripts/serve.mjs', '.', String(port)], { stdio: ['ignore', 'pipe', 'inherit'] });
  await new Promise((resolve) => server.stdout.once('data', resolve));
  origin = `http://127.0.0.1:${port}`;
  hub = await startHub({ unsized: ['test/unsized'] });
  hub.put('test/smol', 'main', `${MODEL}.gguf`, whole);
  hub.put('test/smol', 'v2', `sub/${MODEL}.gguf`, whole);
  hub.put('test/unsized', 'main', `${MODEL}.gguf`, whole);
  splitGguf(whole, 3).forEach((part, i) => hub.put('test/split', 'main', `smol-${String(i + 1).padStart(5, '0')}-of-00003.gguf`, part));
  splitGguf(whole, 3).slice(0, 2).forEach((part, i) => hub.put('test/gap', 'main', `smol-${String(i + 1).padStart(5, '0')}-of-00003.gguf`, part));
  browser = await chromium.launch({
    executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
    args: ['--enable-unsafe-webgpu', '--no-sandbox', '--disable-background-networking', '--disable-component-update', '--no-first-run', '--disable-sync'],
  });
  const context = await browser.newContext();
  page = await context.newPage();
  const note = (m) => {
    if (m.type() === 'warning') warnings.push(m.text());
    if (process.env.VERBOSE) console.log(`[page ${m.type()}] ${m.text()}`);
  };
  page.on('console', note);
  await page.goto(`${origin}/www/`);
  await page.evaluate(async () => (window.pkg = await import('/pkg/index.js')));
});

after(async () => {
  await browser?.close();
  server?.kill();
  await hub?.close();
});

/** Load `target` on the CPU (or `opts.backend`), generate N greedy tokens, dispose. Resolves to
 * {tokens, fromCache (per role and part), error}. */
function run(target, opts = {}) {
  return page.evaluate(
    async ([target, opts, n, prompt]) => {
      const fromCache = {};
      try {
        const e = await window.pkg.Saguaro.load(
          { target },
          { backend: 'cpu', threads: 1, modes: ['ar'], ...opts, onProgress: (p) => p.phase === 'download' && (fromCache[p.part ?? 1] = p.fromCache) },
        );
        const r = await e.generate(prompt, { mode: 'ar', maxTokens: n });
        await e.dispose();
        return { tokens: r.tokens, fromCache };
      } catch (e) {
        return { error: { code: e.code, message: e.message } };
      }
    },
    [target, opts, N, g.prompt],
  );
}

const list = () => page.evaluate(() => window.pkg.Saguaro.cache.list());
const clear = () => page.evaluate(() => window.pkg.Saguaro.cache.clear());
const gets = (path) => hub.requests[`GET ${path}`] ?? 0;
const hf = (path = `${MODEL}.gguf`, repo = 'test/smol') => `hf:${repo}/${path}`;
const cdnPath = (repo, revision, path) => `/cdn/${encodeURIComponent(`${repo}@${revision}/${path}`)}`;
const smolCdn = cdnPath('test/smol', 'main', `${MODEL}.gguf`);

function expectGolden(r, what) {
  assert.equal(r.error, undefined, `${what}: ${JSON.stringify(r.error)}`);
  assert.equal(r.tokens.length, N, what);
  assert.equal(greedyMismatch(r.tokens, g), null, `${what}: the golden tokens`);
}

/** Files in the OPFS directory of stored models. */
const opfsFiles = () =>
  page.evaluate(async () => {
    const root = await navigator.storage.getDirectory();
    const dir = await root.getDirectoryHandle('saguaro-models', { create: true });
    const names = [];
    for await (const [name] of dir.entries()) names.push(name);
    return names;
  });

for (const store of ['opfs', 'cache-api']) {
  test(`${store}: a model is kept as it downloads and read back from the store`, async () => {
    await clear();
    const before = gets(smolCdn);
    const first = await run(hf(), { cache: store, hub: hub.url });
    expectGolden(first, 'downloaded');
    assert.deepEqual(first.fromCache, { 1: false });
    const entries = await list();
    assert.equal(entries.length, 1, JSON.stringify(entries));
    assert.equal(entries[0].url, hf());
    assert.equal(entries[0].size, whole.length);
    assert.equal(entries[0].store, store);
    assert.ok(Math.abs(entries[0].storedAt - Date.now()) < 300_000);
    const again = await run(hf(), { cache: store, hub: hub.url });
    assert.deepEqual(again.tokens, first.tokens);
    assert.deepEqual(again.fromCache, { 1: true });
    assert.equal(gets(smolCdn), before + 1, 'one download for the two loads');
  });
}

test('no store: cache false keeps nothing and downloads every time', async () => {
  await clear();
  const before = gets(smolCdn);
  for (let i = 0; i < 2; i++) expectGolden(await run(hf(), { cache: false, hub: hub.url }), `load ${i + 1}`);
  assert.deepEqual(await list(), []);
  assert.equal(gets(smolCdn), before + 2);
});

test('the default store is OPFS, where the browser has it', async () => {
  await clear();
  expectGolden(await run(hf(), { hub: hub.url }), 'default store');
  assert.deepEqual((await list()).map((e) => e.store), ['opfs']);
});

test('cache.delete removes one model, cache.clear every store', async () => {
  await clear();
  const url = `${hub.url}${smolCdn}`;
  expectGolden(await run(hf(), { cache: 'opfs', hub: hub.url }), 'hf name in OPFS');
  expectGolden(await run(url, { cache: 'cache-api' }), 'URL in the Cache API');
  assert.deepEqual((await list()).map((e) => `${e.store} ${e.url}`).sort(), [`cache-api ${url}`, `opfs ${hf()}`]);
  assert.equal(await page.evaluate((u) => window.pkg.Saguaro.cache.delete(u), hf()), true);
  assert.deepEqual((await list()).map((e) => e.url), [url]);
  assert.deepEqual(await opfsFiles(), [], 'the OPFS files went with the entry');
  assert.equal(await page.evaluate((u) => window.pkg.Saguaro.cache.delete(u), hf()), false);
  await clear();
  assert.deepEqual(await list(), []);
});

test('a stored file whose ETag no longer matches its source is fetched again', async () => {
  await clear();
  expectGolden(await run(hf(), { cache: 'opfs', hub: hub.url }), 'stored');
  // Stored long enough ago to be checked, and changed at its source since (a new ETag).
  await page.evaluate(async () => {
    const dir = await (await navigator.storage.getDirectory()).getDirectoryHandle('saguaro-models');
    for await (const [name, handle] of dir.entries()) {
      if (!name.endsWith('.json')) continue;
      const meta = JSON.parse(await (await handle.getFile()).text());
      const w = await handle.createWritable();
      await w.write(JSON.stringify({ ...meta, storedAt: meta.storedAt - 3_600_000 }));
      await w.close();
    }
  });
  const heads = () => hub.requests[`HEAD ${smolCdn}`] ?? 0;
  const asked = heads();
  const unchanged = await run(hf(), { cache: 'opfs', hub: hub.url });
  assert.deepEqual(unchanged.fromCache, { 1: true }, 'the same ETag: read from the store');
  assert.equal(heads(), asked + 1, 'the source was asked for its ETag');
  hub.put('test/smol', 'main', `${MODEL}.gguf`, whole);
  const before = gets(smolCdn);
  const changed = await run(hf(), { cache: 'opfs', hub: hub.url });
  expectGolden(changed, 'fetched again');
  assert.deepEqual(changed.fromCache, { 1: false });
  assert.equal(gets(smolCdn), before + 1);
  assert.equal((await list()).length, 1, 'stored again, once');
});

/** Run `f` with the engine worker's storage stubbed as `stub` says: `quota`, what
 * navigator.storage.estimate() reports (nothing in use); `room`, the bytes the stores take before
 * their writes fail as a full store's do (QuotaExceededError). The worker is wrapped in a module
 * that installs the stubs, then imports the real engine-worker.js. */
async function withStubs(stub, f) {
  await page.evaluate((stub) => {
    const setup = (stub) => {
      const full = () => new DOMException('the test store is full', 'QuotaExceededError');
      if (stub.quota) StorageManager.prototype.estimate = async () => ({ quota: stub.quota, usage: 0 });
      if (stub.room) {
        let taken = 0;
        const write = FileSystemSyncAccessHandle.prototype.write;
        FileSystemSyncAccessHandle.prototype.write = function (buffer, opts) {
          taken += buffer.byteLength;
          if (taken > stub.room) throw full();
          return write.call(this, buffer, opts);
        };
        const put = Cache.prototype.put;
        Cache.prototype.put = async function (request, response) {
          let over = false;
          const counted = new TransformStream({
            transform(chunk, c) {
              taken += chunk.byteLength;
              if (taken > stub.room) c.error((over = full()));
              else c.enqueue(chunk);
            },
          });
          try {
            return await put.call(this, request, new Response(response.body.pipeThrough(counted), { headers: response.headers }));
          } catch (e) {
            throw over || e;
          }
        };
      }
    };
    const module = (code) => URL.createObjectURL(new Blob([code], { type: 'text/javascript' }));
    const Real = (window.RealWorker ??= window.Worker);
    window.Worker = class extends Real {
      constructor(url, opts) {
        if (!String(url).endsWith('/engine-worker.js')) return super(url, opts);
        const stubs = module(`(${setup})(${JSON.stringify(stub)});`);
        super(module(`import ${JSON.stringify(stubs)}; import ${JSON.stringify(String(url))};`), opts);
      }
    };
  }, stub);
  try {
    return await f();
  } finally {
    await page.evaluate(() => (window.Worker = window.RealWorker));
  }
}

test('a store without room for the file is left out before the download, with a warning', async () => {
  await clear();
  warnings.length = 0;
  const r = await withStubs({ quota: 20 * MB }, () => run(hf(), { cache: 'opfs', hub: hub.url }));
  expectGolden(r, 'loaded without caching');
  assert.deepEqual(await list(), []);
  const w = warnings.find((m) => m.includes('is not cached'));
  assert.ok(w && w.includes('98.4 MB') && w.includes('has 20.0 MB free'), `the warning gives the sizes: ${w}`);
});

for (const store of ['opfs', 'cache-api']) {
  test(`${store}: a store that runs out of room midway is rolled back, the load goes on`, async () => {
    await clear();
    warnings.length = 0;
    const r = await withStubs({ room: 30 * MB }, () => run(hf(), { cache: store, hub: hub.url }));
    expectGolden(r, 'loaded without caching');
    assert.deepEqual(await list(), [], 'no entry');
    assert.deepEqual(await opfsFiles(), [], 'no half file');
    const w = warnings.find((m) => m.includes('is not cached'));
    assert.ok(w && w.includes('ran out of room after') && w.includes('of 98.4 MB'), `the warning says so, with sizes: ${w}`);
    assert.ok(!warnings.some((m) => /Uncaught|unhandled/i.test(m)));
  });
}

test('a file of no announced size loads and is kept', async () => {
  await clear();
  expectGolden(await run(hf(`${MODEL}.gguf`, 'test/unsized'), { cache: 'opfs', hub: hub.url }), 'no Content-Length');
  assert.deepEqual((await list()).map((e) => e.size), [whole.length]);
});

test('hf: names resolve against the hub option, at a revision or main', async () => {
  await clear();
  const resolves = (rev, path) => hub.requests[`GET /test/smol/resolve/${rev}/${path}`] ?? 0;
  const [main, v2] = [resolves('main', `${MODEL}.gguf`), resolves('v2', `sub/${MODEL}.gguf`)];
  expectGolden(await run(hf(), { cache: false, hub: hub.url }), 'main');
  expectGolden(await run(`${hf(`sub/${MODEL}.gguf`)}@v2`, { cache: false, hub: hub.url }), 'revision v2');
  assert.equal(resolves('main', `${MODEL}.gguf`), main + 1);
  assert.equal(resolves('v2', `sub/${MODEL}.gguf`), v2 + 1);
  const bad = await run('hf:no-repo.gguf', { cache: false, hub: hub.url });
  assert.equal(bad.error?.code, 'invalid_argument', JSON.stringify(bad));
  const missing = await run(hf('absent.gguf'), { cache: false, hub: hub.url });
  assert.ok(missing.error?.code === 'bad_model' && missing.error.message.includes('404'), JSON.stringify(missing));
});

const first = hf('smol-00001-of-00003.gguf', 'test/split');

test('a model in three files gives the whole file\'s tokens, each part kept on its own', async () => {
  await clear();
  const r = await run(first, { cache: 'opfs', hub: hub.url });
  expectGolden(r, 'three parts on the CPU');
  assert.deepEqual(r.fromCache, { 1: false, 2: false, 3: false });
  const urls = (await list()).map((e) => e.url).sort();
  assert.deepEqual(urls, [1, 2, 3].map((i) => hf(`smol-0000${i}-of-00003.gguf`, 'test/split')));
  const again = await run(first, { cache: 'opfs', hub: hub.url });
  assert.deepEqual(again.tokens, r.tokens);
  assert.deepEqual(again.fromCache, { 1: true, 2: true, 3: true });
});

test('a model in three files streams onto WebGPU as one', async () => {
  const r = await run(first, { cache: 'opfs', hub: hub.url, backend: 'gpu' });
  expectGolden(r, 'three parts streamed to the GPU');
});

test('a missing part is refused by name', async () => {
  const r = await run(hf('smol-00001-of-00003.gguf', 'test/gap'), { cache: false, hub: hub.url });
  assert.equal(r.error?.code, 'bad_model');
  assert.ok(r.error.message.includes('smol-00003-of-00003.gguf') && r.error.message.includes('404'), r.error.message);
});

test("the demo's model box takes an hf: name", async () => {
  const demo = await page.context().newPage();
  try {
    const q = new URLSearchParams({ target: hf(), hub: hub.url, cache: 'off', backend: 'cpu', autoload: '1' });
    const before = hub.requests[`GET /test/smol/resolve/main/${MODEL}.gguf`] ?? 0;
    await demo.goto(`${origin}/www/?${q}`);
    await demo.waitForFunction(() => window.demo?.engine || window.demo?.error, null, { timeout: 120_000 });
    const state = await demo.evaluate(() => ({ error: window.demo.error, box: document.getElementById('targetUrl').value, info: window.demo.engine?.info }));
    assert.equal(state.error, null);
    assert.equal(state.box, hf());
    assert.equal(state.info.backend, 'cpu');
    assert.equal(hub.requests[`GET /test/smol/resolve/main/${MODEL}.gguf`], before + 1);
    await demo.evaluate(() => window.demo.engine.dispose());
  } finally {
    await demo.close();
  }
});
