// The browser client benchmark: a 250,000-message backlog (5 channels) fetched from `herald server` and
// delivered to callbacks in headless Chromium, Herald's client against message_bus's message-bus.js,
// chunked (its default) and not. One page per run, rows interleaved round by round (the order rotates),
// medians reported.
//
//   node bench/js_client/run.mjs            (ROUNDS=5, COUNT=250000; writes bench/js_client/RESULTS.md)
//
// Times: from the request to the last callback, and from the first chunk to the first callback. Heap:
// usedJSHeapSize after a forced GC, after the run minus before (what the client keeps); callbacks only
// count, they keep nothing. Each run is a fresh same-origin iframe (a fresh client and script); the reply
// bodies are fetched once per text set by the top page.
import { execFileSync } from "node:child_process";
import { existsSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { gzipSync, brotliCompressSync } from "node:zlib";
import { join } from "node:path";
import { loadavg } from "node:os";
import { chromium } from "playwright-core";
import { startServer, ROOT } from "../../test/browser/helpers.mjs";
import { freshFrame } from "./fresh_frame.mjs";

const ROUNDS = Number(process.env.ROUNDS || 5);
const COUNT = Number(process.env.COUNT || 250000);
const DATA = process.env.BENCH_DATA || "/tmp/herald-js-bench";
// message-bus.js's chunked path rescans its growing responseText and can take minutes on a large backlog:
// a run still going after this many ms is stopped and reported as "> DEADLINE".
const DEADLINE = Number(process.env.DEADLINE || 60000);

function prepare(codec) {
  const dir = `${DATA}-${COUNT}-${codec}`;
  if (!existsSync(join(dir, "META"))) {
    console.error(`writing ${2 * COUNT} messages (${codec}) to ${dir} ...`);
    execFileSync("bundle", ["exec", "ruby", join(ROOT, "bench/js_client/prepare.rb"), dir, codec, String(COUNT)], { cwd: ROOT, stdio: "inherit" });
  }
  return dir;
}

const channels = (set) => [0, 1, 2, 3, 4].map((i) => `/${set}/${i}`);

// Both clients run their whole path (transport, framing, decoding, dispatch to callbacks) on the bytes
// the real server sent, replayed from memory in 64 KiB chunks: the server's time and the loopback
// transfer (both heavy and noisy on a shared machine) stay out of the comparison. Each client starts from
// the bytes in memory and pays for everything after: Herald's client gets a fetch that returns a streamed
// Response of views of them (no copy: the copy a browser makes of network data is the browser's work for
// both clients); message-bus.js an XMLHttpRequest that grows responseText chunk by chunk, one chunk per
// task (decoding UTF-8 as the browser does), and fires onprogress as Chromium does (at most every 50 ms,
// and at the end), or, not chunked, decodes the whole body at once.
const CHUNK = 65536;

// In the page: Herald's client, counting callbacks.
async function heraldRun(page, { transport, body, type, set, total }) {
  return measured(page, () => page.evaluate(async ({ transport, body, type, chans, total, CHUNK }) => {
    const bytes = parent.bodies[body];
    let t0 = 0, tFirstByte = 0, tFirstCallback = 0, count = 0, served = false;
    const replay = async (url, init) => {
      if (served) return new Promise((_, reject) => init.signal.addEventListener("abort", () => reject(new DOMException("aborted", "AbortError"))));
      served = true;
      t0 = performance.now();
      let at = 0;
      const stream = new ReadableStream({
        pull(c) {
          if (at >= bytes.length) return c.close();
          if (!tFirstByte) tFirstByte = performance.now();
          c.enqueue(bytes.subarray(at, at + CHUNK));
          at += CHUNK;
        },
      }, { highWaterMark: 0 });
      return new Response(stream, { status: 200, headers: { "content-type": type } });
    };
    const result = await new Promise((resolve) => {
      const bus = new Herald({ transports: [transport], fetch: replay });
      const callback = () => {
        if (count++ === 0) tFirstCallback = performance.now();
        if (count === total) {
          const t1 = performance.now();
          bus.stop().then(() => resolve({ total: t1 - t0, firstCallback: tFirstCallback - tFirstByte }));
        }
      };
      for (const c of chans) bus.subscribe(c, callback, { lastId: 0 });
    });
    await new Promise((r) => setTimeout(r, 50));
    return { ...result, count };
  }, { transport, body, type, chans: channels(set), total, CHUNK }));
}

// In the page: message_bus's client (npm message-bus-client 4.5.2) with its XHR adapter, on a replaying XHR.
async function messageBusRun(page, { chunked, set, total }) {
  return measured(page, () => page.evaluate(async ({ chunked, chans, total, CHUNK, DEADLINE }) => {
    let giveUp = null;
    const bytes = parent.bodies[chunked ? "jsonStream" : "json"];
    let t0 = 0, tFirstByte = 0, tFirstCallback = 0, count = 0, served = false;
    class ReplayXHR {
      constructor() { this.readyState = 0; this.status = 0; this.responseText = ""; this.onprogress = null; this.onreadystatechange = null; }
      open() { this.readyState = 1; }
      setRequestHeader() {}
      getResponseHeader(name) { return name.toLowerCase() === "content-type" ? (chunked ? "text/plain; charset=utf-8" : "application/json; charset=utf-8") : null; }
      abort() {}
      send() {
        if (served) return; // later polls never answer
        served = true;
        t0 = performance.now();
        const utf8 = new TextDecoder();
        // The next chunk in a new task without setTimeout's 4 ms clamp (a real connection has none).
        const channel = new MessageChannel();
        channel.port1.onmessage = () => step();
        const next = () => channel.port2.postMessage(null);
        let at = 0;
        let lastProgress = 0;
        const step = () => {
          if (performance.now() - t0 > DEADLINE) return giveUp();
          if (!tFirstByte) tFirstByte = performance.now();
          if (chunked) {
            this.responseText += utf8.decode(bytes.subarray(at, at + CHUNK), { stream: true });
            at += CHUNK;
            this.readyState = 3;
            this.status = 200;
            // Chromium fires progress at most every 50 ms, and once more when the body is complete.
            const now = performance.now();
            if (now - lastProgress >= 50 || at >= bytes.length) {
              lastProgress = now;
              this.onprogress?.();
            }
            if (at < bytes.length) return next();
          } else {
            this.responseText = utf8.decode(bytes);
          }
          this.readyState = 4;
          this.status = 200;
          this.onreadystatechange?.();
        };
        next();
      }
    }
    ReplayXHR.prototype.onprogress = null;
    window.XMLHttpRequest = ReplayXHR;
    const bus = window.MessageBus;
    bus.baseUrl = "/";
    bus.enableChunkedEncoding = chunked;
    bus.alwaysLongPoll = true;
    const result = await new Promise((resolve) => {
      giveUp = () => {
        bus.stop();
        resolve({ total: Infinity, firstCallback: tFirstCallback ? tFirstCallback - tFirstByte : Infinity, stopped: true });
      };
      const callback = () => {
        if (count++ === 0) tFirstCallback = performance.now();
        if (count === total) {
          const t1 = performance.now();
          bus.stop();
          resolve({ total: t1 - t0, firstCallback: tFirstCallback - tFirstByte });
        }
      };
      for (const c of chans) bus.subscribe(c, callback, 0);
    });
    await new Promise((r) => setTimeout(r, 50));
    return { ...result, count };
  }, { chunked, chans: channels(set), total, CHUNK, DEADLINE }));
}

// Heap growth (usedJSHeapSize once garbage is gone, after minus before) and the CPU time of the renderer's
// main thread during the run (from /proc: it leaves out the time spent waiting for a core, which inflates
// wall times on a loaded machine, and the work of other threads: GC helpers, JIT compilers).
async function measured(page, run) {
  const heap0 = await page.evaluate(() => parent.settledHeap());
  const cpu0 = await mainThreadCpu();
  const all0 = rendererCpu();
  const result = await run();
  const cpu = (await mainThreadCpu()) - cpu0;
  const allThreads = rendererCpu() - all0;
  const heap = (await page.evaluate(() => parent.settledHeap())) - heap0;
  return { ...result, cpu, allThreads, heap };
}

// The renderer's CPU time on all its threads (main, GC helpers, JIT compilers, workers), ms.
function rendererCpu() {
  let ms = 0;
  for (const tid of readdirSync(`/proc/${rendererPid}/task`)) {
    try {
      ms += Number(readFileSync(`/proc/${rendererPid}/task/${tid}/schedstat`, "utf8").split(" ")[0]) / 1e6;
    } catch {} // a thread that ended meanwhile
  }
  return ms;
}

let rendererPid = 0;
async function mainThreadCpu() {
  if (!rendererPid) {
    // The page's renderer: the one whose CPU time grows while the page spins for 300 ms.
    const cdp = await browser.newBrowserCDPSession();
    const info = async () => (await cdp.send("SystemInfo.getProcessInfo")).processInfo.filter((p) => p.type === "renderer");
    const before = new Map((await info()).map((p) => [p.id, p.cpuTime]));
    await page.evaluate(() => { const end = performance.now() + 300; while (performance.now() < end); });
    const after = (await info()).filter((p) => before.has(p.id));
    rendererPid = after.sort((x, y) => (y.cpuTime - before.get(y.id)) - (x.cpuTime - before.get(x.id)))[0].id;
  }
  // schedstat: nanoseconds on a CPU (stat counts 10 ms ticks)
  return Number(readFileSync(`/proc/${rendererPid}/task/${rendererPid}/schedstat`, "utf8").split(" ")[0]) / 1e6;
}

const ROWS = [
  { name: "Herald client, stream, MessagePack", run: (p, set) => heraldRun(p, { transport: "stream", body: "msgpack", type: "application/vnd.msgpack", set, total: COUNT }) },
  { name: "Herald client, long poll (one body), MessagePack", run: (p, set) => heraldRun(p, { transport: "longpoll", body: "msgpack", type: "application/vnd.msgpack", set, total: COUNT }) },
  { name: "Herald client, stream, JSON", run: (p, set) => heraldRun(p, { transport: "stream", body: "jsonStream", type: "text/plain; charset=utf-8", set, total: COUNT }) },
  { name: "message-bus.js, chunked (its default)", mb: true, run: (p, set) => messageBusRun(p, { chunked: true, set, total: COUNT }) },
  { name: "message-bus.js, not chunked", mb: true, run: (p, set) => messageBusRun(p, { chunked: false, set, total: COUNT }) },
];
// A/B: OLD_SCRIPT=path/to/an/older/herald.js adds its stream row (e.g. `git show REV:lib/herald/rack/herald.js`).
if (process.env.OLD_SCRIPT) {
  ROWS.splice(1, 0, { name: "Herald client, stream, MessagePack (OLD_SCRIPT)", script: readFileSync(process.env.OLD_SCRIPT, "utf8"), run: ROWS[0].run });
}
// NO_CHUNKED=1 leaves out message-bus.js's chunked row (minutes at 250k; "vs its default" then reads "-").
if (process.env.NO_CHUNKED === "1") ROWS.splice(ROWS.findIndex((r) => r.name.startsWith("message-bus.js, chunked")), 1);

// The real server's reply bodies for the 5 channels from id 0, fetched by the page itself.
async function loadBodies(page, set) {
  const body = channels(set).map((c) => `${encodeURIComponent(c)}=0`).join("&");
  return page.evaluate(async ({ body, jsonUrl, msgpackUrl }) => {
    const get = async (url, accept) => new Uint8Array(await (await fetch(url, {
      method: "POST", body, headers: { "content-type": "application/x-www-form-urlencoded", "dont-chunk": "true", accept },
    })).arrayBuffer());
    const json = await get(jsonUrl, "application/json");
    const msgpack = await get(msgpackUrl, "application/vnd.msgpack");
    const sep = new TextEncoder().encode("\r\n|\r\n");
    const jsonStream = new Uint8Array(json.length + sep.length);
    jsonStream.set(json);
    jsonStream.set(sep, json.length);
    window.bodies = { json, msgpack, jsonStream };
    // usedJSHeapSize once garbage is gone: one gc() in the task that made the garbage leaves some of it
    // (still referenced from the stack); a second one in a later task does not.
    window.settledHeap = async () => {
      gc();
      await new Promise((r) => setTimeout(r, 0));
      gc();
      return performance.memory.usedJSHeapSize;
    };
    return { json: json.length, msgpack: msgpack.length };
  }, { body, jsonUrl: `${servers.json.url}/message-bus/bodies/poll?dlp=t`, msgpackUrl: `${servers.msgpack.url}/message-bus/bodies/poll?dlp=t` });
}

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};
const fmt = (n, digits = 0) => n.toLocaleString("en-US", { maximumFractionDigits: digits, minimumFractionDigits: digits });

async function bodySizes(servers, set) {
  const body = channels(set).map((c) => `${encodeURIComponent(c)}=0`).join("&");
  const sizes = {};
  for (const [name, server, accept] of [["JSON", servers.json, "application/json"], ["MessagePack", servers.msgpack, "application/vnd.msgpack"]]) {
    // Retried: once, after a 50k run at load 5-7, the server's side of this request closed early.
    let bytes;
    for (let attempt = 1; !bytes; attempt++) {
      try {
        const r = await fetch(`${server.url}/message-bus/sizes${name}/poll?dlp=t`, {
          method: "POST", body, headers: { "content-type": "application/x-www-form-urlencoded", "dont-chunk": "true", accept },
        });
        bytes = Buffer.from(await r.arrayBuffer());
      } catch (error) {
        if (attempt === 3) throw error;
        console.error(`body sizes: ${error.message} (${error.cause?.message}); again`);
      }
    }
    sizes[name] = { raw: bytes.length, gzip: gzipSync(bytes, { level: 6 }).length, brotli: brotliCompressSync(bytes).length };
  }
  return sizes;
}

// One server, its log in MessagePack; it answers JSON clients too (the bytes are replayed, so its
// transcoding time does not count).
const server = await startServer({ dir: prepare("msgpack") });
const servers = { json: server, msgpack: server };
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM_PATH || "/usr/bin/chromium",
  headless: true,
  // JS_FLAGS: more V8 flags for an experiment, e.g. JS_FLAGS=--single-threaded-gc
  args: [`--js-flags=--expose-gc ${process.env.JS_FLAGS || ""}`.trim(), "--enable-precise-memory-info", ...(process.getuid?.() === 0 ? ["--no-sandbox"] : [])],
});
const version = browser.version();
const context = await browser.newContext();
const page = await context.newPage();
page.on("pageerror", (e) => console.error("page error:", e));

const results = {};
const loadBefore = loadavg().map((x) => x.toFixed(1)).join(" ");
try {
  for (const set of ["mixed", "ascii"]) {
    await page.goto(`${server.url}/blank`);
    await loadBodies(page, set);
    for (let round = 0; round < ROUNDS; round++) {
      const order = ROWS.map((_, i) => ROWS[(i + round) % ROWS.length]);
      for (const row of order) {
        const frame = await freshFrame(page);
        if (row.mb) {
          await frame.addScriptTag({ url: "/assets/message-bus.js" });
          await frame.addScriptTag({ url: "/assets/message-bus-ajax.js" });
        } else if (row.script) {
          await frame.addScriptTag({ content: row.script });
        } else {
          await frame.addScriptTag({ url: "/message-bus/herald.js" });
        }
        const r = await row.run(frame, set);
        if (r.count !== COUNT && !r.stopped) throw new Error(`${row.name}: ${r.count} callbacks, expected ${COUNT}`);
        ((results[set] ||= {})[row.name] ||= []).push(r);
        console.error(`${set} round ${round + 1} ${row.name}: ${fmt(r.total)} ms, main thread CPU ${fmt(r.cpu)} ms, all threads ${fmt(r.allThreads)} ms (first callback ${fmt(r.firstCallback, 1)} ms after the first byte, heap ${fmt(r.heap / 1e6, 1)} MB)`);
      }
    }
  }
  const sizes = { mixed: await bodySizes(servers, "mixed"), ascii: await bodySizes(servers, "ascii") };
  const script = readFileSync(join(ROOT, "lib/herald/rack/herald.js"));
  const mbScript = readFileSync(join(ROOT, "node_modules/message-bus-client/assets/message-bus.js"));

  const out = [];
  out.push("# Browser client benchmark", "");
  out.push(`- Chromium ${version} headless, ${execFileSync("nproc").toString().trim()} cores, ${new Date().toISOString().slice(0, 10)}; \`herald server\` (Puma, log store) on loopback`);
  out.push(`- command: \`node bench/js_client/run.mjs\` (ROUNDS=${ROUNDS}, COUNT=${COUNT}); median of ${ROUNDS} runs per row, rows interleaved and rotated per round; load average ${loadBefore} before, ${loadavg().map((x) => x.toFixed(1)).join(" ")} after`);
  out.push(`- ${fmt(COUNT)} message_bus-style messages on 5 channels, subscribed from id 0; "mixed": about 10% carry non-ASCII text (accents, CJK, Cyrillic, emoji); "ascii": none`);
  out.push("- ms: the request to the last callback, on the real server's reply bytes replayed from memory in 64 KiB chunks (see the top of run.mjs); main thread CPU: the renderer main thread's CPU time over the same run (/proc schedstat: what the page's thread itself spent, without waiting for a core; GC helper and compiler threads not included; the next column counts all the renderer's threads); first callback: after the first chunk; heap: usedJSHeapSize after stop() and two forced GCs a task apart, minus before (ArrayBuffers are not in it)", "");
  for (const set of ["mixed", "ascii"]) {
    const chunkedRow = results[set]["message-bus.js, chunked (its default)"];
    const base = chunkedRow ? median(chunkedRow.map((r) => r.total)) : NaN;
    const fastest = Math.min(...ROWS.filter((r) => r.mb).map((r) => median(results[set][r.name].map((x) => x.total))));
    out.push(`## ${set === "mixed" ? "Mixed text" : "ASCII-only text"}`, "");
    const fastestCpu = Math.min(...ROWS.filter((r) => r.mb).map((r) => median(results[set][r.name].map((x) => x.cpu))));
    out.push("| path | ms, median (min–max) | messages/s | vs message-bus.js default | vs its fastest | main thread CPU, ms | CPU vs its fastest | renderer CPU, all threads, ms | first callback after first byte, ms | heap after, MB |");
    out.push("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    const ms = (x, digits = 0) => Number.isFinite(x) ? fmt(x, digits) : `> ${fmt(DEADLINE)}`;
    const ratio = (a, b) => {
      if (Number.isNaN(a)) return "-";
      if (!Number.isFinite(b)) return Number.isFinite(a) ? `< ${fmt(a / DEADLINE, 2)}x` : "1.00x";
      return Number.isFinite(a) ? `${fmt(a / b, 2)}x` : `> ${fmt(DEADLINE / b, 2)}x`;
    };
    for (const row of ROWS) {
      const rs = results[set][row.name];
      const totals = rs.map((r) => r.total);
      const total = median(totals);
      const spread = `${ms(Math.min(...totals))}–${ms(Math.max(...totals))}`;
      const cpu = median(rs.map((r) => r.cpu));
      const cpuCell = Number.isFinite(total) ? fmt(cpu) : `> ${fmt(cpu)}`;
      out.push(`| ${row.name} | ${ms(total)} (${spread}) | ${Number.isFinite(total) ? fmt(COUNT / total * 1000 / 1e6, 2) + "M" : "-"} | ${ratio(base, total)} | ${ratio(fastest, total)} | ${cpuCell} | ${Number.isFinite(total) ? fmt(fastestCpu / cpu, 2) + "x" : "-"} | ${fmt(median(rs.map((r) => r.allThreads)))} | ${ms(median(rs.map((r) => r.firstCallback)), 1)} | ${fmt(median(rs.map((r) => r.heap)) / 1e6, 1)} |`);
    }
    out.push("");
    out.push(`Reply bodies for the 5 channels: JSON ${fmt(sizes[set].JSON.raw / 1e6, 1)} MB (gzip ${fmt(sizes[set].JSON.gzip / 1e6, 2)}, brotli ${fmt(sizes[set].JSON.brotli / 1e6, 2)}), MessagePack ${fmt(sizes[set].MessagePack.raw / 1e6, 1)} MB (gzip ${fmt(sizes[set].MessagePack.gzip / 1e6, 2)}, brotli ${fmt(sizes[set].MessagePack.brotli / 1e6, 2)}).`, "");
  }
  out.push("## Script size", "");
  out.push(`Herald's client as served (\`lib/herald/rack/herald.js\`, minified, MessagePack decoder and MessageBus facade included): ${fmt(script.length)} bytes, ${fmt(gzipSync(script, { level: 9 }).length)} gzip. message-bus.js 4.5.2 (not minified; needs jQuery or the 38-line ajax adapter): ${fmt(mbScript.length)} bytes, ${fmt(gzipSync(mbScript, { level: 9 }).length)} gzip.`, "");
  writeFileSync(join(ROOT, "bench/js_client/RESULTS.md"), out.join("\n"));
  console.log(out.join("\n"));
} finally {
  await browser.close();
  await server.stop({ keepDir: true });
}
