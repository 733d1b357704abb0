// A local stand-in for the Hugging Face hub, for the browser tests of `hf:` names: it answers as
// the hub does. `/OWNER/REPO/resolve/REVISION/PATH` redirects (302) to the file's bytes, which
// are served with an ETag, a Content-Length, byte ranges (206) and CORS headers; an unknown file
// is a 404. A repository added `unsized` serves its files without a Content-Length (chunked), as
// a server that does not say a file's size. Requests are counted by method and path.
// Also here: `splitGguf`, which cuts a GGUF file into parts as llama.cpp's gguf-split does.
import { createServer } from 'node:http';

/** Start the hub on a random local port. `hub.put(repo, revision, path, bytes)` adds or replaces a
 * file (a new ETag each time); `hub.requests` counts `METHOD /path`. */
export async function startHub({ unsized = [] } = {}) {
  const files = new Map();
  const requests = {};
  let version = 0;
  const cors = {
    'access-control-allow-origin': '*',
    'access-control-expose-headers': 'etag, content-length, content-range, accept-ranges',
    'cross-origin-resource-policy': 'cross-origin',
  };
  const server = createServer((req, res) => {
    const url = new URL(req.url, 'http://hub');
    const key = `${req.method} ${url.pathname}`;
    requests[key] = (requests[key] ?? 0) + 1;
    const resolve = /^\/([^/]+)\/([^/]+)\/resolve\/([^/]+)\/(.+)$/.exec(url.pathname);
    if (resolve) {
      const [, owner, repo, revision, path] = resolve.map(decodeURIComponent);
      const id = `${owner}/${repo}@${revision}/${path}`;
      if (!files.has(id)) {
        res.writeHead(404, { ...cors, 'x-error-code': 'EntryNotFound', 'content-type': 'text/plain' });
        return res.end(`Entry not found: ${id}\n`);
      }
      res.writeHead(302, { ...cors, location: `/cdn/${encodeURIComponent(id)}` });
      return res.end();
    }
    const cdn = /^\/cdn\/(.+)$/.exec(url.pathname);
    const file = cdn && files.get(decodeURIComponent(cdn[1]));
    if (!file) {
      res.writeHead(404, cors);
      return res.end();
    }
    const { bytes, etag, chunked } = file;
    const headers = { ...cors, etag, 'accept-ranges': 'bytes', 'cache-control': 'no-store', 'content-type': 'application/octet-stream' };
    const range = /^bytes=(\d+)-(\d*)$/.exec(req.headers.range ?? '');
    let body = bytes;
    if (range) {
      const start = Number(range[1]);
      const end = range[2] ? Math.min(Number(range[2]), bytes.length - 1) : bytes.length - 1;
      body = bytes.subarray(start, end + 1);
      headers['content-range'] = `bytes ${start}-${end}/${bytes.length}`;
    }
    if (!chunked) headers['content-length'] = body.length;
    res.writeHead(range ? 206 : 200, headers);
    if (req.method === 'HEAD') return res.end();
    // In pieces, as a network delivers them.
    let at = 0;
    const more = () => {
      while (at < body.length) {
        const piece = body.subarray(at, at + (1 << 20));
        at += piece.length;
        if (!res.write(piece)) return res.once('drain', more);
      }
      res.end();
    };
    more();
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    requests,
    put(repo, revision, path, bytes) {
      files.set(`${repo}@${revision}/${path}`, { bytes, etag: `"${++version}-${bytes.length}"`, chunked: unsized.includes(repo) });
    },
    close: () => new Promise((r) => server.close(r)),
  };
}

/** `file` (a GGUF file's bytes) cut into `n` GGUF files as llama.cpp's gguf-split cuts it: the
 * tensors shared out in order, the first part with all the metadata, every part with the
 * `split.no`, `split.count` and `split.tensors.count` keys and its own tensor index. */
export function splitGguf(file, n) {
  const view = new DataView(file.buffer, file.byteOffset, file.byteLength);
  let at = 0;
  const u32 = () => ((at += 4), view.getUint32(at - 4, true));
  const u64 = () => ((at += 8), Number(view.getBigUint64(at - 8, true)));
  const str = () => {
    const len = u64();
    at += len;
    return file.subarray(at - len, at);
  };
  const SIZES = { 0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8 };
  const skip = (type) => {
    if (type === 8) return void str();
    if (type === 9) {
      const elem = u32();
      const count = u64();
      for (let i = 0; i < count; i++) skip(elem);
      return;
    }
    at += SIZES[type];
  };
  if (u32() !== 0x46554747) throw new Error('not a GGUF file');
  u32();
  const nTensors = u64();
  const nKv = u64();
  const kvStart = at;
  let alignment = 32;
  for (let i = 0; i < nKv; i++) {
    const key = new TextDecoder().decode(str());
    const type = u32();
    if (key === 'general.alignment') alignment = view.getUint32(at, true);
    skip(type);
  }
  const kv = file.subarray(kvStart, at);
  const tensors = [];
  for (let i = 0; i < nTensors; i++) {
    const name = str();
    const nDims = u32();
    const dims = Array.from({ length: nDims }, u64);
    tensors.push({ name, dims, type: u32(), offset: u64() });
  }
  const dataStart = Math.ceil(at / alignment) * alignment;
  // Each tensor's bytes run to the next one's offset (its padding included).
  const byOffset = [...tensors].sort((a, b) => a.offset - b.offset);
  byOffset.forEach((t, i) => (t.size = (byOffset[i + 1]?.offset ?? file.length - dataStart) - t.offset));

  const per = Math.ceil(nTensors / n);
  const parts = [];
  for (let p = 0; p < n; p++) {
    const mine = tensors.slice(p * per, (p + 1) * per);
    const out = [];
    const push = (bytes) => out.push(Buffer.from(bytes));
    const num = (bits, v) => {
      const b = Buffer.alloc(bits / 8);
      if (bits === 16) b.writeUInt16LE(v);
      else if (bits === 32) b.writeUInt32LE(v);
      else b.writeBigUInt64LE(BigInt(v));
      push(b);
    };
    const text = (s) => {
      const b = typeof s === 'string' ? Buffer.from(s) : s;
      num(64, b.length);
      push(b);
    };
    num(32, 0x46554747);
    num(32, 3);
    num(64, mine.length);
    num(64, (p === 0 ? nKv : 0) + 3);
    if (p === 0) push(kv);
    for (const [key, type, bits, v] of [['split.no', 2, 16, p], ['split.count', 2, 16, n], ['split.tensors.count', 5, 32, nTensors]]) {
      text(key);
      num(32, type);
      num(bits, v);
    }
    let offset = 0;
    for (const t of mine) {
      text(t.name);
      num(32, t.dims.length);
      t.dims.forEach((d) => num(64, d));
      num(32, t.type);
      num(64, offset);
      offset += Math.ceil(t.size / alignment) * alignment;
    }
    const head = Buffer.concat(out);
    const padded = Buffer.alloc(Math.ceil(head.length / alignment) * alignment);
    head.copy(padded);
    const data = mine.map((t) => {
      const b = Buffer.alloc(Math.ceil(t.size / alignment) * alignment);
      Buffer.from(file.subarray(dataStart + t.offset, dataStart + t.offset + t.size)).copy(b);
      return b;
    });
    parts.push(Buffer.concat([padded, ...data]));
  }
  return parts;
}
