// The engine's Web Worker: the target (on WebGPU or the CPU), and the draft only where no draft
// worker serves it (SD without SSD, or a GPU draft). The page's main thread only talks to it
// (index.js). A CPU draft for SSD lives in a second worker (draft-worker.js), reached through a
// MessagePort the page hands over; it drafts for SD too, and times itself for the engine's choice
// of mode. With the threads build, the same script also runs each compute thread of the engine
// (or of the draft worker; core.js starts them, first message `{type: 'thread'}`).
import { errorInfo, generate, holdLock, loadEngine, runThread, whenLockFree } from './core.js';

let engine = null;
let running = null;
/** The generation in progress (settled when none runs): the engine is taken while it runs. */
let generating = Promise.resolve();
/** A draft worker being attached (settled when none is): the engine is taken while the target
 * and the draft are timed. */
let attaching = Promise.resolve();
const aborted = new Set();

function post(msg) {
  self.postMessage(msg);
}

/** The draft worker's first message on the port: its model info and lock, or why it failed. */
function draftReady(port) {
  return new Promise((resolve, reject) => {
    port.onmessage = (e) => {
      port.onmessage = null;
      if (e.data?.type === 'ready') resolve(e.data);
      else reject(e.data?.error ?? { code: 'internal', message: 'the draft worker did not start' });
    };
  });
}

/** Use the draft worker answering on `port` for SSD, and with `sd` for SD too; tell the page when
 * it stops (also while it is being timed). */
function attach(port, ready, sd) {
  const attached = (async () => {
    const draft = await ready;
    const timed = engine.attachDraft(port, draft.info, !!sd);
    whenLockFree(draft.lock, () => {
      engine?.draftLost('it closed, crashed or was terminated');
      post({ type: 'draft-lost' });
    });
    await timed;
  })();
  // Generations wait for it (set at once: none may start in between).
  attaching = attached.catch(() => {});
  return attached;
}

async function handle(msg) {
  switch (msg.type) {
    case 'load': {
      // Held until this worker ends: the page learns so from the lock, a crash sends no message.
      await holdLock(msg.lock);
      const onProgress = (p) => post({ type: 'progress', id: msg.id, progress: p });
      const ready = msg.draftPort ? draftReady(msg.draftPort) : null;
      engine = await loadEngine(msg.target, msg.draft, msg.opts, msg.modes, onProgress, msg.requested);
      if (ready) await attach(msg.draftPort, ready, msg.sd);
      return engine.info();
    }
    case 'attach': {
      // A draft worker started after the load, or one replacing a draft worker that stopped:
      // attached between generations.
      const ready = draftReady(msg.draftPort);
      for (let g = null; g !== generating; ) {
        g = generating;
        await g;
      }
      if (!engine) throw { code: 'invalid_argument', message: 'no engine loaded' };
      await attach(msg.draftPort, ready, msg.sd);
      return engine.info();
    }
    case 'generate': {
      await attaching;
      if (!engine) throw { code: 'invalid_argument', message: 'no engine loaded' };
      running = msg.id;
      let run;
      try {
        run = generate(
          engine,
          msg.prompt,
          msg.opts,
          (piece, tokens) => post({ type: 'text', id: msg.id, piece, tokens }),
          () => aborted.has(msg.id),
        );
        generating = run.catch(() => {});
        // The engine refines its choice of mode after each generation: the page's info follows.
        return { result: await run, info: engine.info() };
      } finally {
        running = null;
        aborted.delete(msg.id);
      }
    }
    case 'dispose':
      engine?.free();
      engine = null;
      return null;
    default:
      throw { code: 'internal', message: `unknown request ${msg.type}` };
  }
}

self.onmessage = async (e) => {
  const msg = e.data;
  if (msg.type === 'thread') return runThread(msg);
  if (msg.type === 'abort') {
    aborted.add(msg.target);
    // The draft's speculation stops now; the generation at its next round.
    if (msg.target === running) engine?.interrupt?.();
    return;
  }
  try {
    post({ type: 'result', id: msg.id, value: await handle(msg) });
  } catch (err) {
    post({ type: 'error', id: msg.id, error: errorInfo(err) });
  }
};
