// The demo end to end in Debian's Chromium (WebGPU through SwiftShader), driven by playwright-core:
// SmolLM2 as target and draft by URL; AR and SSD (GPU target, CPU-worker draft) give the golden
// text; stats and the timeline are shown; the page keeps painting during a CPU generation; stop
// then a new race gives the golden text again; screenshots at laptop and phone widths, written
// to a temporary directory (the tracked ones in docs/screenshots are replaced by hand).
// Usage: node --test tests/web/e2e.mjs   (after scripts/build-web.sh; needs models/)
import { spawn } from 'node:child_process';
import { mkdtempSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { chromium } from 'playwright-core';
import { check, golden, greedyMismatch } from './golden.mjs';

const port = 8000 + Math.floor(Math.random() * 1000);
const server = spawn('node', ['scripts/serve.mjs', '.', String(port)], { stdio: ['ignore', 'pipe', 'inherit'] });
await new Promise((resolve) => server.stdout.once('data', resolve));
const base = `http://127.0.0.1:${port}`;
// The shortest golden prompt: SwiftShader runs WebGPU on the CPU, slowly, and a prefill costs most.
const g = golden('smollm2-135m-instruct-q4_1', 1);
const n = 16;
// Fewer on the GPU target: SwiftShader decodes SmolLM2 at seconds per token.
const gpuN = 8;
const shots = mkdtempSync(join(tmpdir(), 'saguaro-e2e-'));

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
  args: ['--enable-unsafe-webgpu', '--no-sandbox', '--disable-background-networking', '--disable-component-update',
    '--no-first-run', '--disable-sync'],
});
// SwiftShader decodes SmolLM2 at seconds per token on two shared cores.
const timeout = 1_800_000;
after(async () => {
  await browser.close();
  server.kill();
});
// One context for every page, so the second load finds the models in the Cache API.
const context = await browser.newContext();

async function open(params, viewport = { width: 1280, height: 900 }) {
  const page = await context.newPage();
  await page.setViewportSize(viewport);
  page.on('console', (m) => console.log(`[page ${m.type()}] ${m.text()}`));
  page.on('pageerror', (e) => console.log(`[page error] ${e.message}`));
  const q = new URLSearchParams({ pair: 'smollm', prompt: g.prompt, autoload: '1', ...params });
  await page.goto(`${base}/www/?${q}`);
  await page.waitForFunction(() => window.demo?.engine || window.demo?.error, null, { timeout });
  const error = await page.evaluate(() => window.demo.error);
  if (error) throw new Error(`load failed: ${JSON.stringify(error)}`);
  return page;
}

async function race(page) {
  await page.click('#race');
  await page.waitForFunction(() => window.demo.running === false && (window.demo.results.ssd || window.demo.error), null, { timeout });
  return page.evaluate(() => ({ results: window.demo.results, error: window.demo.error }));
}

test('the GPU target, the draft in a CPU worker', async (t) => {
  // 1. GPU target (SwiftShader), draft in a CPU worker.
  const page = await open({ backend: 'gpu', draftBackend: 'cpu', maxTokens: String(gpuN) });
  const info = await page.evaluate(() => ({ ...window.demo.engine.info, loadMs: window.demo.loadMs }));
  await check(t, info.backend === 'gpu' && info.draftWorker, `target on WebGPU (${info.targetBackend}), draft in its own worker`);
  const { results, error } = await race(page);
  await check(t, !error, `race ran (${JSON.stringify(error)})`);
  const { ar, ssd } = results;
  await check(t, ar.tokens.length === gpuN && greedyMismatch(ar.tokens, g) === null, `AR on WebGPU gives the golden tokens (${greedyMismatch(ar.tokens, g)})`);
  await check(t, JSON.stringify(ssd.tokens) === JSON.stringify(ar.tokens) && ssd.text === ar.text, 'SSD gives exactly the AR text');
  // The draft speculates in its own worker while the target verifies: their spans overlap.
  await check(t, ssd.stats.timeline?.some((r) => r.draft) && ssd.stats.overlapMs > 0,
    `SSD stats carry the draft's spans, overlapping the verifies (${ssd.stats.overlapMs?.toFixed(0)} ms)`);
  await check(t, await page.locator('#timeline svg rect').count() > 0, 'the timeline is drawn');
  await check(t, (await page.textContent('#lane-ssd [data-k="speedup"]')).includes('x'), 'the speed-up is shown');
  console.log(`metrics: gpu-target AR ${ar.stats.tokensPerS.toFixed(2)} tok/s, SSD ${ssd.stats.tokensPerS.toFixed(2)} tok/s, ` +
    `overlap ${ssd.stats.overlapMs.toFixed(0)} of ${ssd.stats.draftBusyMs.toFixed(0)} ms draft time, load ${info.loadMs.toFixed(0)} ms`);
  await page.screenshot({ path: `${shots}/demo-laptop.png`, fullPage: true });
  await page.setViewportSize({ width: 390, height: 844 });
  await page.screenshot({ path: `${shots}/demo-phone.png`, fullPage: true });
  const sizes = ['demo-laptop.png', 'demo-phone.png'].map((f) => statSync(join(shots, f)).size);
  await check(t, sizes.every((b) => b > 10_000), `screenshots in ${shots} (${sizes.join(', ')} bytes)`);
  await page.close();
});

test('the CPU target: painting, stop, a new race', async (t) => {
  // 2. CPU target: the main thread keeps painting while the engine worker computes; stop, then
  //    a new race gives the golden text.
  const cpu = await open({ backend: 'cpu', draftBackend: 'cpu', maxTokens: '400' });
  // The demo's pages are cross-origin isolated, so a CPU target computes on the threads build, one
  // thread per core (at most DEFAULTS.threadCap).
  const { threads, targetBackend } = await cpu.evaluate(() => window.demo.engine.info);
  const cores = await cpu.evaluate(async () => {
    const { DEFAULTS } = await import('/pkg/index.js');
    return Math.min(navigator.hardwareConcurrency, DEFAULTS.threadCap);
  });
  await check(t, threads === cores && targetBackend.startsWith(`cpu (${cores} threads`),
    `the CPU target computes on ${cores} threads (${threads}: ${targetBackend})`);
  const loadMs = await cpu.evaluate(() => window.demo.loadMs);
  console.log(`metrics: reload with the Cache API: ${loadMs.toFixed(0)} ms`);
  await cpu.click('#race');
  await cpu.waitForFunction(() => window.demo.running && document.querySelector('#lane-ar .out').textContent.length > 0, null, { timeout });
  const f0 = await cpu.evaluate(() => window.demo.frames);
  await cpu.waitForTimeout(1000);
  const f1 = await cpu.evaluate(() => window.demo.frames);
  await check(t, f1 - f0 >= 20, `requestAnimationFrame kept firing during a CPU generation (${f1 - f0} frames in 1 s)`);
  await cpu.click('#stop');
  await cpu.waitForFunction(() => !window.demo.running, null, { timeout });
  const stopped = await cpu.evaluate(() => window.demo.error);
  await check(t, stopped?.code === 'aborted', `stop aborts the generation (${JSON.stringify(stopped)})`);
  await cpu.fill('#maxTokens', String(n));
  const again = await race(cpu);
  await check(t, !again.error && greedyMismatch(again.results.ar.tokens, g) === null && again.results.ar.tokens.length === n, 'after a stop, AR gives the golden tokens');
  await check(t, JSON.stringify(again.results.ssd.tokens) === JSON.stringify(again.results.ar.tokens), 'after a stop, SSD equals AR');
  console.log(`metrics: cpu-target AR ${again.results.ar.stats.tokensPerS.toFixed(2)} tok/s, SSD ${again.results.ssd.stats.tokensPerS.toFixed(2)} tok/s`);
  await cpu.close();
});

test('Gemma 3 270M on the CPU in the browser', async (t) => {
  // 3. Gemma 3 270M (SentencePiece vocabulary with BOS, sliding-window layers, GeGLU) on the CPU
  //    in the browser: its prompt tokenized there gives the float64 reference's tokens.
  const gg = golden('f64-gemma-3-270m-q4_k_m', 1);
  const gn = 4;
  const gemma = await open({ pair: 'gemma', prompt: gg.prompt, backend: 'cpu', draftBackend: 'cpu', maxTokens: String(gn) });
  const gemmaRace = await race(gemma);
  await check(t, !gemmaRace.error, `Gemma race ran (${JSON.stringify(gemmaRace.error)})`);
  const gar = gemmaRace.results.ar;
  await check(t, gar.tokens.length === gn && greedyMismatch(gar.tokens, gg) === null,
    `Gemma 3 AR in the browser gives the reference tokens (${greedyMismatch(gar.tokens, gg)}): ${JSON.stringify(gar.text)}`);
  await check(t, JSON.stringify(gemmaRace.results.ssd.tokens) === JSON.stringify(gar.tokens), 'Gemma 3 SSD equals AR');
});
