// The packed npm package in Node, installed into a fresh project (scripts/test-web.sh does that
// and runs this file there): SmolLM2 from bytes on the CPU backend, AR and SSD against the golden
// greedy ids, streaming, the chat API, abort and errors.
// Usage: node node.test.mjs MODELS_DIR   (cwd: a project with saguaro-web installed)
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { Saguaro } from 'saguaro-web';
import { check, golden, greedyMismatch } from './golden.mjs';

const models = process.argv[2] ?? 'models';
const bytes = await readFile(join(models, 'smollm2-135m-instruct-q4_1.gguf'));
const g = golden();
const n = 24;

const phases = new Set();
const engine = await Saguaro.load({ target: bytes, draft: new Uint8Array(bytes) }, { onProgress: (p) => phases.add(p.phase) });
check(engine.info.backend === 'cpu' && engine.info.hasDraft, `loaded on the CPU with a draft (${JSON.stringify(engine.info)})`);
check(phases.has('download'), 'progress reported');

const ar = await engine.generate(g.prompt, { mode: 'ar', maxTokens: n });
check(greedyMismatch(ar.tokens, g) === null && ar.tokens.length === n, `AR equals the golden greedy ids (${greedyMismatch(ar.tokens, g)})`);
check(ar.promptTokens === g.prompt_ids.length, 'prompt tokens match the reference tokenization');
const ssd = await engine.generate(g.prompt, { mode: 'ssd', maxTokens: n });
check(JSON.stringify(ssd.tokens) === JSON.stringify(ar.tokens) && ssd.text === ar.text, 'SSD equals AR token for token');
// The draft computes at fast precision, so even drafting for itself a few proposals differ.
check(ssd.stats.mode === 'ssd' && ssd.stats.acceptanceRate > 0.5 && ssd.stats.timeline.length === ssd.stats.rounds,
  `SSD stats: a self-draft is mostly accepted (${ssd.stats.acceptanceRate}), one timeline entry per round`);
console.log(`metrics: node wasm CPU (1 thread): AR ${ar.stats.tokensPerS.toFixed(1)} tok/s, SSD ${ssd.stats.tokensPerS.toFixed(1)} tok/s (draft inline)`);
const sd = await engine.generate(g.prompt, { mode: 'sd', maxTokens: n });
check(JSON.stringify(sd.tokens) === JSON.stringify(ar.tokens), 'SD equals AR token for token');
console.log(`metrics: node wasm CPU (1 thread): SD ${sd.stats.tokensPerS.toFixed(1)} tok/s`);
check(engine.info.defaultMode === 'ar', `on the CPU the default mode is plain decoding (${engine.info.defaultMode})`);

let streamed = '';
const s = engine.stream(g.prompt, { mode: 'ssd', maxTokens: n });
for await (const piece of s) streamed += piece;
check(streamed === ar.text, 'stream() pieces concatenate to the text');

// Abort after the first round; the next generation is exactly a fresh one.
const ctrl = new AbortController();
let code = null;
try {
  await engine.generate(g.prompt, { mode: 'ssd', maxTokens: 200, signal: ctrl.signal, onToken: () => ctrl.abort() });
} catch (e) {
  code = e.code;
}
check(code === 'aborted', `abort rejects with code aborted (${code})`);
const again = await engine.generate(g.prompt, { mode: 'ssd', maxTokens: n });
check(JSON.stringify(again.tokens) === JSON.stringify(ar.tokens), 'after an abort the engine gives what a fresh one gives');

const chat = await engine.chat.completions.create({ messages: [{ role: 'user', content: 'Say hi.' }], max_tokens: 12 });
check(chat.object === 'chat.completion' && typeof chat.choices[0].message.content === 'string', 'chat.completions.create');
check(!chat.choices[0].message.content.includes('<|im_end|>'), 'chat content leaves the stop token out');
let chunks = '';
for await (const c of await engine.chat.completions.create({ messages: [{ role: 'user', content: 'Say hi.' }], max_tokens: 12, stream: true })) {
  chunks += c.choices[0].delta.content ?? '';
}
check(chunks === chat.choices[0].message.content, 'streamed chat chunks equal the non-streamed reply');

const rejects = async (p, want, what) => {
  let got = null;
  try {
    await p;
  } catch (e) {
    got = e.code;
  }
  check(got === want, `${what}: code ${want} (${got})`);
};
await rejects(engine.generate(g.prompt, { temperature: -1 }), 'invalid_argument', 'negative temperature');
await rejects(engine.generate(g.prompt, { topP: 0 }), 'invalid_argument', 'top_p 0');
await rejects(engine.generate(g.prompt, { mode: 'fast' }), 'invalid_argument', 'unknown mode');
await rejects(engine.generate(g.prompt, { maxTokens: 0 }), 'invalid_argument', 'maxTokens 0');
await rejects(Saguaro.load({ target: bytes.subarray(0, 4096) }), 'bad_model', 'truncated model');
await rejects(Saguaro.load({ target: new Uint8Array(1000) }), 'bad_model', 'not a GGUF file');
await rejects(Saguaro.load({ target: bytes }, { backend: 'gpu' }), 'no_webgpu', 'GPU in Node');
const after = await engine.generate(g.prompt, { mode: 'ar', maxTokens: n });
check(JSON.stringify(after.tokens) === JSON.stringify(ar.tokens), 'the engine still works after errors');
await engine.dispose();
await rejects(engine.generate(g.prompt), 'invalid_argument', 'generate after dispose');
console.log('node: all passed');
