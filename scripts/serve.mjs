// A small static file server for the demo: serves the repository root (www/, pkg/, models/) on
// 127.0.0.1 (a secure context, so WebGPU is available) with the right MIME types, lengths (for
// download progress) and no caching surprises. Pages are cross-origin isolated (COOP and COEP), so
// that wasm memory can be shared and the package's CPU backend computes on several threads.
import { createReadStream, statSync } from 'node:fs';
import { createServer } from 'node:http';
import { extname, isAbsolute, join, relative, resolve, sep } from 'node:path';

const root = resolve(process.argv[2] ?? '.');
const port = Number(process.argv[3] ?? 8080);
const TYPES = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.mjs': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.json': 'application/json',
  '.wasm': 'application/wasm',
  '.svg': 'image/svg+xml',
  '.png': 'image/png',
};

/** The file a URL path names under `root`, or null when it would lie outside it. A prefix test
 * on the joined string is not enough: `/..%2Froot-x/f` joins to `root-x/f`, which starts with
 * `root`. */
function inside(path) {
  const file = resolve(root, `.${path}`);
  const rel = relative(root, file);
  return rel !== '..' && !rel.startsWith(`..${sep}`) && !isAbsolute(rel) ? file : null;
}

createServer((req, res) => {
  let path;
  try {
    path = decodeURIComponent(new URL(req.url, 'http://x').pathname);
  } catch {
    res.writeHead(400);
    return res.end();
  }
  if (path === '/') {
    res.writeHead(302, { location: '/www/' });
    return res.end();
  }
  let file = inside(path);
  if (file === null) {
    res.writeHead(403);
    return res.end();
  }
  let st;
  try {
    st = statSync(file);
    if (st.isDirectory()) {
      file = join(file, 'index.html');
      st = statSync(file);
    }
  } catch {
    res.writeHead(404, { 'content-type': 'text/plain' });
    return res.end(`not found: ${path}\n`);
  }
  res.writeHead(200, {
    'content-type': TYPES[extname(file)] ?? 'application/octet-stream',
    'content-length': st.size,
    'cache-control': 'no-cache',
    'cross-origin-opener-policy': 'same-origin',
    'cross-origin-embedder-policy': 'require-corp',
  });
  if (req.method === 'HEAD') return res.end();
  createReadStream(file).pipe(res);
}).listen(port, '127.0.0.1', () => console.log(`serving ${root} at http://127.0.0.1:${port}/www/`));
