// Both models on WebGPU in Debian's Chromium (SwiftShader), driven by playwright-core: the draft in
// its own worker on a GPUDevice of its own, speculating for SSD while the engine worker's target
// verifies on another, and drafting for SD. The models are tiny GGUFs of Qwen 2.5's layout with
// random weights (`saguaro synth`; SwiftShader runs WebGPU on the CPU, at seconds per token for a
// real 135M model): the draft is the target's weights at 4 bits instead of 8, so that it proposes
// the target's tokens often but not always.
// Greedy SD and SSD equal AR on the target on WebGPU and on the CPU; sampled SSD repeats itself
// with a seed and gives the native engine's tokens for that seed (the same models and options on
// the native backends: lavapipe for WebGPU); the draft's speculation overlaps the target's
// verification; `shaderF16` runs where the adapter offers it and fails cleanly where it does not.
// Usage: node --test tests/web/gpu.mjs   (after scripts/build-web.sh and cargo build --release --bin saguaro)
import { execFileSync } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import { after, test } from 'node:test';
import { openDemoPage } from './browser.mjs';
import { check } from './golden.mjs';
import { bin } from './native.mjs';

const dir = 'target/web-gpu-models';
mkdirSync(dir, { recursive: true });
for (const [name, dtype] of [['target', 'q8_0'], ['draft', 'q4_0']]) {
  execFileSync(bin, ['synth', '--shape', 'tiny', '--dtype', dtype, '--out', `${dir}/${name}.gguf`]);
}
const { page, close } = await openDemoPage();
after(close);
const prompts = ['The quick brown fox', 'def main():\n    print('];
const n = 16;
// Sampled SSD's repeat needs fewer tokens: SwiftShader runs the draft's tree steps at seconds a
// round.
const sampledN = 8;
const sampled = { mode: 'ssd', maxTokens: sampledN, temperature: 0.8, seed: 5 };

for (const backend of ['gpu', 'cpu']) {
  test(`the target on ${backend}, the draft on WebGPU in its own worker`, async (t) => {
    const r = await page.evaluate(async ([dir, prompts, backend, n, opts]) => {
      const { Saguaro } = await import('/pkg/index.js');
      const e = await Saguaro.load({ target: `/${dir}/target.gguf`, draft: `/${dir}/draft.gguf` }, { backend, draftBackend: 'gpu', specK: 3 });
      const out = { info: e.info, greedy: [] };
      for (const prompt of backend === 'gpu' ? prompts : prompts.slice(1)) {
        const run = {};
        for (const mode of ['ar', 'sd', 'ssd']) {
          const g = await e.generate(prompt, { mode, maxTokens: n });
          run[mode] = { tokens: g.tokens, tps: g.stats.tokensPerS, acceptance: g.stats.acceptanceRate, overlap: g.stats.overlapMs, busy: g.stats.draftBusyMs };
        }
        out.greedy.push(run);
      }
      out.sampled = [(await e.generate(prompts[0], opts)).tokens, (await e.generate(prompts[0], opts)).tokens];
      await e.dispose();
      return out;
    }, [dir, prompts, backend, n, sampled]);
    // draftDevice is the name the draft worker's backend gives itself, not the option echoed.
    await check(t, r.info.backend === backend && r.info.draftWorker && /^gpu \(/.test(r.info.draftDevice ?? ''),
      `target on ${backend}, the draft on WebGPU in its own worker (${JSON.stringify(r.info)})`);
    for (const [i, run] of r.greedy.entries()) {
      console.log(`metrics: target ${backend}, prompt ${i}: AR ${run.ar.tps.toFixed(1)} tok/s, SD ${run.sd.tps.toFixed(1)}, ` +
        `SSD ${run.ssd.tps.toFixed(1)} (acceptance ${run.ssd.acceptance.toFixed(2)}, draft busy ${run.ssd.busy.toFixed(0)} ms, ` +
        `${run.ssd.overlap.toFixed(0)} ms of it during verification)`);
      await check(t, run.ar.tokens.length === n, `target ${backend}, prompt ${i}: AR gives ${n} tokens`);
      for (const mode of ['sd', 'ssd']) {
        await check(t, JSON.stringify(run[mode].tokens) === JSON.stringify(run.ar.tokens),
          `target ${backend}, prompt ${i}: greedy ${mode.toUpperCase()} with the draft on WebGPU equals AR`);
      }
    }
    const acceptance = r.greedy.map((run) => run.ssd.acceptance);
    await check(t, acceptance.some((a) => a > 0) && acceptance.some((a) => a < 1),
      `the draft's proposals were accepted and rejected (acceptance ${acceptance.map((a) => a.toFixed(2))})`);
    await check(t, r.greedy.every((run) => run.ssd.overlap > 0), 'the draft\'s speculation overlapped the target\'s verification');
    await check(t, r.sampled[0].length === sampledN && JSON.stringify(r.sampled[0]) === JSON.stringify(r.sampled[1]),
      `target ${backend}: sampled SSD with a seed repeats itself`);
  });
}

test('shaderF16 where the adapter offers it, a clean error where not', async (t) => {
  // f16 arithmetic runs where the browser's adapter offers 'shader-f16'; elsewhere (SwiftShader)
  // the load fails with 'gpu_error', and the page goes on loading and running models.
  const f16 = await page.evaluate(async (dir) => {
    const { Saguaro } = await import('/pkg/index.js');
    const offered = (await navigator.gpu.requestAdapter())?.features.has('shader-f16') ?? false;
    const run = async (opts) => {
      const e = await Saguaro.load({ target: `/${dir}/target.gguf` }, { backend: 'gpu', modes: ['ar'], cache: false, ...opts });
      try {
        return (await e.generate('The quick brown fox', { mode: 'ar', maxTokens: 4 })).tokens.length;
      } finally {
        await e.dispose();
      }
    };
    let tokens = null, code = null;
    try {
      tokens = await run({ shaderF16: true });
    } catch (err) {
      code = err.code;
    }
    return { offered, tokens, code, after: await run({}) };
  }, dir);
  await check(t, f16.offered ? f16.tokens === 4 : f16.code === 'gpu_error',
    `shaderF16: ${f16.offered ? 'runs on an adapter with shader-f16' : "'gpu_error' on an adapter without shader-f16"} (${JSON.stringify(f16)})`);
  await check(t, f16.after === 4, 'a model loads and runs on WebGPU after that');
});
