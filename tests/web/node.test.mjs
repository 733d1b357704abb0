// The packed npm package in Node, installed into a fresh project (scripts/test-web.sh does that
// and runs this file there): SmolLM2 from bytes on the CPU backend, AR and SSD against the golden
// greedy ids, streaming (and leaving a stream early), the chat API, abort, structured output
// (responseFormat, OpenAI's response_format, an invalid schema), calls in one batch (`parallel`,
// chat `n`), errors, options only the engine
// knows, and a model served gzip-encoded; sampled AR against the native engine's (`saguaro
// generate`, SAGUARO_BIN) for the same seed.
// Usage: SAGUARO_MODELS=DIR node --test node.test.mjs   (cwd: a project with saguaro-web installed)
import { readFile } from 'node:fs/promises';
import { createServer } from 'node:http';
import { join } from 'node:path';
import { test } from 'node:test';
import { gzipSync } from 'node:zlib';
import { DEFAULTS, LIMITS, Saguaro } from 'saguaro-web';
import { check, golden, greedyMismatch } from './golden.mjs';
import { generate } from './native.mjs';

const models = process.env.SAGUARO_MODELS ?? 'models';
const bytes = await readFile(join(models, 'smollm2-135m-instruct-q4_1.gguf'));
const g = golden();
const n = 24;

let engine, ar;

test('loaded from bytes', async (t) => {
  const phases = new Set();
  engine = await Saguaro.load({ target: bytes, draft: new Uint8Array(bytes) }, { onProgress: (p) => phases.add(p.phase) });
  await check(t, engine.info.backend === 'cpu' && engine.info.hasDraft, `loaded on the CPU with a draft (${JSON.stringify(engine.info)})`);
  // Node 20's V8 runs relaxed SIMD only behind a flag, so the package loads a simd128 build (in Node, the threads one).
  await check(t, /simd128/.test(engine.info.targetBackend), `the CPU target runs the simd128 kernels (${engine.info.targetBackend})`);
  await check(t, phases.has('download'), 'progress reported');
});

test('AR, SSD and SD give the golden greedy ids', async (t) => {
  ar = await engine.generate(g.prompt, { mode: 'ar', maxTokens: n });
  await check(t, greedyMismatch(ar.tokens, g) === null && ar.tokens.length === n, `AR equals the golden greedy ids (${greedyMismatch(ar.tokens, g)})`);
  await check(t, ar.promptTokens === g.prompt_ids.length, 'prompt tokens match the reference tokenization');
  const ssd = await engine.generate(g.prompt, { mode: 'ssd', maxTokens: n });
  await check(t, JSON.stringify(ssd.tokens) === JSON.stringify(ar.tokens) && ssd.text === ar.text, 'SSD equals AR token for token');
  // The draft computes at fast precision, so even drafting for itself a few proposals differ.
  await check(t, ssd.stats.mode === 'ssd' && ssd.stats.acceptanceRate > 0.5, `SSD stats: a self-draft is mostly accepted (${ssd.stats.acceptanceRate})`);
  // Each round commits its accepted tokens and one of the target's (the last round may be cut at
  // maxTokens); the first token comes from the prefill. Verifies follow one another in time.
  const tl = ssd.stats.timeline;
  const committed = tl.reduce((sum, r) => sum + r.accepted + 1, 0);
  const lastCommit = tl[tl.length - 1].accepted + 1;
  await check(t, tl.every((r) => r.accepted <= r.proposed) && committed >= n - 1 && committed - lastCommit < n - 1,
    `SSD timeline: its rounds commit the ${n - 1} tokens after the prefill's (${committed}, the last ${lastCommit})`);
  await check(t, tl.every((r, i) => r.verify[0] <= r.verify[1] && (i === 0 || tl[i - 1].verify[1] <= r.verify[0])) && tl[tl.length - 1].verify[1] <= ssd.stats.decodeMs + 1,
    'SSD timeline: the verifies follow one another within the decode time');
  console.log(`metrics: node wasm CPU (${engine.info.threads} threads): AR ${ar.stats.tokensPerS.toFixed(1)} tok/s, SSD ${ssd.stats.tokensPerS.toFixed(1)} tok/s (draft inline)`);
  const sd = await engine.generate(g.prompt, { mode: 'sd', maxTokens: n });
  await check(t, JSON.stringify(sd.tokens) === JSON.stringify(ar.tokens), 'SD equals AR token for token');
  console.log(`metrics: node wasm CPU (${engine.info.threads} threads): SD ${sd.stats.tokensPerS.toFixed(1)} tok/s`);
});

// Sampled AR draws from the same logits with the same random stream as the native engine, so it
// gives the native tokens seed for seed. Sampled SD and SSD match the native engine's for the first
// tokens and then part (SD after 18 of 24 tokens, SSD after 8 in one run): an acceptance draw close
// to its threshold p/q goes the other way across builds, so their exactness is the native
// distribution tests' (tests/lossless.rs), and here each repeats itself for a seed.
test("sampled AR gives the native engine's tokens for its seed; sampled SD and SSD repeat themselves", async (t) => {
  const model = join(models, 'smollm2-135m-instruct-q4_1.gguf');
  const opts = { mode: 'ar', maxTokens: n, temperature: 0.8, seed: 7 };
  const got = (await engine.generate(g.prompt, opts)).tokens;
  const native = generate(g.prompt, { target: model, draft: model, ...opts }).tokens;
  await check(t, got.length === n && JSON.stringify(got) === JSON.stringify(native),
    `sampled AR: ${JSON.stringify(got)}, native ${JSON.stringify(native)}`);
  for (const mode of ['sd', 'ssd']) {
    const a = (await engine.generate(g.prompt, { ...opts, mode })).tokens;
    const b = (await engine.generate(g.prompt, { ...opts, mode })).tokens;
    await check(t, a.length === n && JSON.stringify(a) === JSON.stringify(b), `sampled ${mode.toUpperCase()} with a seed repeats itself`);
  }
});

test("the engine's measured mode choice", async (t) => {
  // The engine measured the modes at load and chose (refining the choice with the acceptance each
  // speculative generation sees); the package leaves the choice to it.
  const chosen = await engine.generate(g.prompt, { maxTokens: n });
  await check(t, chosen.stats.auto && chosen.stats.mode === chosen.stats.auto.mode && ['ar', 'sd', 'ssd'].includes(engine.info.defaultMode),
    `without a mode, the generation runs in the engine's measured choice (${chosen.stats.auto?.mode}, stats ${chosen.stats.mode})`);
  // The choice is refined after each speculative generation, and `info` follows it: a prompt the
  // draft always gets right (it drafts for itself) pulls the acceptance up.
  const before = engine.info.defaultMode;
  const refined = [];
  for (let i = 0; i < 3; i++) {
    await engine.generate(g.prompt, { mode: 'sd', maxTokens: n });
    const want = engine.info.defaultMode;
    refined.push(want);
    const next = await engine.generate(g.prompt, { maxTokens: 4 });
    await check(t, next.stats.mode === want, `info.defaultMode is the mode the next generation without one runs in (${want}, ran ${next.stats.mode})`);
  }
  console.log(`metrics: default mode ${before} at load, then ${refined.join(', ')}`);
});

test('stream()', async (t) => {
  let streamed = '';
  const s = engine.stream(g.prompt, { mode: 'ssd', maxTokens: n });
  for await (const piece of s) streamed += piece;
  await check(t, streamed === ar.text, 'stream() pieces concatenate to the text');

  // Leaving a stream early aborts its generation: it does not run on to maxTokens, and the engine
  // is free at once for the next call.
  const long = engine.stream(g.prompt, { mode: 'ssd', maxTokens: 400 });
  for await (const piece of long) if (piece) break;
  let left = null;
  try {
    await long.result;
  } catch (e) {
    left = e;
  }
  await check(t, left?.code === 'aborted' && left.partial?.finish === 'cancelled' && left.partial.tokens.length < 50,
    `break out of stream() aborts the generation (${left?.code}, ${left?.partial?.tokens.length} tokens)`);
  const t0 = performance.now();
  const next = await engine.generate(g.prompt, { mode: 'ar', maxTokens: 4 });
  await check(t, next.tokens.length === 4, `the next generation runs at once (${(performance.now() - t0).toFixed(0)} ms)`);

  // A stream whose generation fails throws from the loop, and its result rejects.
  const failing = engine.stream(g.prompt, { temperature: -1 });
  let thrown = null;
  try {
    for await (const piece of failing) streamed += piece;
  } catch (e) {
    thrown = e.code;
  }
  let rejected = null;
  await failing.result.catch((e) => (rejected = e.code));
  await check(t, thrown === 'invalid_argument' && rejected === 'invalid_argument', `a failed stream throws and its result rejects (${thrown}, ${rejected})`);
});

test('abort', async (t) => {
  // Abort after the first round; the next generation is exactly a fresh one.
  const ctrl = new AbortController();
  let code = null;
  try {
    await engine.generate(g.prompt, { mode: 'ssd', maxTokens: 200, signal: ctrl.signal, onToken: () => ctrl.abort() });
  } catch (e) {
    code = e.code;
  }
  await check(t, code === 'aborted', `abort rejects with code aborted (${code})`);
  const again = await engine.generate(g.prompt, { mode: 'ssd', maxTokens: n });
  await check(t, JSON.stringify(again.tokens) === JSON.stringify(ar.tokens), 'after an abort the engine gives what a fresh one gives');
});

test('chat.completions.create', async (t) => {
  const chat = await engine.chat.completions.create({ messages: [{ role: 'user', content: 'Say hi.' }], max_tokens: 48 });
  const reply = chat.choices[0];
  await check(t, chat.object === 'chat.completion' && reply.finish_reason === 'stop' && reply.message.content.length > 0,
    `chat.completions.create: the reply ends at the stop token (${reply.finish_reason}: ${JSON.stringify(reply.message.content)})`);
  await check(t, !reply.message.content.includes('<|im_end|>'), 'chat content leaves the stop token out');
  let chunks = '';
  let finishReason = null;
  for await (const c of await engine.chat.completions.create({ messages: [{ role: 'user', content: 'Say hi.' }], max_tokens: 48, stream: true })) {
    chunks += c.choices[0].delta.content ?? '';
    finishReason = c.choices[0].finish_reason ?? finishReason;
  }
  await check(t, chunks === reply.message.content && finishReason === 'stop', 'streamed chat chunks equal the non-streamed reply, and it ends with stop');
});

test('structured output', async (t) => {
  const parses = (text) => {
    try {
      return JSON.parse(text);
    } catch {
      return undefined;
    }
  };
  const ask = (content) => ({ messages: [{ role: 'user', content }] });
  // Greedy, and short enough to close well within maxTokens (asked to describe a cat, this model
  // is still inside its object after 48 tokens).
  const obj = await engine.generate(ask('Reply with a JSON object with one key, "ok", set to true.'), { mode: 'ar', maxTokens: 48, responseFormat: { type: 'json_object' } });
  // The grammar, complete, ends the generation ('eos'): the text is the object alone.
  const parsed = parses(obj.text.trim());
  await check(t, obj.finish === 'eos' && parsed !== null && typeof parsed === 'object' && !Array.isArray(parsed),
    `responseFormat json_object: greedy output is a JSON object that ends the generation (${obj.finish}: ${JSON.stringify(obj.text)})`);
  await check(t, obj.stats.grammar && obj.stats.grammar.masks > 0, `stats.grammar reports the masks (${JSON.stringify(obj.stats.grammar)})`);
  // OpenAI's response_format on the chat API: a schema with a short field, the reply 'stop'.
  const schema = { type: 'object', properties: { ok: { type: 'boolean' } }, required: ['ok'], additionalProperties: false };
  const chat = await engine.chat.completions.create({ ...ask('Is water wet? Answer in JSON.'), max_tokens: 48, response_format: { type: 'json_schema', json_schema: { name: 'x', schema, strict: true } } });
  const reply = chat.choices[0];
  const answer = parses(reply.message.content.trim());
  await check(t, reply.finish_reason === 'stop' && typeof answer?.ok === 'boolean' && Object.keys(answer).length === 1,
    `chat response_format json_schema: the reply follows the schema and ends with stop (${reply.finish_reason}: ${JSON.stringify(reply.message.content)})`);
});

test('tools on a model whose chat template lists none', async (t) => {
  const tools = [{ type: 'function', function: { name: 'weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } } }];
  const code = async (p) => p.then(() => null, (e) => e.code);
  const chat = await code(engine.chat.completions.create({ messages: [{ role: 'user', content: 'Weather in Oslo?' }], max_tokens: 8, tools, tool_choice: 'required' }));
  await check(t, chat === 'invalid_argument', `tools on SmolLM2 (no tools in its template): invalid_argument (${chat})`);
  const choice = await code(engine.generate(g.prompt, { maxTokens: 4, toolChoice: 'auto' }));
  await check(t, choice === 'invalid_argument', `toolChoice without tools: invalid_argument (${choice})`);
});

test('an invalid schema', async (t) => {
  const codeOf = async (p) => {
    try {
      await p;
      return null;
    } catch (e) {
      return e.code;
    }
  };
  const bad = { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'nonsense' } } };
  const got = await codeOf(engine.generate(g.prompt, { mode: 'ar', maxTokens: n, responseFormat: bad }));
  await check(t, got === 'invalid_grammar', `generate with an invalid schema: code invalid_grammar (${got})`);
  const chat = await codeOf(engine.chat.completions.create({ messages: [{ role: 'user', content: 'Hi.' }], max_tokens: 8, response_format: bad }));
  await check(t, chat === 'invalid_grammar', `chat with an invalid response_format schema: code invalid_grammar (${chat})`);
  const after = await engine.generate(g.prompt, { mode: 'ar', maxTokens: n });
  await check(t, JSON.stringify(after.tokens) === JSON.stringify(ar.tokens), 'the engine still generates after an invalid schema, as before');
});

// With `parallel`, calls made together generate in one batch: each gives what it gives alone on
// the one-at-a-time engine (greedy in every batched mode, sampled AR seed for seed), their pieces
// arrive interleaved, an abort or a failure leaves the others running, and calls beyond
// `parallel` wait for a sequence.
test('parallel: concurrent calls in one batch', async (t) => {
  const same = (a, b) => JSON.stringify(a.tokens) === JSON.stringify(b.tokens) && a.text === b.text;
  const codeOf = (p) => p.then(() => null, (e) => e.code);
  const prompts = [g.prompt, 'def fibonacci(n):', 'The three primary colors are'];
  const alone = [];
  let t0 = performance.now();
  for (const p of prompts) alone.push(await engine.generate(p, { mode: 'ar', maxTokens: n }));
  const inLineMs = performance.now() - t0;
  const sampled = { temperature: 0.8, topP: 0.95, seed: 7, maxTokens: n };
  const sampledAlone = await engine.generate(prompts[1], { ...sampled, mode: 'ar' });

  const batch = await Saguaro.load({ target: bytes, draft: new Uint8Array(bytes) }, { parallel: 3 });
  await check(t, batch.info.parallel === 3 && batch.info.hasDraft && DEFAULTS.batchModes.includes(batch.info.defaultMode),
    `loaded for 3 sequences with a draft (${JSON.stringify(batch.info)})`);
  const order = [];
  const together = await Promise.all(prompts.map((p, i) => batch.generate(p, { maxTokens: n, onToken: () => order.push(i) })));
  await check(t, together.every((r, i) => same(r, alone[i])), `3 calls at once each equal their AR output alone (modes ${together.map((r) => r.stats.mode)})`);
  await check(t, order.indexOf(1) < order.lastIndexOf(0) && order.indexOf(2) < order.lastIndexOf(0), `their pieces interleave (${order.join('')})`);
  for (const mode of DEFAULTS.batchModes) {
    t0 = performance.now();
    const rs = await Promise.all(prompts.map((p) => batch.generate(p, { mode, maxTokens: n })));
    const ms = performance.now() - t0;
    await check(t, rs.every((r, i) => same(r, alone[i]) && r.stats.mode === mode), `mode ${mode}: each of 3 at once equals AR alone`);
    console.log(`metrics: node wasm CPU (${batch.info.threads} threads), 3 calls of ${n} tokens: ${mode} at once ${((3 * n * 1000) / ms).toFixed(1)} tok/s in all, AR one after another ${((3 * n * 1000) / inLineMs).toFixed(1)} tok/s`);
  }
  const [s, ...others] = await Promise.all([batch.generate(prompts[1], { ...sampled, mode: 'ar' }), ...[0, 2].map((i) => batch.generate(prompts[i], { mode: 'ar', maxTokens: n }))]);
  await check(t, same(s, sampledAlone) && same(others[0], alone[0]) && same(others[1], alone[2]), 'sampled AR beside two greedy calls gives its tokens alone for its seed');

  // Five calls on three sequences: two wait, and all five give their output alone.
  const five = await Promise.all([0, 1, 2, 0, 1].map((i) => batch.generate(prompts[i], { maxTokens: n })));
  await check(t, five.every((r, j) => same(r, alone[[0, 1, 2, 0, 1][j]])), '5 calls on 3 sequences: each equals its output alone');

  // A call aborted while it waits for a sequence never runs.
  const busy = prompts.map((p) => batch.generate(p, { mode: 'ar', maxTokens: n }));
  const leave = new AbortController();
  const left = batch.generate(prompts[0], { maxTokens: n, signal: leave.signal }).catch((e) => e);
  leave.abort();
  const [w] = [await left, await Promise.all(busy)];
  await check(t, w.code === 'aborted' && w.partial?.tokens?.length === 0, `a call aborted while it waits: aborted, nothing generated (${w.code}, ${w.partial?.tokens?.length})`);

  const ctrl = new AbortController();
  const aborted = codeOf(batch.generate(prompts[0], { maxTokens: 200, signal: ctrl.signal, onToken: () => ctrl.abort() }));
  const failing = codeOf(batch.generate(prompts[2], { mode: 'ssd', maxTokens: n }));
  const kept = batch.generate(prompts[1], { maxTokens: n });
  await check(t, (await aborted) === 'aborted' && (await failing) === 'invalid_argument' && same(await kept, alone[1]),
    'an aborted call and a refused one (ssd does not batch) leave the third running, exact');

  // OpenAI's n: the choices of one request, in one batch; greedy, each is the single reply.
  const ask = { messages: [{ role: 'user', content: 'Say hi.' }], max_tokens: 24 };
  const one = await engine.chat.completions.create(ask);
  const two = await batch.chat.completions.create({ ...ask, n: 2 });
  await check(t, two.choices.length === 2 && two.choices.every((c, i) => c.index === i && c.message.content === one.choices[0].message.content)
    && two.usage.completion_tokens === 2 * one.usage.completion_tokens && two.usage.prompt_tokens === one.usage.prompt_tokens,
    `chat n: 2 choices, each the single reply; usage counts both (${JSON.stringify(two.usage)})`);
  const streamed = ['', ''];
  let usage = null;
  for await (const c of await batch.chat.completions.create({ ...ask, n: 2, stream: true })) {
    for (const ch of c.choices) streamed[ch.index] += ch.delta.content ?? '';
    usage = c.usage ?? usage;
  }
  await check(t, streamed.every((text) => text === one.choices[0].message.content) && usage?.completion_tokens === two.usage.completion_tokens,
    'chat n streamed: each choice\'s chunks make the single reply, and a last chunk has the usage');
  await check(t, (await codeOf(batch.chat.completions.create({ ...ask, n: 0 }))) === 'invalid_argument', 'chat n 0: invalid_argument');
  await batch.dispose();

  for (const parallel of [0, LIMITS.maxParallel + 1, 1.5]) {
    await check(t, (await codeOf(Saguaro.load({ target: bytes }, { parallel }))) === 'invalid_argument', `parallel ${parallel}: invalid_argument`);
  }
  await check(t, (await codeOf(Saguaro.load({ target: bytes, draft: bytes }, { parallel: 2, modes: ['ar', 'ssd'] }))) === 'invalid_argument',
    'parallel 2 with mode ssd: invalid_argument, before the load');
});

test('errors', async (t) => {
  const rejects = async (p, want, what) => {
    let got = null;
    try {
      await p;
    } catch (e) {
      got = e.code;
    }
    await check(t, got === want, `${what}: code ${want} (${got})`);
  };
  await rejects(engine.generate(g.prompt, { temperature: -1 }), 'invalid_argument', 'negative temperature');
  await rejects(engine.generate(g.prompt, { topP: 0 }), 'invalid_argument', 'top_p 0');
  await rejects(engine.generate(g.prompt, { mode: 'fast' }), 'invalid_argument', 'unknown mode');
  await rejects(engine.generate(g.prompt, { maxTokens: 0 }), 'invalid_argument', 'maxTokens 0');
  await rejects(Saguaro.load({ target: bytes.subarray(0, 4096) }), 'bad_model', 'truncated model');
  await rejects(Saguaro.load({ target: new Uint8Array(1000) }), 'bad_model', 'not a GGUF file');
  await rejects(Saguaro.load({ target: bytes }, { backend: 'gpu' }), 'no_webgpu', 'GPU in Node');
  await rejects(Saguaro.load({ target: bytes }, { specKay: 3 }), 'invalid_argument', 'an unknown load option');
  await rejects(Saguaro.load({ target: bytes }, { modes: ['ar', 'fast'] }), 'invalid_argument', 'an unknown mode name, checked by the engine');
  for (const threads of [0, 65, 1.5, 'two']) await rejects(Saguaro.load({ target: bytes }, { threads }), 'invalid_argument', `threads ${JSON.stringify(threads)}`);
  for (const kvCache of ['f8', 16]) await rejects(Saguaro.load({ target: bytes }, { kvCache }), 'invalid_argument', `kvCache ${JSON.stringify(kvCache)}`);
  await rejects(Saguaro.load({ target: bytes }, { shaderF16: 'yes' }), 'invalid_argument', 'shaderF16 not a boolean');
  await rejects(engine.generate(g.prompt, { maxToken: 3 }), 'invalid_argument', 'an unknown generate option');
  const after = await engine.generate(g.prompt, { mode: 'ar', maxTokens: n });
  await check(t, JSON.stringify(after.tokens) === JSON.stringify(ar.tokens), 'the engine still works after errors');
  await engine.dispose();
  await rejects(engine.generate(g.prompt), 'invalid_argument', 'generate after dispose');
});

test('an option only the engine lists', async (t) => {
  // An option only the engine lists reaches it: prompt lookup drafts SD from the prompt itself.
  const lookup = await Saguaro.load({ target: bytes }, { promptLookup: true });
  const looked = await lookup.generate(g.prompt, { mode: 'sd', maxTokens: n });
  await check(t, JSON.stringify(looked.tokens) === JSON.stringify(ar.tokens) && looked.stats.mode === 'sd', 'promptLookup: SD by prompt lookup equals AR');
  await lookup.dispose();
});

test('a gzip-encoded download', async (t) => {
  // A server that compresses the model: Content-Length is then the gzip size, not the file's.
  const gz = gzipSync(bytes, { level: 1 });
  const server = createServer((req, res) => {
    res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-encoding': 'gzip', 'content-length': gz.length });
    res.end(gz);
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  try {
    const served = await Saguaro.load({ target: `http://127.0.0.1:${server.address().port}/model.gguf` });
    const fromGzip = await served.generate(g.prompt, { mode: 'ar', maxTokens: n });
    await check(t, JSON.stringify(fromGzip.tokens) === JSON.stringify(ar.tokens), `a gzip-encoded download (${gz.length} of ${bytes.length} bytes) loads the same model`);
    await served.dispose();
  } finally {
    server.close();
  }
});

test('DEFAULTS and LIMITS', async (t) => {
  // The package's DEFAULTS and LIMITS (a generated module the main thread reads) are what its wasm
  // says: both come from src/contract.
  const pkg = import.meta.resolve('saguaro-web');
  const glue = await import(new URL('./saguaro.js', pkg).href);
  glue.initSync({ module: await readFile(new URL('./saguaro_bg.wasm', pkg)) });
  await check(t, JSON.stringify(glue.defaults()) === JSON.stringify(DEFAULTS) && JSON.stringify(glue.limits()) === JSON.stringify(LIMITS),
    `DEFAULTS and LIMITS equal the wasm's defaults() and limits() (${JSON.stringify(glue.defaults())})`);
});
