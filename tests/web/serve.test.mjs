// scripts/serve.mjs serves its root and nothing beside it: encoded `..` segments that lead to a
// sibling directory whose name starts with the root's must not reach it. Its pages are
// cross-origin isolated.
// Usage: node --test tests/web/serve.test.mjs
import { spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { check } from './golden.mjs';

const dir = mkdtempSync(join(tmpdir(), 'saguaro-serve-'));
const root = join(dir, 'site');
mkdirSync(join(root, 'www'), { recursive: true });
mkdirSync(join(dir, 'site-x'));
writeFileSync(join(root, 'www', 'index.html'), 'inside');
writeFileSync(join(dir, 'site-x', 's.txt'), 'secret');
writeFileSync(join(dir, 's.txt'), 'secret');

const port = 9000 + Math.floor(Math.random() * 1000);
const script = fileURLToPath(new URL('../../scripts/serve.mjs', import.meta.url));
const server = spawn('node', [script, root, String(port)], { stdio: ['ignore', 'pipe', 'inherit'] });
await new Promise((resolve) => server.stdout.once('data', resolve));
after(() => {
  server.kill();
  rmSync(dir, { recursive: true, force: true });
});

/** Status and body for a raw request path (sent as written: fetch would normalize `..`). */
async function get(path) {
  const { request } = await import('node:http');
  return new Promise((resolve, reject) => {
    const req = request({ host: '127.0.0.1', port, path }, (res) => {
      let body = '';
      res.on('data', (c) => (body += c));
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body }));
    });
    req.on('error', reject);
    req.end();
  });
}

test('the demo server stays inside its root', async (t) => {
  const ok = await get('/www/index.html');
  await check(t, ok.status === 200 && ok.body === 'inside', `a file under the root is served (${ok.status})`);
  const { 'cross-origin-opener-policy': coop, 'cross-origin-embedder-policy': coep } = ok.headers;
  await check(t, coop === 'same-origin' && coep === 'require-corp', `pages are cross-origin isolated (COOP ${coop}, COEP ${coep})`);
  const dirIndex = await get('/www/');
  await check(t, dirIndex.status === 200 && dirIndex.body === 'inside', `a directory serves its index.html (${dirIndex.status})`);
  for (const path of ['/..%2Fsite-x/s.txt', '/%2e%2e%2fsite-x/s.txt', '/www/..%2F..%2Fsite-x/s.txt', '/..%2Fs.txt', '/../site-x/s.txt']) {
    const r = await get(path);
    await check(t, r.status !== 200 && !r.body.includes('secret'), `${path} stays inside the root (${r.status})`);
  }
  const bad = await get('/%E0%A4%A');
  await check(t, bad.status === 400, `a path that does not decode is refused (${bad.status})`);
});
