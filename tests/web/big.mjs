// A target larger than wasm32's 4 GiB of memory loads on WebGPU in Debian's Chromium (SwiftShader)
// and gives the tokens the native engine gives: the package streams it to the GPU tensor by tensor
// (src/model/stream.rs), so wasm memory never holds it. The model is a `saguaro synth` file of
// Qwen 2.5 3B's shape in f16, 25 of its 36 layers: 4.2 GiB, random weights.
// Usage: node --test tests/web/big.mjs   (after scripts/build-web.sh and cargo build --release
// --bin saguaro; SAGUARO_BIG_MODEL=model.gguf takes that file instead, e.g. to see the peak wasm
// memory of a real one)
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, statSync } from 'node:fs';
import { after, test } from 'node:test';
import { openDemoPage } from './browser.mjs';
import { check } from './golden.mjs';
import { bin, generate } from './native.mjs';

const GiB = 2 ** 30;
let file = process.env.SAGUARO_BIG_MODEL;
const synthesized = !file;
if (synthesized) {
  const dir = 'target/web-big';
  mkdirSync(dir, { recursive: true });
  file = `${dir}/qwen3b-f16-25l.gguf`;
  if (!existsSync(file)) {
    execFileSync(bin, ['synth', '--shape', 'qwen2.5-3b', '--dtype', 'f16', '--layers', '25', '--out', file], { stdio: 'inherit' });
  }
}
const size = statSync(file).size;
// SwiftShader reads the whole 4.2 GiB of weights on the CPU for every token (about 80 s a
// forward on a 2-core machine): 2 tokens keep the test near 3 minutes; 16 would add some 20 to CI.
// The many-token comparisons of WebGPU against the native engine are gpu.mjs's and e2e.mjs's.
const prompt = 'fox';
const n = 2;

const { page, close } = await openDemoPage();
after(close);

test('a target over 4 GiB on WebGPU gives the native engine\'s tokens', async (t) => {
  if (synthesized) await check(t, size > 4 * GiB, `the model is larger than 4 GiB (${(size / GiB).toFixed(2)} GiB)`);
  // The native engine's greedy tokens on the CPU: what WebGPU must give.
  const native = generate(prompt, { target: file, backend: 'cpu', mode: 'ar', maxTokens: n, context: 64 });
  const r = await page.evaluate(async ([url, prompt, n]) => {
    const { Saguaro } = await import('/pkg/index.js');
    const t0 = performance.now();
    // An f32 KV cache, as the CPU's: random weights leave near ties that an f16 cache may tip.
    const e = await Saguaro.load({ target: url }, { backend: 'gpu', modes: ['ar'], context: 64, cache: false, kvCache: 'f32' });
    const t1 = performance.now();
    const g = await e.generate(prompt, { mode: 'ar', maxTokens: n });
    const out = { info: e.info, tokens: g.tokens, loadS: (t1 - t0) / 1000, generateS: (performance.now() - t1) / 1000 };
    await e.dispose();
    return out;
  }, [`/${file}`, prompt, n]);
  console.log(`metrics: ${file} (${(size / GiB).toFixed(2)} GiB) loaded on ${r.info.targetBackend} in ${r.loadS.toFixed(0)} s ` +
    `(${(size / 2 ** 20 / r.loadS).toFixed(0)} MiB/s); peak wasm memory ${(r.info.wasmMemoryBytes / 2 ** 20).toFixed(0)} MiB; ` +
    `${n} tokens in ${r.generateS.toFixed(0)} s`);
  await check(t, /^gpu/.test(r.info.targetBackend), `the target is on WebGPU (${r.info.targetBackend})`);
  await check(t, native.tokens.length === n && r.tokens.length === n, `both engines give ${n} tokens (native ${native.tokens.length}, WebGPU ${r.tokens.length})`);
  await check(t, JSON.stringify(r.tokens) === JSON.stringify(native.tokens),
    `greedy tokens on WebGPU equal the native engine's (${JSON.stringify(r.tokens)} against ${JSON.stringify(native.tokens)})`);
  if (synthesized) {
    await check(t, r.info.wasmMemoryBytes < GiB, `wasm memory stayed under 1 GiB while a ${(size / GiB).toFixed(2)} GiB model loaded`);
  }
});
