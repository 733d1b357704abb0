// Where downloaded models are kept, and how they are read back: the origin private file system
// (OPFS), the Cache API, or nowhere. A model file is written to its store as it downloads (in a
// worker through a sync access handle where the browser has one) and read back piece by piece;
// an entry is recorded only once its file is whole, so a half-written file is never read as a
// model. A store that is too full (before the download, or midway) is left out: the load goes
// on without caching and a warning gives the sizes. Sources may be Hugging Face names,
// `hf:OWNER/REPO/PATH.gguf[@REVISION]`.

export const DEFAULT_HUB = 'https://huggingface.co';
/** OPFS directory of the stored files. */
const DIR = 'saguaro-models';
/** Cache API cache (v1 was keyed by URL alone, and never cleaned up after). */
const CACHE = 'saguaro-models-v2';
const OLD_CACHES = ['saguaro-models-v1'];
/** A file stored this recently is taken as current without asking its source (a model read
 * as target and then as draft is asked for once). */
const JUST_STORED_MS = 60_000;
/** Bytes read from a store at a time. */
const CHUNK = 1 << 22;
const HF = /^hf:([^/@]+)\/([^/@]+)\/([^@]+)(?:@(.+))?$/;

/** An error with a `code`, as the package's errors carry (core.js makes it a SaguaroError). */
function failure(code, message) {
  return Object.assign(new Error(message), { code });
}

/** The URL to fetch for `name`: a Hugging Face name resolved against `hub`, another URL made
 * absolute against the page. */
export function resolveUrl(name, hub = DEFAULT_HUB) {
  if (name.startsWith('hf:')) {
    const m = HF.exec(name);
    if (!m) throw failure('invalid_argument', `${name}: a Hugging Face name is hf:OWNER/REPO/PATH.gguf, optionally @REVISION`);
    const [, owner, repo, path, revision = 'main'] = m;
    const file = path.split('/').map(encodeURIComponent).join('/');
    return `${hub.replace(/\/+$/, '')}/${owner}/${repo}/resolve/${encodeURIComponent(revision)}/${file}`;
  }
  return new URL(name, globalThis.location?.href).href;
}

/** The store the `cache` option names: 'opfs', 'cache-api', or null (false); true or undefined
 * is the best this browser offers. */
export async function storeFor(cache) {
  if (cache === false) return null;
  if (cache === 'opfs') return (await opfs.available()) ? opfs : unavailable('opfs');
  if (cache === 'cache-api') return cacheApi.available() ? cacheApi : unavailable('cache-api');
  if (cache !== undefined && cache !== true) {
    throw failure('invalid_argument', `cache: expected 'opfs', 'cache-api', true or false, got ${JSON.stringify(cache)}`);
  }
  if (await opfs.available()) return opfs;
  return cacheApi.available() ? cacheApi : null;
}

function unavailable(name) {
  throw failure('invalid_argument', `cache '${name}': this browser has no such store here`);
}

const mb = (n) => `${(n / 1e6).toFixed(1)} MB`;

async function estimate() {
  try {
    return (await globalThis.navigator?.storage?.estimate?.()) ?? null;
  } catch {
    return null;
  }
}

/** The SHA-256 of `name` in hex: the name of its files in OPFS. */
async function keyOf(name) {
  const digest = await crypto.subtle.digest('SHA-256', new TextEncoder().encode(name));
  return [...new Uint8Array(digest)].map((b) => b.toString(16).padStart(2, '0')).join('');
}

const opfs = {
  name: 'opfs',
  async available() {
    try {
      return !!(await globalThis.navigator?.storage?.getDirectory?.());
    } catch {
      return false;
    }
  },
  async dir() {
    return (await navigator.storage.getDirectory()).getDirectoryHandle(DIR, { create: true });
  },
  /** The entry for `name`, with its file, or null when none is whole. */
  async get(name) {
    const dir = await this.dir();
    const key = await keyOf(name);
    const meta = await readJson(dir, `${key}.json`);
    if (!meta) return null;
    const file = await dir.getFileHandle(`${key}.gguf`).then((h) => h.getFile(), () => null);
    if (file?.size !== meta.size) return null;
    return { ...meta, read: () => fileChunks(file) };
  },
  async list() {
    const dir = await this.dir();
    const out = [];
    for await (const [entry] of dir.entries()) {
      if (!entry.endsWith('.json')) continue;
      const meta = await readJson(dir, entry);
      const file = await dir.getFileHandle(entry.replace(/\.json$/, '.gguf')).then((h) => h.getFile(), () => null);
      if (meta && file?.size === meta.size) out.push({ url: meta.url, size: meta.size, store: 'opfs', storedAt: meta.storedAt });
    }
    return out;
  },
  async delete(name) {
    const dir = await this.dir();
    const key = await keyOf(name);
    // The record first: a file without one is never read.
    const had = await dir.removeEntry(`${key}.json`).then(() => true, () => false);
    await dir.removeEntry(`${key}.gguf`).catch(() => {});
    return had;
  },
  async clear() {
    await (await navigator.storage.getDirectory()).removeEntry(DIR, { recursive: true }).catch(() => {});
  },
  /** A writer of `name`'s file; its record is written by `commit` once the file is whole. */
  async writer(name, meta) {
    const dir = await this.dir();
    const key = await keyOf(name);
    await dir.removeEntry(`${key}.json`).catch(() => {});
    const handle = await dir.getFileHandle(`${key}.gguf`, { create: true });
    const file = await openFile(handle);
    let at = 0;
    return {
      async write(chunk) {
        await file.write(chunk, at);
        at += chunk.byteLength;
      },
      async commit() {
        await file.close();
        await writeFile(dir, `${key}.json`, JSON.stringify({ ...meta, size: at, storedAt: Date.now() }));
      },
      async abort() {
        await file.close().catch(() => {});
        // `commit` may have written part of the record before it failed.
        await removeIfThere(dir, `${key}.json`);
        await removeIfThere(dir, `${key}.gguf`);
      },
    };
  },
};

/** `handle`'s file opened for writing from its start: a sync access handle in a worker where
 * the browser has one, else a writable stream. */
async function openFile(handle) {
  if (typeof handle.createSyncAccessHandle === 'function') {
    const h = await handle.createSyncAccessHandle();
    h.truncate(0);
    return {
      write: (chunk, at) => {
        const n = h.write(chunk, { at });
        if (n !== chunk.byteLength) throw new DOMException(`wrote ${n} of ${chunk.byteLength} bytes`, 'QuotaExceededError');
      },
      close: async () => {
        h.flush();
        h.close();
      },
    };
  }
  const w = await handle.createWritable();
  return { write: (chunk) => w.write(chunk), close: () => w.close() };
}

async function writeFile(dir, name, text) {
  const file = await openFile(await dir.getFileHandle(name, { create: true }));
  try {
    await file.write(new TextEncoder().encode(text), 0);
  } finally {
    // A sync access handle left open keeps the file locked (e.g. after a full store).
    await file.close();
  }
}

/** Removes `name` from `dir`; one that is not there is no error. */
async function removeIfThere(dir, name) {
  try {
    await dir.removeEntry(name);
  } catch (e) {
    if (e?.name !== 'NotFoundError') throw e;
  }
}

async function readJson(dir, name) {
  try {
    return JSON.parse(await (await (await dir.getFileHandle(name)).getFile()).text());
  } catch {
    return null;
  }
}

async function* fileChunks(file) {
  for (let at = 0; at < file.size; at += CHUNK) yield new Uint8Array(await file.slice(at, at + CHUNK).arrayBuffer());
}

/** Cache API entries are keyed by a URL made from the name (a Hugging Face name is not one). */
const cacheKey = (name) => `https://saguaro.invalid/${encodeURIComponent(name)}`;

const cacheApi = {
  name: 'cache-api',
  available: () => typeof caches !== 'undefined',
  async get(name) {
    const r = await (await caches.open(CACHE)).match(cacheKey(name));
    if (!r) return null;
    const blob = await r.blob();
    return { ...metaOf(r), size: blob.size, read: () => fileChunks(blob) };
  },
  async list() {
    const cache = await caches.open(CACHE);
    const out = [];
    for (const req of await cache.keys()) {
      const r = await cache.match(req);
      if (r) out.push({ url: metaOf(r).url, size: (await r.blob()).size, store: 'cache-api', storedAt: metaOf(r).storedAt });
    }
    return out;
  },
  async delete(name) {
    return (await caches.open(CACHE)).delete(cacheKey(name));
  },
  async clear() {
    for (const c of [CACHE, ...OLD_CACHES]) await caches.delete(c);
  },
  /** The body is handed to `put` as it is written: the entry exists once `put` has read it all. */
  async writer(name, meta) {
    const cache = await caches.open(CACHE);
    let controller;
    // `pull` is called when `put` wants more: `write` waits for it, so at most a few chunks
    // wait in memory however slowly the cache reads.
    let wanted = null;
    const body = new ReadableStream(
      {
        start: (c) => (controller = c),
        pull: () => {
          wanted?.();
          wanted = null;
        },
      },
      { highWaterMark: 2 },
    );
    const headers = { 'x-saguaro-url': meta.url, 'x-saguaro-stored-at': String(Date.now()) };
    if (meta.etag) headers['x-saguaro-etag'] = meta.etag;
    const put = cache.put(cacheKey(name), new Response(body, { headers }));
    // `put` settling before the body is closed means the cache stopped reading.
    const stopped = put.then(() => {
      throw new Error('the Cache API stopped reading the file');
    });
    stopped.catch(() => {});
    return {
      async write(chunk) {
        try {
          controller.enqueue(chunk);
          // A failed `put` errors the stream (desiredSize null): the next enqueue throws.
          while (controller.desiredSize !== null && controller.desiredSize <= 0) {
            await Promise.race([new Promise((resolve) => (wanted = resolve)), stopped]);
          }
        } catch {
          // The cache stopped reading: `put` says why (a full store).
          await stopped;
        }
      },
      async commit() {
        controller.close();
        await put;
      },
      async abort() {
        controller.error(new Error('not stored'));
        await put.catch(() => {});
        await cache.delete(cacheKey(name));
      },
    };
  },
};

function metaOf(r) {
  const h = r.headers;
  return { url: h.get('x-saguaro-url'), etag: h.get('x-saguaro-etag'), storedAt: Number(h.get('x-saguaro-stored-at')) };
}

/** Whether a stored entry still matches its source: its ETag and length, as a HEAD request
 * tells them (an unreachable source, e.g. offline, leaves the entry trusted). */
async function fresh(entry, url) {
  let r;
  try {
    r = await fetch(url, { method: 'HEAD' });
  } catch {
    return true;
  }
  if (!r.ok) return true;
  const etag = r.headers.get('etag');
  if (etag && entry.etag && etag !== entry.etag) return false;
  const length = plainLength(r);
  return !(length && length !== entry.size);
}

/** Content-Length, where it counts the body's bytes (with a Content-Encoding it counts the
 * encoded ones). */
function plainLength(r) {
  const encoding = r.headers.get('content-encoding');
  const n = !encoding || encoding === 'identity' ? Number(r.headers.get('content-length')) : 0;
  return n > 0 ? n : null;
}

/** The file `name` names (a URL or a Hugging Face name), from `store` when it holds it whole and
 * current, else downloaded and written to `store` as it is read. Resolves to {total, fromCache,
 * chunks()}: `chunks()` yields the bytes in order, and has stored them once it is done. */
export async function openUrl(name, { store, hub, role }) {
  const url = resolveUrl(name, hub);
  let entry = null;
  try {
    entry = store ? await store.get(name) : null;
    if (entry && Date.now() - entry.storedAt > JUST_STORED_MS && !(await fresh(entry, url))) {
      console.info(`saguaro: ${name} changed at its source since it was stored: fetching it again`);
      await store.delete(name);
      entry = null;
    }
  } catch (e) {
    console.warn(`saguaro: the ${store.name} store could not be read (${e.message}): fetching ${name}`);
  }
  if (entry) return { total: entry.size, fromCache: true, chunks: entry.read };
  let response;
  try {
    response = await fetch(url);
  } catch (e) {
    throw failure('bad_model', `${role}: cannot fetch ${url}: ${e.message}`);
  }
  if (!response.ok) throw failure('bad_model', `${role}: ${url} answered HTTP ${response.status}`);
  const total = plainLength(response);
  const meta = { url: name, etag: response.headers.get('etag') };
  return { total, fromCache: false, chunks: () => storing(response.body, store, name, meta, total) };
}

/** `body`'s chunks, each written to `store` as it passes; a store that fails (full) is dropped
 * with a warning, and the file it held in part removed. */
async function* storing(body, store, name, meta, total) {
  let writer = store ? await startWriting(store, name, meta, total) : null;
  let written = 0;
  const discard = async () => {
    const w = writer;
    writer = null;
    await w.abort().catch(() => {});
  };
  const drop = async (e) => {
    await discard();
    const room = await estimate();
    const used = room ? ` (${mb(room.usage)} of ${mb(room.quota)} in use)` : '';
    const size = total ? ` of ${mb(total)}` : '';
    const why = e?.name === 'QuotaExceededError' ? 'ran out of room' : `failed (${e?.message ?? e})`;
    console.warn(`saguaro: ${name} is not cached: the ${store.name} store ${why} after ${mb(written)}${size}${used}; the model loads all the same`);
  };
  let finished = false;
  try {
    for await (const chunk of chunksOf(body)) {
      if (writer) {
        try {
          await writer.write(chunk);
          written += chunk.byteLength;
        } catch (e) {
          await drop(e);
        }
      }
      yield chunk;
    }
    finished = true;
    // A body that ended short of its Content-Length (a dropped connection) is not the file.
    if (writer && total && written !== total) {
      await discard();
      console.warn(`saguaro: ${name} is not cached: its download ended after ${mb(written)} of the ${mb(total)} its Content-Length gave`);
    }
    if (writer) await writer.commit().catch(drop);
  } finally {
    // Left early (a refused model, a failed load): nothing half written stays.
    if (!finished && writer) await discard();
  }
}

/** A writer for `name` in `store`, or null (with a warning) when the store lacks the room for
 * `total` bytes or cannot be written. */
async function startWriting(store, name, meta, total) {
  const room = await estimate();
  if (total && room?.quota && room.quota - room.usage < total) {
    console.warn(`saguaro: ${name} (${mb(total)}) is not cached: the ${store.name} store has ${mb(room.quota - room.usage)} free (${mb(room.usage)} of ${mb(room.quota)} in use); the model loads all the same`);
    return null;
  }
  try {
    return await store.writer(name, meta);
  } catch (e) {
    console.warn(`saguaro: ${name} is not cached: the ${store.name} store cannot be written (${e.message})`);
    return null;
  }
}

/** The chunks of a ReadableStream or an async iterable; a reader left early cancels the stream. */
export async function* chunksOf(chunks) {
  if (chunks[Symbol.asyncIterator] && !(chunks instanceof ReadableStream)) {
    yield* chunks;
    return;
  }
  const reader = chunks.getReader();
  let finished = false;
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) {
        finished = true;
        return;
      }
      yield value;
    }
  } finally {
    if (!finished) reader.cancel().catch(() => {});
  }
}

/** Every store this browser has. */
async function stores() {
  const all = [];
  if (await opfs.available()) all.push(opfs);
  if (cacheApi.available()) all.push(cacheApi);
  return all;
}

/** `Saguaro.cache`: what the stores hold, and removing it. `url`s are the names models were
 * loaded by (a URL made absolute, or a Hugging Face name). */
export const modelCache = {
  async list() {
    return (await Promise.all((await stores()).map((s) => s.list()))).flat();
  },
  async delete(url) {
    const names = new Set([url]);
    if (!url.startsWith('hf:')) names.add(resolveUrl(url));
    let any = false;
    for (const s of await stores()) for (const n of names) any = (await s.delete(n)) || any;
    return any;
  },
  async clear() {
    for (const s of await stores()) await s.clear();
  },
};
