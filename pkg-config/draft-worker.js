// SSD's draft in its own Web Worker, on the wasm CPU backend: it speculates the next round while
// the engine worker's target verifies this one, so the two really run at once. Jobs arrive on a
// MessagePort from the engine worker and are answered strictly in order.
import { errorInfo, loadDraft } from './core.js';

self.onmessage = async (e) => {
  const { port, source, opts } = e.data;
  let draft;
  try {
    draft = await loadDraft(source, opts, (p) => self.postMessage({ type: 'progress', progress: p }));
  } catch (err) {
    port.postMessage({ type: 'failed', error: errorInfo(err) });
    self.postMessage({ type: 'failed', error: errorInfo(err) });
    return;
  }
  port.postMessage({ type: 'ready', info: draft.info() });
  self.postMessage({ type: 'ready' });
  let queue = Promise.resolve();
  port.onmessage = (m) => {
    queue = queue.then(async () => {
      try {
        port.postMessage(await draft.handle(m.data));
      } catch (err) {
        port.postMessage({ error: errorInfo(err) });
      }
    });
  };
};
