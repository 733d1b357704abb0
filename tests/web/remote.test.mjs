// The packed npm package in Node with its target on a server: `saguaro serve` (SmolLM2, one
// thread) verifies what the local SmolLM2 draft proposes, over fetch. Remote AR, SD and SSD equal
// the golden greedy ids; sampling the server cannot return exactly is refused; a server killed
// mid-generation ends it with `server_error` and the text so far, and once the server is back the
// same engine generates again; bad server targets fail at load with clear errors.
// Usage: SAGUARO_MODELS=DIR SAGUARO_BIN=/path/to/saguaro node --test remote.test.mjs   (cwd: a project with saguaro-web installed)
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { Saguaro } from 'saguaro-web';
import { check, golden, greedyMismatch } from './golden.mjs';
import { bin, generate } from './native.mjs';
import { startServe } from './saguaro-serve.mjs';

const models = process.env.SAGUARO_MODELS ?? 'models';
const modelPath = join(models, 'smollm2-135m-instruct-q4_1.gguf');
const bytes = await readFile(modelPath);
const g = golden();
const n = 24;

async function failure(p) {
  try {
    await p;
    return null;
  } catch (e) {
    return e;
  }
}

let serve = await startServe(bin, modelPath);
after(() => serve.stop());
let engine, ar;

test('bad server targets fail at load', async (t) => {
  const bad = await failure(Saguaro.load({ target: { server: 'ftp://127.0.0.1:1' }, draft: bytes }));
  await check(t, bad?.code === 'invalid_argument' && /target\.server/.test(bad.message), `a server address that is not http:// is refused (${bad?.message})`);
  const alone = await failure(Saguaro.load({ target: { server: serve.url } }));
  await check(t, alone?.code === 'invalid_argument' && /draft/.test(alone.message), `a server target without a draft is refused (${alone?.message})`);
  // Values out of range are refused by name; a wrong type or sign by the parser, which names the
  // object only.
  const badFields = [
    ['topN', 0, 'target.topN: must be at least 1'],
    ['timeoutMs', -1, 'target.timeoutMs: must be a positive'],
    ['timeoutMs', 'soon', 'target: invalid type'],
    ['retries', -1, 'target: invalid value'],
    ['port', 80, 'target: unknown field `port`'],
  ];
  for (const [field, value, says] of badFields) {
    const e = await failure(Saguaro.load({ target: { server: serve.url, [field]: value }, draft: bytes }));
    await check(t, e?.code === 'invalid_argument' && e.message.startsWith(says), `target.${field} ${JSON.stringify(value)} is refused (${e?.message})`);
  }
  const nobody = await failure(Saguaro.load({ target: { server: 'http://127.0.0.1:9', retries: 0 }, draft: bytes }));
  await check(t, nobody?.code === 'server_error', `a server that is not there fails the load with server_error (${nobody?.message})`);
});

test('AR, SD and SSD through the server', async (t) => {
  engine = await Saguaro.load({ target: { server: serve.url, retries: 2, timeoutMs: 20_000 }, draft: bytes });
  await check(t, engine.info.backend === 'server' && engine.info.targetBackend.includes(serve.url) && engine.info.hasDraft,
    `loaded with the target on the server (${JSON.stringify(engine.info)})`);

  let arPieces = 0;
  ar = await engine.generate(g.prompt, { mode: 'ar', maxTokens: n, onToken: () => arPieces++ });
  await check(t, greedyMismatch(ar.tokens, g) === null && ar.tokens.length === n, `remote AR (the server generating) equals the golden greedy ids (${greedyMismatch(ar.tokens, g)})`);
  await check(t, ar.stats.remote?.roundTrips === 1, `remote AR is one request (${JSON.stringify(ar.stats.remote)})`);
  await check(t, arPieces === n, `remote AR streams its tokens one event at a time (${arPieces} pieces for ${n} tokens)`);
  for (const mode of ['sd', 'ssd']) {
    const r = await engine.generate(g.prompt, { mode, maxTokens: n });
    const forwards = r.stats.remote.roundTrips / r.tokens.length;
    await check(t, JSON.stringify(r.tokens) === JSON.stringify(ar.tokens) && r.text === ar.text, `${mode.toUpperCase()} through the server equals AR token for token`);
    await check(t, forwards < 0.75 && r.stats.remote.bytesSent > 0 && r.stats.remote.bytesReceived > 0,
      `${mode.toUpperCase()}: ${r.stats.remote.roundTrips} requests for ${r.tokens.length} tokens, bytes counted (${JSON.stringify(r.stats.remote)})`);
    console.log(`metrics: node, server target: ${mode.toUpperCase()} ${r.stats.tokensPerS.toFixed(1)} tok/s, ${forwards.toFixed(2)} server forwards per token`);
  }
  let streamed = '';
  for await (const piece of engine.stream(g.prompt, { mode: 'ssd', maxTokens: n })) streamed += piece;
  await check(t, streamed === ar.text, 'stream() through the server gives the same text');
});

test('sampling through the server', async (t) => {
  const opts = { mode: 'sd', maxTokens: 12, temperature: 0.8, topK: 8, seed: 3 };
  const sampled = await engine.generate(g.prompt, opts);
  const again = await engine.generate(g.prompt, opts);
  await check(t, sampled.tokens.length === 12 && JSON.stringify(sampled.tokens) === JSON.stringify(again.tokens), 'sampled SD with top-k 8 runs, and one seed gives one output');
  const native = generate(g.prompt, { target: serve.url, draft: modelPath, ...opts }).tokens;
  await check(t, JSON.stringify(sampled.tokens) === JSON.stringify(native),
    `sampled SD through the server gives the native engine's tokens for its seed (${JSON.stringify(sampled.tokens)}, native ${JSON.stringify(native)})`);
  const inexact = await failure(engine.generate(g.prompt, { mode: 'sd', maxTokens: 4, temperature: 1 }));
  await check(t, inexact?.code === 'invalid_argument' && /top_k/.test(inexact.message), `sampling without a top-k the server can return whole is refused (${inexact?.message})`);
});

test('a server killed mid-generation', async (t) => {
  // A server that dies mid-generation: the generation fails with server_error and keeps what it
  // had streamed; after the server comes back on the same address the engine goes on.
  let streamedTokens = 0;
  let killed = null;
  const counting = 'Count from 1 to 500, one number per line: 1, 2, 3,';
  const dying = failure(engine.generate(counting, {
    mode: 'ssd',
    maxTokens: 300,
    onToken: (_, k) => {
      streamedTokens += k;
      if (streamedTokens >= 8 && !killed) killed = serve.stop();
    },
  }));
  const died = await dying;
  await killed;
  await check(t, died?.code === 'server_error' && died.partial?.generated >= 8 && died.partial.text.length > 0,
    `a server killed mid-generation: server_error with the text so far (${died?.message}; ${died?.partial?.generated} tokens)`);
  serve = await startServe(bin, modelPath, serve.url.replace('http://', ''));
  const back = await engine.generate(g.prompt, { mode: 'ssd', maxTokens: n });
  await check(t, JSON.stringify(back.tokens) === JSON.stringify(ar.tokens), 'the server restarted: the same engine generates again, equal to AR');
  await engine.dispose();
});
