// The decoders alone, in headless Chromium: the same reply bodies (the real server's, for the browser
// benchmark's 5 channels) decoded to objects by each decoder in one page, rows interleaved round by round
// (the order rotates), medians reported. No client, no transport, no callbacks: each row walks the
// decoded messages and reads one field of each.
//
//   node bench/js_client/decode.mjs         (ROUNDS=7, COUNT=50000, SETS=mixed,ascii)
//   HERALD_REVS=f7e4dd9 node bench/js_client/decode.mjs   (adds Herald's decoder as of those commits)
//   COLD=1: each run in a fresh iframe (as run.mjs runs each client: nothing optimized yet); PROFILE=part of
//   a row name: a CDP CPU profile of that row (MINIFY=0 for names); SLICES=1: ms per 5,000 messages.
// msgpackr is a devDependency of js/ (`npm install` if node_modules predates it).
//
// Rows: JSON.parse(new TextDecoder().decode(body)) on the JSON body; msgpackr (unpack, useRecords: false);
// @msgpack/msgpack (one reused Decoder); Herald's Decoder on the whole body; Herald's MessagePackReader fed
// 64 KiB views (the client's streaming path). Times: wall clock in the page (performance.now) and the
// renderer process's CPU time (CDP SystemInfo.getProcessInfo), both per row, with a forced GC before each
// row so that no row pays for another's garbage.
import { execFileSync } from "node:child_process";
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { loadavg } from "node:os";
import { build } from "esbuild";
import { chromium } from "playwright-core";
import { startServer, ROOT } from "../../test/browser/helpers.mjs";
import { freshFrame } from "./fresh_frame.mjs";

const ROUNDS = Number(process.env.ROUNDS || 7);
const COUNT = Number(process.env.COUNT || 50000);
const SETS = (process.env.SETS || "mixed,ascii").split(",");
const DATA = process.env.BENCH_DATA || "/tmp/herald-js-bench";
const CHUNK = 65536;

const dir = `${DATA}-${COUNT}-msgpack`;
if (!existsSync(join(dir, "META"))) {
  console.error(`writing ${2 * COUNT} messages to ${dir} ...`);
  execFileSync("bundle", ["exec", "ruby", join(ROOT, "bench/js_client/prepare.rb"), dir, "msgpack", String(COUNT)], { cwd: ROOT, stdio: "inherit" });
}

// Herald's decoder from the work tree, and from each commit named in HERALD_REVS (for A/B runs).
const variants = [{ name: "work tree", dir: join(ROOT, "js/src") }];
for (const rev of (process.env.HERALD_REVS || "").split(",").filter(Boolean)) {
  const out = `/tmp/herald-decode-${rev}`;
  mkdirSync(out, { recursive: true });
  for (const file of ["msgpack.ts", "framing.ts"]) {
    writeFileSync(join(out, file), execFileSync("git", ["show", `${rev}:js/src/${file}`], { cwd: ROOT }));
  }
  variants.push({ name: rev, dir: out });
}
// ... and from directories holding a msgpack.ts and framing.ts (HERALD_DIRS=name=/path,...).
for (const spec of (process.env.HERALD_DIRS || "").split(",").filter(Boolean)) {
  const [name, path] = spec.split("=");
  variants.push({ name, dir: path });
}
const imports = variants.map((v, i) => `import { Decoder as D${i} } from ${JSON.stringify(join(v.dir, "msgpack.ts"))};
import { MessagePackReader as R${i} } from ${JSON.stringify(join(v.dir, "framing.ts"))};`).join("\n");
const bundle = await build({
  stdin: {
    contents: `import { Unpackr } from "msgpackr/unpack";
import { Decoder as MsgpackDecoder } from "@msgpack/msgpack";
${imports}
globalThis.decoders = { Unpackr, MsgpackDecoder, herald: [${variants.map((_, i) => `{ Decoder: D${i}, Reader: R${i} }`).join(", ")}] };`,
    resolveDir: join(ROOT, "bench/js_client"), // msgpackr: node_modules here or at the root
    loader: "ts",
  },
  bundle: true,
  write: false,
  format: "iife",
  target: "es2020",
  minify: process.env.MINIFY !== "0", // as the client is served (MINIFY=0 for readable profiles)
});
const script = bundle.outputFiles[0].text;

const ROWS = [
  { name: "JSON.parse(TextDecoder)", kind: "json" },
  { name: "msgpackr 2.1.3 unpack (useRecords: false)", kind: "msgpackr" },
  { name: "@msgpack/msgpack 3.1.3, one Decoder", kind: "msgpack" },
  ...variants.flatMap((v, i) => [
    { name: `Herald Decoder, whole body (${v.name})`, kind: "herald", variant: i },
    { name: `Herald MessagePackReader, 64 KiB views (${v.name})`, kind: "reader", variant: i },
  ]),
  // The Worker design: a worker decodes (as the client's reader does, 64 KiB at a time) and posts each
  // piece's messages to the page; the page's share is the structured clone's deserialization (done when
  // event.data is first read) and the walk. Reported: wall time, and the page's own time in its handlers.
  ...(process.env.WORKER === "0" ? [] : [{ name: "Worker decodes (Herald reader), page receives batches", kind: "worker", variant: 0 }]),
];

const server = await startServer({ dir });
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM_PATH || "/usr/bin/chromium",
  headless: true,
  args: ["--js-flags=--expose-gc", ...(process.getuid?.() === 0 ? ["--no-sandbox"] : [])],
});
const cdp = await browser.newBrowserCDPSession();
// CPU time of the renderer's main thread, in ms (the thread the page's JavaScript runs on; schedstat counts
// nanoseconds, where /proc's stat counts 10 ms ticks). Under load it still runs slower, but it does not count
// the time spent waiting for a core, which wall time does.
let rendererPid = 0;
const mainThreadCpu = async () => {
  if (!rendererPid) {
    const { processInfo } = await cdp.send("SystemInfo.getProcessInfo");
    // The page's renderer: the one whose CPU time grows while the page spins for 300 ms.
    const before = new Map(processInfo.filter((p) => p.type === "renderer").map((p) => [p.id, p.cpuTime]));
    await page.evaluate(() => { const end = performance.now() + 300; while (performance.now() < end); });
    const after = (await cdp.send("SystemInfo.getProcessInfo")).processInfo.filter((p) => before.has(p.id));
    rendererPid = after.sort((x, y) => (y.cpuTime - before.get(y.id)) - (x.cpuTime - before.get(x.id)))[0].id;
  }
  return Number(readFileSync(`/proc/${rendererPid}/task/${rendererPid}/schedstat`, "utf8").split(" ")[0]) / 1e6;
};
const page = await browser.newPage();
page.on("pageerror", (e) => console.error("page error:", e));

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};
const fmt = (n, digits = 0) => n.toLocaleString("en-US", { maximumFractionDigits: digits, minimumFractionDigits: digits });

const loadBefore = loadavg().map((x) => x.toFixed(1)).join(" ");
const results = {};
try {
  for (const set of SETS) {
    await page.goto(`${server.url}/blank`);
    await page.addScriptTag({ content: script });
    const body = [0, 1, 2, 3, 4].map((i) => `${encodeURIComponent(`/${set}/${i}`)}=0`).join("&");
    const sizes = await page.evaluate(async ({ body, url }) => {
      const get = async (accept) => new Uint8Array(await (await fetch(url, {
        method: "POST", body, headers: { "content-type": "application/x-www-form-urlencoded", "dont-chunk": "true", accept },
      })).arrayBuffer());
      window.bodies = { json: await get("application/json"), msgpack: await get("application/vnd.msgpack") };
      return { json: bodies.json.length, msgpack: bodies.msgpack.length };
    }, { body, url: `${server.url}/message-bus/bench/poll?dlp=t` });
    console.error(`${set}: JSON ${fmt(sizes.json)} bytes, MessagePack ${fmt(sizes.msgpack)} bytes`);
    await page.evaluate(({ script, CHUNK }) => {
      const code = `${script}
onmessage = (e) => {
  if (e.data.bytes) { self.bytes = e.data.bytes; return; }
  const d = new decoders.herald[0].Decoder();
  let batch = [];
  const reader = new decoders.herald[0].Reader((m) => batch.push(m), d);
  for (let at = 0; at < bytes.length; at += ${CHUNK}) {
    reader.push(bytes.subarray(at, at + ${CHUNK}));
    postMessage(batch);
    batch = [];
  }
  reader.finish();
  postMessage(null);
};`;
      window.worker = new Worker(URL.createObjectURL(new Blob([code], { type: "text/javascript" })));
      worker.postMessage({ bytes: bodies.msgpack.slice() });
    }, { script, CHUNK });
    for (let round = 0; round < ROUNDS; round++) {
      const order = ROWS.map((_, i) => ROWS[(i + round) % ROWS.length]);
      for (const row of order) {
        await page.evaluate(() => { gc(); gc(); });
        const frame = await frameFor(row);
        const cpu0 = await mainThreadCpu();
        const r = await runRow(row, frame);
        const cpu = (await mainThreadCpu()) - cpu0;
        if (r.count !== COUNT) throw new Error(`${row.name}: ${r.count} messages, expected ${COUNT}`);
        ((results[set] ||= {})[row.name] ||= []).push({ ms: r.ms, cpu, busy: r.busy });
        console.error(`${set} round ${round + 1} ${row.name}: ${fmt(r.ms)} ms, main thread CPU ${fmt(cpu)} ms${r.busy === undefined ? "" : `, page busy ${fmt(r.busy)} ms`}`);
        if (process.env.SLICES && r.slices) console.error(`  ms per 5,000 messages: ${r.slices.map((t, i) => fmt(t - (r.slices[i - 1] || 0))).join(" ")}`);
      }
    }
    if (process.env.PROFILE) await profile(set, ROWS.filter((r) => r.name.includes(process.env.PROFILE)));
  }
  report();
} finally {
  await browser.close();
  await server.stop({ keepDir: true });
}

// Self time per function (CDP sampling profiler, 100 us), for the rows named by PROFILE=part-of-a-name.
async function profile(set, rows) {
  const session = await page.context().newCDPSession(page);
  await session.send("Profiler.enable");
  await session.send("Profiler.setSamplingInterval", { interval: 100 });
  for (const row of rows) {
    await page.evaluate(() => { gc(); gc(); });
    await session.send("Profiler.start");
    for (let i = 0; i < 3; i++) await runRow(row, await frameFor(row));
    const { profile } = await session.send("Profiler.stop");
    const self = new Map();
    const dt = new Map(profile.nodes.map((n) => [n.id, 0]));
    for (let i = 0; i < profile.samples.length; i++) dt.set(profile.samples[i], dt.get(profile.samples[i]) + (profile.timeDeltas[i] || 0));
    let total = 0;
    for (const node of profile.nodes) {
      const f = node.callFrame;
      const name = `${f.functionName || "(anonymous)"} ${f.url ? f.url.split("/").pop() : ""}:${f.lineNumber + 1}:${f.columnNumber + 1}`;
      self.set(name, (self.get(name) || 0) + dt.get(node.id));
      total += dt.get(node.id);
    }
    console.error(`\nprofile, ${set}, ${row.name} (3 runs, ${fmt(total / 1000)} ms sampled):`);
    for (const [name, us] of [...self].sort((a, b) => b[1] - a[1]).slice(0, 15)) console.error(`  ${fmt(us / 1000, 1).padStart(8)} ms ${(100 * us / total).toFixed(1).padStart(5)}%  ${name}`);
  }
}

// COLD=1: each run in a fresh same-origin iframe with the decoders' script loaded anew (fresh feedback,
// nothing optimized yet), as the browser benchmark runs each client; otherwise in the warm top page.
async function frameFor(row) {
  let frame = page;
  if (process.env.COLD === "1" && row.kind !== "worker") {
    frame = await freshFrame(page);
    await frame.addScriptTag({ content: script });
  }
  return frame;
}

function runRow(row, frame) {
  return frame.evaluate(async ({ kind, variant, CHUNK }) => {
    const { json, msgpack } = window.bodies || parent.bodies;
    let sum = 0, count = 0;
    const t0 = performance.now();
    const slices = []; // ms at every 5,000th message: how the pace changes as the code warms up
    const visit = (m) => { if (m.channel !== "/__status") { if (++count % 5000 === 0) slices.push(performance.now() - t0); sum += m.data.id; } };
    if (kind === "worker") {
      let busy = 0;
      await new Promise((resolve) => {
        worker.onmessage = (e) => {
          const t = performance.now();
          const batch = e.data;
          if (batch === null) return resolve();
          for (let i = 0; i < batch.length; i++) visit(batch[i]);
          busy += performance.now() - t;
        };
        worker.postMessage({ go: true });
      });
      return { ms: performance.now() - t0, busy, count, sum };
    }
    if (kind === "json") {
      const all = JSON.parse(new TextDecoder().decode(json));
      for (let i = 0; i < all.length; i++) visit(all[i]);
    } else if (kind === "msgpackr") {
      const all = (window.unpackr ||= new decoders.Unpackr({ useRecords: false })).unpack(msgpack);
      for (let i = 0; i < all.length; i++) visit(all[i]);
    } else if (kind === "msgpack") {
      const all = (window.msgpackDecoder ||= new decoders.MsgpackDecoder()).decode(msgpack);
      for (let i = 0; i < all.length; i++) visit(all[i]);
    } else if (kind === "herald") {
      const d = (window.heraldDecoders ||= [])[variant] ||= new decoders.herald[variant].Decoder();
      const all = d.decode(msgpack, 0, msgpack.length);
      for (let i = 0; i < all.length; i++) visit(all[i]);
      d.release?.();
    } else {
      const d = (window.heraldDecoders ||= [])[variant] ||= new decoders.herald[variant].Decoder();
      const reader = new decoders.herald[variant].Reader(visit, d);
      for (let at = 0; at < msgpack.length; at += CHUNK) reader.push(msgpack.subarray(at, at + CHUNK));
      reader.finish();
      d.release?.();
    }
    return { ms: performance.now() - t0, count, sum, slices };
  }, { kind: row.kind, variant: row.variant, CHUNK });
}

function report() {
  const out = [];
  out.push(`Chromium ${browser.version()}, ${fmt(COUNT)} messages per set, ${ROUNDS} rounds, load ${loadBefore} before, ${loadavg().map((x) => x.toFixed(1)).join(" ")} after`, "");
  for (const set of SETS) {
    const json = median(results[set][ROWS[0].name].map((r) => r.ms));
    out.push(`${set}:`, "", "| decoder | ms, median (min–max) | main thread CPU ms, median | page thread busy, ms | vs JSON.parse |", "|---|---:|---:|---:|---:|");
    for (const row of ROWS) {
      const rs = results[set][row.name];
      const ms = rs.map((r) => r.ms);
      const busy = rs[0].busy === undefined ? "(all)" : fmt(median(rs.map((r) => r.busy)));
      out.push(`| ${row.name} | ${fmt(median(ms))} (${fmt(Math.min(...ms))}–${fmt(Math.max(...ms))}) | ${fmt(median(rs.map((r) => r.cpu)))} | ${busy} | ${fmt(json / median(ms), 2)}x |`);
    }
    out.push("");
  }
  console.log(out.join("\n"));
}
