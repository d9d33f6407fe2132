// The browser client benchmark: a 250,000-message backlog (5 channels) fetched from `herald server` and
// delivered to callbacks in headless Chromium, Herald's client against message_bus's message-bus.js,
// chunked (its default) and not. One page per run, rows interleaved round by round (the order rotates),
// medians reported. Two servers: one whose log holds the messages as JSON (message-bus.js and Herald's
// JSON path), one as MessagePack (Herald's MessagePack path), so neither pays a transcoding.
//
//   node bench/js_client/run.mjs            (ROUNDS=5, COUNT=250000; writes bench/js_client/RESULTS.md)
//
// Times: "total" from the request being sent to the last callback; "from first byte" from the first
// response byte to the last callback (the client's own work, mostly); "first callback" from the first byte
// to the first callback (streaming rows). Heap: usedJSHeapSize after a forced GC, after the run minus
// before (what the client keeps); callbacks only count, they keep nothing.
import { execFileSync } from "node:child_process";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { gzipSync, brotliCompressSync } from "node:zlib";
import { join } from "node:path";
import { chromium } from "playwright-core";
import { startServer, ROOT } from "../../test/browser/helpers.mjs";

const ROUNDS = Number(process.env.ROUNDS || 5);
const COUNT = Number(process.env.COUNT || 250000);
const DATA = process.env.BENCH_DATA || "/tmp/herald-js-bench";

function prepare(codec) {
  const dir = `${DATA}-${COUNT}-${codec}`;
  if (!existsSync(join(dir, "META"))) {
    console.error(`writing ${2 * COUNT} messages (${codec}) to ${dir} ...`);
    execFileSync("bundle", ["exec", "ruby", join(ROOT, "bench/js_client/prepare.rb"), dir, codec, String(COUNT)], { cwd: ROOT, stdio: "inherit" });
  }
  return dir;
}

const channels = (set) => [0, 1, 2, 3, 4].map((i) => `/${set}/${i}`);

// In the page: Herald's client, counting callbacks.
async function heraldRun(page, { transport, msgpack, set, total }) {
  return page.evaluate(async ({ transport, msgpack, chans, total }) => {
    gc();
    const heap0 = performance.memory.usedJSHeapSize;
    let t0 = 0, tFirstByte = 0, tFirstCallback = 0, count = 0;
    const timedFetch = async (url, init) => {
      t0 = t0 || performance.now();
      const response = await fetch(url, init);
      const body = response.body.pipeThrough(new TransformStream({
        transform(chunk, c) {
          if (!tFirstByte) tFirstByte = performance.now();
          c.enqueue(chunk);
        },
      }));
      return new Response(body, { status: response.status, headers: response.headers });
    };
    const result = await new Promise((resolve) => {
      const bus = new Herald({ transports: [transport], msgpack, fetch: timedFetch });
      const callback = () => {
        if (count++ === 0) tFirstCallback = performance.now();
        if (count === total) {
          const t1 = performance.now();
          bus.stop().then(() => resolve({ total: t1 - t0, fromFirstByte: t1 - tFirstByte, firstCallback: tFirstCallback - tFirstByte }));
        }
      };
      for (const c of chans) bus.subscribe(c, callback, { lastId: 0 });
    });
    await new Promise((r) => setTimeout(r, 50));
    gc();
    return { ...result, heap: performance.memory.usedJSHeapSize - heap0, count };
  }, { transport, msgpack, chans: channels(set), total });
}

// In the page: message_bus's client (npm message-bus-client 4.5.2, served by the demo app) with its XHR adapter.
async function messageBusRun(page, { chunked, set, total }) {
  return page.evaluate(async ({ chunked, chans, total }) => {
    gc();
    const heap0 = performance.memory.usedJSHeapSize;
    let t0 = 0, tFirstByte = 0, tFirstCallback = 0, count = 0;
    const send = XMLHttpRequest.prototype.send;
    XMLHttpRequest.prototype.send = function (...args) {
      t0 = t0 || performance.now();
      this.addEventListener("readystatechange", () => {
        if (this.readyState >= 3 && !tFirstByte) tFirstByte = performance.now();
      });
      return send.apply(this, args);
    };
    const bus = window.MessageBus;
    bus.baseUrl = "/";
    bus.enableChunkedEncoding = chunked;
    bus.alwaysLongPoll = true;
    const result = await new Promise((resolve) => {
      const callback = () => {
        if (count++ === 0) tFirstCallback = performance.now();
        if (count === total) {
          const t1 = performance.now();
          bus.stop();
          resolve({ total: t1 - t0, fromFirstByte: t1 - tFirstByte, firstCallback: tFirstCallback - tFirstByte });
        }
      };
      for (const c of chans) bus.subscribe(c, callback, 0);
    });
    await new Promise((r) => setTimeout(r, 50));
    gc();
    return { ...result, heap: performance.memory.usedJSHeapSize - heap0, count };
  }, { chunked, chans: channels(set), total });
}

const ROWS = [
  { name: "Herald client, stream, MessagePack", server: "msgpack", run: (p, set) => heraldRun(p, { transport: "stream", msgpack: true, set, total: COUNT }) },
  { name: "Herald client, long poll (one body), MessagePack", server: "msgpack", run: (p, set) => heraldRun(p, { transport: "longpoll", msgpack: true, set, total: COUNT }) },
  { name: "Herald client, stream, JSON", server: "json", run: (p, set) => heraldRun(p, { transport: "stream", msgpack: false, set, total: COUNT }) },
  { name: "message-bus.js, chunked (its default)", server: "json", mb: true, run: (p, set) => messageBusRun(p, { chunked: true, set, total: COUNT }) },
  { name: "message-bus.js, not chunked", server: "json", mb: true, run: (p, set) => messageBusRun(p, { chunked: false, set, total: COUNT }) },
];

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};
const fmt = (n, digits = 0) => n.toLocaleString("en-US", { maximumFractionDigits: digits, minimumFractionDigits: digits });

async function bodySizes(servers, set) {
  const body = channels(set).map((c) => `${encodeURIComponent(c)}=0`).join("&");
  const sizes = {};
  for (const [name, server, accept] of [["JSON", servers.json, "application/json"], ["MessagePack", servers.msgpack, "application/vnd.msgpack"]]) {
    const r = await fetch(`${server.url}/message-bus/sizes${name}/poll?dlp=t`, {
      method: "POST", body, headers: { "content-type": "application/x-www-form-urlencoded", "dont-chunk": "true", accept },
    });
    const bytes = Buffer.from(await r.arrayBuffer());
    sizes[name] = { raw: bytes.length, gzip: gzipSync(bytes, { level: 6 }).length, brotli: brotliCompressSync(bytes).length };
  }
  return sizes;
}

const dirs = { json: prepare("json"), msgpack: prepare("msgpack") };
const servers = {};
[servers.json, servers.msgpack] = await Promise.all([startServer({ dir: dirs.json }), startServer({ dir: dirs.msgpack })]);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM_PATH || "/usr/bin/chromium",
  headless: true,
  args: ["--js-flags=--expose-gc", "--enable-precise-memory-info", ...(process.getuid?.() === 0 ? ["--no-sandbox"] : [])],
});
const version = browser.version();
const context = await browser.newContext();
const page = await context.newPage();
page.on("pageerror", (e) => console.error("page error:", e));

const results = {};
try {
  for (const set of ["mixed", "ascii"]) {
    for (let round = 0; round < ROUNDS; round++) {
      const order = ROWS.map((_, i) => ROWS[(i + round) % ROWS.length]);
      for (const row of order) {
        const server = servers[row.server];
        await page.goto(`${server.url}/blank`);
        if (row.mb) {
          await page.addScriptTag({ url: "/assets/message-bus.js" });
          await page.addScriptTag({ url: "/assets/message-bus-ajax.js" });
        } else {
          await page.addScriptTag({ url: "/message-bus/herald.js" });
        }
        const r = await row.run(page, set);
        if (r.count !== COUNT) throw new Error(`${row.name}: ${r.count} callbacks, expected ${COUNT}`);
        ((results[set] ||= {})[row.name] ||= []).push(r);
        console.error(`${set} round ${round + 1} ${row.name}: ${fmt(r.total)} ms (first byte -> last ${fmt(r.fromFirstByte)}, first callback ${fmt(r.firstCallback, 1)}, heap ${fmt(r.heap / 1e6, 1)} MB)`);
      }
    }
  }
  const sizes = { mixed: await bodySizes(servers, "mixed"), ascii: await bodySizes(servers, "ascii") };
  const script = readFileSync(join(ROOT, "lib/herald/rack/herald.js"));
  const mbScript = readFileSync(join(ROOT, "node_modules/message-bus-client/assets/message-bus.js"));

  const out = [];
  out.push("# Browser client benchmark", "");
  out.push(`- Chromium ${version} headless, ${execFileSync("nproc").toString().trim()} cores, ${new Date().toISOString().slice(0, 10)}; \`herald server\` (Puma, log store) on loopback`);
  out.push(`- command: \`node bench/js_client/run.mjs\` (ROUNDS=${ROUNDS}, COUNT=${COUNT}); median of ${ROUNDS} runs per row, rows interleaved and rotated per round`);
  out.push(`- ${fmt(COUNT)} message_bus-style messages on 5 channels, subscribed from id 0; "mixed": about 10% carry non-ASCII text (accents, CJK, Cyrillic, emoji); "ascii": none`);
  out.push("- total: request sent to last callback (includes the server building the reply); from first byte: first response byte to last callback; first callback: first byte to first callback", "");
  for (const set of ["mixed", "ascii"]) {
    const base = median(results[set]["message-bus.js, chunked (its default)"].map((r) => r.total));
    const fastest = Math.min(...ROWS.filter((r) => r.mb).map((r) => median(results[set][r.name].map((x) => x.total))));
    out.push(`## ${set === "mixed" ? "Mixed text" : "ASCII-only text"}`, "");
    out.push("| path | total ms | messages/s | vs message-bus.js default | vs its fastest | from first byte, ms | first callback, ms | heap after, MB |");
    out.push("|---|---:|---:|---:|---:|---:|---:|---:|");
    for (const row of ROWS) {
      const rs = results[set][row.name];
      const total = median(rs.map((r) => r.total));
      out.push(`| ${row.name} | ${fmt(total)} | ${fmt(COUNT / total * 1000 / 1e6, 2)}M | ${fmt(base / total, 2)}x | ${fmt(fastest / total, 2)}x | ${fmt(median(rs.map((r) => r.fromFirstByte)))} | ${fmt(median(rs.map((r) => r.firstCallback)), 1)} | ${fmt(median(rs.map((r) => r.heap)) / 1e6, 1)} |`);
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
  await servers.json.stop({ keepDir: true });
  await servers.msgpack.stop({ keepDir: true });
}
