// Faults the browser tests provoke in the package's workers.

/** Make the draft worker `worker` (a playwright Worker) send each sampled proposal without its
 * first distribution: verification's assertion then panics in the engine worker. */
export function dropFirstQ(worker) {
  return worker.evaluate(() => {
    const post = MessagePort.prototype.postMessage;
    MessagePort.prototype.postMessage = function (msg, transfer) {
      if (msg?.q?.length) return post.call(this, { ...msg, q: msg.q.slice(1) });
      return post.call(this, msg, transfer);
    };
  });
}
