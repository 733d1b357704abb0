// The golden reference (HF transformers fp32) for the web tests, with the near-tie rule of the
// Rust golden tests: where the reference's own top-1/top-2 margin is below 0.01, either token is
// accepted and the comparison ends there.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

/** `SAGUARO_GOLDEN` names the directory when this file runs outside the repository. */
export function golden(model = 'smollm2-135m-instruct-q4_1', index = 0) {
  const dir = process.env.SAGUARO_GOLDEN ?? fileURLToPath(new URL('../golden/', import.meta.url));
  const file = join(dir, `${model}.json`);
  return JSON.parse(readFileSync(file, 'utf8')).cases[index];
}

/** null when `ids` reproduce the reference's greedy ids, else a description of the first difference. */
export function greedyMismatch(ids, c) {
  for (let j = 0; j < ids.length; j++) {
    if (j >= c.greedy_ids.length) return `generated past the reference's ${c.greedy_ids.length} tokens`;
    if (ids[j] === c.greedy_ids[j]) continue;
    const [a, b] = c.top5[j];
    if (a[1] - b[1] < 0.01 && ids[j] === b[0]) return null;
    return `token ${j}: ${ids[j]}, reference ${c.greedy_ids[j]}`;
  }
  return null;
}

/** One check as its own subtest of `t` (a node:test context): it passes or fails by itself, the
 * checks after it run either way, and the runner counts it. */
export function check(t, cond, msg) {
  return t.test(msg, () => assert.ok(cond, msg));
}
