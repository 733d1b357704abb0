// The draft in its own Web Worker, on the wasm CPU backend: for SSD it speculates the next round
// while the engine worker's target verifies this one, so the two really run at once; for SD it
// drafts each round's tokens; at load it times itself for the engine's choice of mode. It is the
// one copy of the draft (the engine worker holds none). Jobs arrive on a MessagePort from the
// engine worker and are answered strictly in order.
import { errorInfo, holdLock, loadDraft } from './core.js';

self.onmessage = async (e) => {
  const { port, source, opts, lock } = e.data;
  // Held until this worker ends, however it ends: the engine worker waits on it to learn that.
  await holdLock(lock);
  let draft;
  try {
    draft = await loadDraft(source, opts, (p) => self.postMessage({ type: 'progress', progress: p }));
  } catch (err) {
    port.postMessage({ type: 'failed', error: errorInfo(err) });
    self.postMessage({ type: 'failed', error: errorInfo(err) });
    return;
  }
  port.postMessage({ type: 'ready', info: draft.info(), lock });
  self.postMessage({ type: 'ready' });
  // A sign of life between replies: the engine gives up on a draft silent for too long.
  setInterval(() => port.postMessage('alive'), 1000);
  let queue = Promise.resolve();
  port.onmessage = (m) => {
    // Not queued: it must reach the speculation that is running now.
    if (m.data === 'interrupt') {
      draft.interrupt();
      return;
    }
    queue = queue.then(async () => {
      try {
        const out = await draft.handle(m.data);
        // A sampled proposal's distributions (SSD's or SD's) move rather than copy.
        port.postMessage(out, out.q.map((row) => row.buffer));
      } catch (err) {
        port.postMessage({ reply: { error: errorInfo(err) }, q: [] });
      }
    });
  };
};
