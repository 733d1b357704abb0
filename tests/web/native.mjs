// The native engine's output for the web tests to compare with: `saguaro generate --json`, which
// runs the same engine on the native backends (`SAGUARO_BIN`, by default the release build's).
import { execFileSync } from 'node:child_process';

export const bin = process.env.SAGUARO_BIN ?? 'target/release/saguaro';

/** The completion `saguaro generate` gives for `prompt` with these options: `--name value` for
 * each { name: value } (camelCase as kebab-case), e.g. { target, mode: 'ssd', seed: 5 }. */
export function generate(prompt, options) {
  const args = ['generate', '--prompt', prompt, '--json'];
  for (const [name, value] of Object.entries(options)) args.push(`--${name.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`)}`, String(value));
  return JSON.parse(execFileSync(bin, args, { maxBuffer: 1 << 24 }).toString());
}
