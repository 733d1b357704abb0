// Concurrent calls on the npm package in Node (wasm CPU backend): one engine loaded with
// `parallel` at the largest concurrency, then at each concurrency N, N calls made at once
// (greedy, AR, N different code prompts) against the same N calls one after another on an engine
// of one sequence at a time. Runs alternate, so that the machine's load falls on both alike; the
// figure is every call's generated tokens over the wall time (prefills included), median of the
// rounds, and each batched call's tokens are checked equal to its tokens alone.
//
// Usage: node scripts/bench-parallel.mjs [--target models/FILE.gguf] [--concurrency 1,2,4]
//        [--tokens N] [--rounds N] [--threads N] [--context N]
// Needs: pkg/ (scripts/build-web.sh), models/ (scripts/fetch-models.sh).
import { readFile } from 'node:fs/promises';
import { parseArgs } from 'node:util';

const { values: args } = parseArgs({
  options: {
    target: { type: 'string', default: 'models/qwen2.5-coder-0.5b-instruct.gguf' },
    concurrency: { type: 'string', default: '1,2,4' },
    tokens: { type: 'string', default: '32' },
    rounds: { type: 'string', default: '2' },
    threads: { type: 'string', default: '2' },
    context: { type: 'string', default: '512' },
  },
});
const { Saguaro } = await import(new URL('../pkg/index.js', import.meta.url).href);
const levels = args.concurrency.split(',').map(Number);
const [tokens, rounds] = [Number(args.tokens), Number(args.rounds)];
const opts = { threads: Number(args.threads), context: Number(args.context), modes: ['ar'] };
const prompts = ['def quicksort(arr):', 'fn main() {', 'class Stack:', 'function debounce(fn, ms) {', 'SELECT name FROM', 'import numpy as np', '#include <stdio.h>', 'def fibonacci(n):'];
const bytes = await readFile(args.target);
const single = await Saguaro.load({ target: bytes }, opts);
const batch = await Saguaro.load({ target: bytes }, { ...opts, parallel: Math.max(...levels) });
const gen = { mode: 'ar', maxTokens: tokens };

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
for (const n of levels) {
  const ps = Array.from({ length: n }, (_, i) => prompts[i % prompts.length]);
  const rate = { inLine: [], atOnce: [] };
  for (let r = 0; r < rounds; r++) {
    let t = performance.now();
    const alone = [];
    for (const p of ps) alone.push(await single.generate(p, gen));
    rate.inLine.push(alone.reduce((s, x) => s + x.tokens.length, 0) / ((performance.now() - t) / 1000));
    t = performance.now();
    const together = await Promise.all(ps.map((p) => batch.generate(p, gen)));
    rate.atOnce.push(together.reduce((s, x) => s + x.tokens.length, 0) / ((performance.now() - t) / 1000));
    const differ = together.findIndex((x, i) => JSON.stringify(x.tokens) !== JSON.stringify(alone[i].tokens));
    if (differ >= 0) throw new Error(`concurrency ${n}: call ${differ}'s tokens differ from its tokens alone`);
  }
  const [inLine, atOnce] = [median(rate.inLine), median(rate.atOnce)];
  console.log(`${n} calls: at once ${atOnce.toFixed(1)} tok/s in all, one after another ${inLine.toFixed(1)} tok/s (${(atOnce / inLine).toFixed(2)}x)`);
}
await single.dispose();
await batch.dispose();
