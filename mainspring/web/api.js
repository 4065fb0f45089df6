// The console's only way to the server: the /v1 API with the key the user typed (sessionStorage, this tab only).
// The server scopes every read to the key's project, so the page shows what the key may see and nothing more.

const KEY = "mainspring.apiKey";

export class ApiError extends Error {
  constructor(status, body) {
    super(body?.error?.message || `HTTP ${status}`);
    this.status = status;
    this.code = body?.error?.code || null;
  }
}

export const key = {
  get: () => sessionStorage.getItem(KEY),
  set: (v) => sessionStorage.setItem(KEY, v),
  clear: () => sessionStorage.removeItem(KEY),
};

let onUnauthorized = () => {};
export function whenUnauthorized(fn) { onUnauthorized = fn; }

function headers(extra = {}) {
  const k = key.get();
  return k ? {...extra, Authorization: `Bearer ${k}`} : extra;
}

async function failure(r, sentKey) {
  let body = null;
  try { body = await r.json(); } catch { /* not JSON: the status says enough */ }
  const err = new ApiError(r.status, body);
  // a refusal of a key the user has since replaced is old news: no need to ask again
  if (r.status === 401 && sentKey === key.get()) onUnauthorized(err);
  return err;
}

export async function get(path, params = {}) {
  const q = new URLSearchParams(Object.entries(params).filter(([, v]) => v !== "" && v != null));
  const sent = key.get();
  const r = await fetch(q.size ? `${path}?${q}` : path, {headers: headers()});
  if (!r.ok) throw await failure(r, sent);
  return path.endsWith(".jsonl") ? r.text() : r.json();
}

export async function post(path, body = {}) {
  const sent = key.get();
  const r = await fetch(path, {method: "POST", headers: headers({"Content-Type": "application/json"}),
                               body: JSON.stringify(body)});
  if (!r.ok) throw await failure(r, sent);
  return r.json();
}

/** The raw Response of an authenticated request (bytes: a .glb, an image), or an ApiError. */
export async function raw(path, {method = "GET", json} = {}) {
  const init = {method, headers: headers(json === undefined ? {} : {"Content-Type": "application/json"})};
  if (json !== undefined) init.body = JSON.stringify(json);
  const sent = key.get();
  const r = await fetch(path, init);
  if (!r.ok) throw await failure(r, sent);
  return r;
}

/** A file download of an authenticated GET (an <a href> cannot send the Bearer header). */
export async function download(path, filename) {
  const sent = key.get();
  const r = await fetch(path, {headers: headers()});
  if (!r.ok) throw await failure(r, sent);
  const url = URL.createObjectURL(await r.blob());
  const a = Object.assign(document.createElement("a"), {href: url, download: filename});
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

/**
 * Follow a run's SSE event stream, calling onEvent(event) per event in order. EventSource cannot send an
 * Authorization header, so this reads the stream with fetch; after a dropped connection it reconnects with
 * Last-Event-ID, as the server's resumable stream expects (no event lost, none twice).
 * Returns a function that stops following.
 */
export function follow(path, onEvent, onEnd = () => {}) {
  const ctl = new AbortController();
  let last = null;
  (async () => {
    for (let attempt = 0; !ctl.signal.aborted; attempt++) {
      try {
        const hs = headers({Accept: "text/event-stream"});
        if (last !== null) hs["Last-Event-ID"] = String(last);
        const sent = key.get();
        const r = await fetch(path, {headers: hs, signal: ctl.signal});
        if (!r.ok) { await failure(r, sent); onEnd(); return; }
        const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
        let buf = "";
        for (;;) {
          const {value, done} = await reader.read();
          if (done) { onEnd(); return; }  // the server ends the stream once the run has ended
          buf += value;
          let cut;
          while ((cut = buf.indexOf("\n\n")) >= 0) {
            const frame = buf.slice(0, cut);
            buf = buf.slice(cut + 2);
            const data = frame.split("\n").filter(l => l.startsWith("data: ")).map(l => l.slice(6)).join("\n");
            if (!data) continue;  // a comment (ping) or the retry hint
            const ev = JSON.parse(data);
            last = ev.id;
            onEvent(ev);
          }
        }
      } catch (e) {
        if (ctl.signal.aborted) return;
        await new Promise(res => setTimeout(res, Math.min(1000 * 2 ** attempt, 10000)));
      }
    }
  })();
  return () => ctl.abort();
}
