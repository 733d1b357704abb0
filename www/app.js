// The demo: load a model pair, then race plain decoding (AR) against SSD on the same engine, one
// after the other so they never share the hardware, and draw SSD's rounds.
// URL parameters preset the form (pair, backend, draftBackend, target, draft, prompt, maxTokens,
// specK, chat; a target or draft may be a Hugging Face name, hf:OWNER/REPO/FILE.gguf), `modes`
// (comma-separated) the modes to prepare (default: AR and SSD, the race's), `hub` where hf: names
// resolve, `cache` the model store ('opfs', 'cache-api' or 'off'), and `autoload=1` loads at
// once; `window.demo` exposes state for automated tests.
import { DEFAULTS, Saguaro } from '../pkg/index.js';

const $ = (id) => document.getElementById(id);
const PAIRS = {
  qwen: { target: '/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf', draft: '/models/qwen2.5-coder-0.5b-instruct.gguf' },
  smollm: { target: '/models/smollm2-135m-instruct-q4_1.gguf', draft: '/models/smollm2-135m-instruct-q4_1.gguf' },
  gemma: { target: '/models/gemma-3-270m-q4_k_m.gguf', draft: '/models/gemma-3-270m-q4_k_m.gguf' },
};
const EXAMPLES = [
  ['quicksort', 'def quicksort(arr):\n    """Sort a list with quicksort."""\n', false],
  ['Rust', 'fn main() {\n    let v: Vec<i32> = (1..=10).collect();\n', false],
  ['palindrome', 'Write a Python function that checks whether a string is a palindrome.', true],
  ['hash map', 'Explain what a hash map is in two sentences.', true],
];

const demo = { engine: null, results: {}, error: null, frames: 0, running: false, loadMs: null };
window.demo = demo;
let controller = null;

(function countFrames() {
  demo.frames++;
  requestAnimationFrame(countFrames);
})();

function setStatus(text, isError = false) {
  $('loadStatus').textContent = text;
  $('loadStatus').className = isError ? 'err' : 'muted';
}

function progressBar(key, label) {
  let el = document.querySelector(`[data-progress="${key}"]`);
  if (!el) {
    el = document.createElement('div');
    el.dataset.progress = key;
    el.innerHTML = '<div class="muted"></div><div class="bar"><div></div></div>';
    $('progress').append(el);
  }
  el.firstChild.textContent = label;
  return el.lastChild.firstChild;
}

function onProgress(p) {
  const mb = (n) => (n / 1e6).toFixed(1);
  const key = `${p.role}-${p.phase}-${p.part ?? 1}`;
  const part = p.parts ? ` part ${p.part} of ${p.parts}` : '';
  const label = p.phase === 'download'
    ? `${p.role}${part}: ${mb(p.loaded)}${p.total ? ` / ${mb(p.total)}` : ''} MB${p.fromCache ? ' (from cache)' : ''}`
    : `${p.role}: placing on the device`;
  progressBar(key, label).style.width = p.total ? `${(100 * p.loaded) / p.total}%` : '100%';
}

async function sourceOf(urlInput, fileInput) {
  const f = $(fileInput).files?.[0];
  return f ?? ($(urlInput).value.trim() || undefined);
}

async function load() {
  $('load').disabled = true;
  $('race').disabled = true;
  $('progress').replaceChildren();
  await demo.engine?.dispose();
  demo.engine = null;
  let models = PAIRS[$('pair').value];
  if (!models) {
    models = { target: await sourceOf('targetUrl', 'targetFile'), draft: await sourceOf('draftUrl', 'draftFile') };
    if (!models.target) {
      setStatus('Give a target URL or file.', true);
      $('load').disabled = false;
      return;
    }
  }
  const t0 = performance.now();
  setStatus('Loading…');
  try {
    demo.engine = await Saguaro.load(models, {
      backend: $('backend').value || undefined,
      draftBackend: $('draftBackend').value,
      onProgress,
      modes: models.draft ? demo.modes ?? ['ar', 'ssd'] : ['ar'],
      specK: Number($('specK').value) > DEFAULTS.specK ? Number($('specK').value) : undefined,
      ...demo.storage,
    });
    demo.loadMs = performance.now() - t0;
    const i = demo.engine.info;
    setStatus(`Loaded in ${(demo.loadMs / 1000).toFixed(1)} s: target on ${i.targetBackend}` +
      (i.draftDevice ? `, draft on ${i.draftDevice}${i.draftWorker ? ' in its own worker' : ''}` : ', no draft (AR only)'));
    $('race').disabled = false;
  } catch (e) {
    demo.error = { code: e.code, message: e.message };
    setStatus(`${e.code ?? 'error'}: ${e.message}`, true);
  } finally {
    $('load').disabled = false;
  }
}

function lane(mode) {
  const el = $(`lane-${mode}`);
  const set = (k, v) => (el.querySelector(`[data-k="${k}"]`).textContent = v);
  return { out: el.querySelector('.out'), set };
}

async function runLane(mode, prompt, opts) {
  const l = lane(mode);
  l.out.textContent = '';
  l.set('tps', '– tok/s');
  let tokens = 0;
  let first = null;
  const result = await demo.engine.generate(prompt, {
    ...opts,
    mode,
    signal: controller.signal,
    onToken: (piece, n) => {
      l.out.textContent += piece;
      tokens += n;
      const now = performance.now();
      first ??= now;
      l.set('tokens', `${tokens} tokens`);
      if (now > first) l.set('tps', `${((1000 * (tokens - 1)) / (now - first)).toFixed(1)} tok/s`);
    },
  });
  const s = result.stats;
  l.out.textContent = result.text;
  l.set('tps', `${s.tokensPerS.toFixed(s.tokensPerS < 1 ? 2 : 1)} tok/s`);
  l.set('tokens', `${s.generated} tokens`);
  if (mode === 'ssd') {
    l.set('accept', `acceptance ${s.acceptanceRate?.toFixed(2) ?? '–'}`);
    l.set('hits', `cache hits ${s.cacheHitRate?.toFixed(2) ?? '–'}`);
  }
  demo.results[mode] = result;
  return result;
}

async function race() {
  if (demo.running) return;
  demo.running = true;
  demo.results = {};
  demo.error = null;
  controller = new AbortController();
  $('race').disabled = true;
  $('stop').disabled = false;
  const prompt = $('prompt').value;
  const opts = { maxTokens: Number($('maxTokens').value), chat: $('chat').checked, specK: Number($('specK').value) };
  lane('ssd').set('speedup', 'speed-up –');
  try {
    const ar = await runLane('ar', prompt, opts);
    if (demo.engine.info.hasDraft) {
      const ssd = await runLane('ssd', prompt, opts);
      lane('ssd').set('speedup', `speed-up ${(ssd.stats.tokensPerS / ar.stats.tokensPerS).toFixed(2)}x`);
      drawTimeline(ssd.stats);
      demo.results.identical = ar.text === ssd.text;
    }
  } catch (e) {
    demo.error = { code: e.code, message: e.message };
    if (e.code !== 'aborted') setStatus(`${e.code ?? 'error'}: ${e.message}`, true);
  } finally {
    demo.running = false;
    $('race').disabled = false;
    $('stop').disabled = true;
  }
}

function drawTimeline(stats) {
  const rounds = stats.timeline ?? [];
  if (!rounds.length) return;
  const end = Math.max(...rounds.map((r) => Math.max(r.verify[1], r.draft?.[1] ?? 0)));
  const W = 1000;
  const x = (t) => (W * t) / end;
  const rect = (a, b, y, fill, title) =>
    `<rect x="${x(a).toFixed(1)}" y="${y}" width="${Math.max(1, x(b) - x(a)).toFixed(1)}" height="26" rx="3" fill="${fill}"><title>${title}</title></rect>`;
  let svg = `<svg viewBox="0 0 ${W} 96" role="img" aria-label="SSD timeline">` +
    '<text x="0" y="12" font-size="12" fill="#6b716d">target: verify</text>' +
    '<text x="0" y="58" font-size="12" fill="#6b716d">draft: speculate next round</text>';
  rounds.forEach((r, i) => {
    const color = r.hit === false ? '#c2571a' : '#2f7d4f';
    svg += rect(r.verify[0], r.verify[1], 16, color, `round ${i + 1}: verify ${(r.verify[1] - r.verify[0]).toFixed(0)} ms, ${r.accepted}/${r.proposed} accepted${r.hit === false ? ', cache miss' : ''}`);
    if (r.draft) svg += rect(r.draft[0], r.draft[1], 62, '#7aa6c2', `round ${i + 1}: speculation ${(r.draft[1] - r.draft[0]).toFixed(0)} ms`);
  });
  svg += '</svg>';
  $('timeline').innerHTML = svg;
  const pct = stats.draftBusyMs ? (100 * stats.overlapMs) / stats.draftBusyMs : 0;
  $('overlap').textContent = `${rounds.length} rounds; the draft worked ${stats.draftBusyMs?.toFixed(0)} ms, ` +
    `${stats.overlapMs?.toFixed(0)} ms of it (${pct.toFixed(0)}%) while the target verified. ` +
    `Mean verify ${stats.verifyMsMean?.toFixed(0)} ms, glue ${stats.glueMsMean?.toFixed(0) ?? '–'} ms, tree step ${stats.treeStepMsMean?.toFixed(0) ?? '–'} ms.`;
}

function init() {
  for (const [name, text, chat] of EXAMPLES) {
    const b = document.createElement('button');
    b.textContent = name;
    b.onclick = () => {
      $('prompt').value = text;
      $('chat').checked = chat;
    };
    $('examples').append(b);
  }
  $('prompt').value = EXAMPLES[0][1];
  const q = new URLSearchParams(location.search);
  for (const k of ['pair', 'backend', 'draftBackend', 'maxTokens', 'specK', 'prompt']) if (q.has(k)) $(k).value = q.get(k);
  if (q.has('target')) {
    $('pair').value = 'custom';
    $('targetUrl').value = q.get('target');
    $('draftUrl').value = q.get('draft') ?? '';
  }
  if (q.has('chat')) $('chat').checked = q.get('chat') === '1';
  if (q.has('modes')) demo.modes = q.get('modes').split(',');
  demo.storage = {
    ...(q.has('hub') && { hub: q.get('hub') }),
    ...(q.has('cache') && { cache: q.get('cache') === 'off' ? false : q.get('cache') }),
  };
  const showCustom = () => ($('custom').hidden = $('pair').value !== 'custom');
  $('pair').onchange = showCustom;
  showCustom();
  $('load').onclick = load;
  $('race').onclick = race;
  $('stop').onclick = () => controller?.abort();
  demo.load = load;
  demo.race = race;
  if (q.get('autoload') === '1') load();
}

init();
