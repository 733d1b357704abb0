// `saguaro serve` for the web tests: the SmolLM2 target on one thread, on a loopback port.
import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';

/** Start the server (`listen`: HOST:PORT, port 0 for any); resolves to {url, stop()} once it listens. */
export async function startServe(bin, model, listen = '127.0.0.1:0') {
  const child = spawn(bin, ['serve', '--target', model, '--threads', '1', '--listen', listen], { stdio: ['ignore', 'pipe', 'inherit'] });
  const exited = new Promise((resolve) => child.once('exit', resolve));
  const line = await Promise.race([
    new Promise((resolve) => createInterface({ input: child.stdout }).once('line', resolve)),
    exited.then((code) => Promise.reject(new Error(`saguaro serve exited (${code}) before listening`))),
    new Promise((_, reject) => setTimeout(() => reject(new Error('saguaro serve did not start within 2 minutes')), 120_000).unref()),
  ]);
  const url = line.trim().replace(/^listening on /, '');
  if (!url.startsWith('http://')) throw new Error(`unexpected first line from saguaro serve: ${line}`);
  return {
    url,
    async stop() {
      child.kill('SIGKILL');
      await exited;
    },
  };
}
