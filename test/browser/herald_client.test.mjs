// Herald's own browser client (js/, served as /message-bus/herald.js) in headless Chromium against a real
// server: every transport with MessagePack and JSON and real text; a server killed and restarted
// mid-stream (every message exactly once, in order); a store reset reported; targeted messages only for
// their user; message_bus's own middleware (JSON, SSE falling back); the MessageBus facade; stop().
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { startServer, launchBrowser, ROOT, IMPL } from "./helpers.mjs";

const SCRIPT = readFileSync(join(ROOT, "lib/herald/rack/herald.js"), "utf8");
const herald = IMPL === "herald";
const skip = !herald && "needs Herald's server (HERALD_TEST_IMPL)";

let server;
let browser;

before(async () => {
  if (!herald) return;
  [server, browser] = await Promise.all([startServer({ userCookie: "user_id" }), launchBrowser()]);
});

after(async () => {
  await shared?.context().close();
  await browser?.close();
  if (!server) return;
  const exit = await server.stop();
  assert.equal(exit?.code, 0, "server should exit cleanly on SIGTERM");
});

// Text that breaks naive clients: non-ASCII, emoji (astral and joined), NUL, the chunk separator, long.
const SAMPLES = [
  "plain ascii",
  { text: "héllo wörld — 日本語 🎉👩‍👩‍👧", name: "zoë" },
  "nul \u0000 inside",
  "separator \r\n|\r\n and its escape \r\n||\r\n",
  "",
  "long ✓".repeat(2000),
  { nested: [1, -2, 3.5, null, true, { deep: "ü" }], empty: {}, list: [] },
];

// A page on the server's origin with the client loaded; `window.got[channel]` collects deliveries and
// `window.responses` the content type of each reply.
async function heraldPage(context, url, { viaUrl = false } = {}) {
  const page = await context.newPage();
  page.on("pageerror", (error) => console.error("page error:", error));
  if (process.env.DEBUG_PAGE) page.on("console", (m) => console.log("page:", m.text()));
  if (process.env.DEBUG_PAGE) page.on("request", (r) => console.log("req:", r.method(), r.url(), JSON.stringify(r.headers()), r.postData()));
  if (process.env.DEBUG_PAGE) page.on("requestfailed", (r) => console.log("req failed:", r.url(), r.failure()?.errorText));
  await page.goto(`${url}/blank`);
  if (viaUrl) await page.addScriptTag({ url: "/message-bus/herald.js" });
  else await page.addScriptTag({ content: SCRIPT });
  await page.evaluate(() => {
    window.got = {};
    window.resets = [];
    window.errors = [];
  });
  return page;
}

async function startClient(page, options) {
  await page.evaluate((options) => {
    window.bus = new window.Herald({
      backoff: { base: 100, cap: 1000 },
      onReset: (e) => window.resets.push(e),
      onError: (e) => window.errors.push(String(e && e.message || e)),
      ...options,
    });
  }, options);
}

async function subscribe(page, channel, lastId = -1) {
  await page.evaluate(([channel, lastId]) => {
    window.got[channel] = [];
    window.bus.subscribe(channel, (data, m) => window.got[channel].push({ data, id: m.message_id, gid: m.global_id }), { lastId });
  }, [channel, lastId]);
  // Subscribed "from now": the server's status gives the position; from then on nothing can be missed.
  if (lastId === -1) await page.waitForFunction((c) => (window.bus.lastIds()[c] ?? -1) >= 0, channel, { timeout: 10000, polling: 50 });
}

async function waitFor(page, channel, count, timeout = 15000) {
  await page.waitForFunction(([c, n]) => (window.got[c] || []).length >= n, [channel, count], { timeout, polling: 50 });
  return page.evaluate((c) => window.got[c], channel);
}

function watchTypes(page) {
  const types = [];
  const record = (r) => {
    if (r.url().includes("/message-bus/") && !r.url().endsWith("herald.js")) types.push(r.headers()["content-type"]);
  };
  page.on("response", record);
  types.done = () => page.off("response", record);
  return types;
}

// One page for the transport cases (a new page costs seconds on a loaded machine); each case makes its
// own client and stops it.
let shared;
async function sharedPage() {
  if (!shared) shared = await heraldPage(await browser.newContext(), server.url);
  await shared.evaluate(() => {
    window.got = {};
    window.errors = [];
  });
  return shared;
}

let channelCount = 0;
const fresh = (name) => `/hc/${name}/${++channelCount}`;

const CASES = [
  ["stream", true, "application/vnd.msgpack"],
  ["stream", false, "text/plain; charset=utf-8"],
  ["sse", false, "text/event-stream"],
  ["longpoll", true, "application/vnd.msgpack"],
  ["longpoll", false, "application/json; charset=utf-8"],
  ["poll", true, "application/vnd.msgpack"],
  ["poll", false, "application/json; charset=utf-8"],
];

for (const [transport, msgpack, type] of CASES) {
  test(`${transport} with ${msgpack ? "MessagePack" : "JSON"}: live messages and a backlog, real text, in order`, { skip }, async () => {
    const page = await sharedPage();
    const types = watchTypes(page);
    await startClient(page, { transports: [transport], msgpack, pollInterval: 200 });
    const channel = fresh(transport);
    await subscribe(page, channel);
    const ids = [];
    for (const data of SAMPLES) ids.push(await server.publish(channel, data));
    const got = await waitFor(page, channel, SAMPLES.length);
    assert.deepEqual(got.map((g) => g.data), SAMPLES);
    assert.deepEqual(got.map((g) => g.id), ids);

    // A second subscription from id 0 on another channel: a backlog read in one go.
    const backlog = fresh(`${transport}-backlog`);
    for (const data of SAMPLES) await server.publish(backlog, data);
    await subscribe(page, backlog, 0);
    assert.deepEqual((await waitFor(page, backlog, SAMPLES.length)).map((g) => g.data), SAMPLES);
    assert.equal(await page.evaluate(() => window.bus.transport), transport);
    assert.ok(types.includes(type), `replies were ${type}: ${types}`);
    if (msgpack) assert.ok(!types.some((t) => t.startsWith("application/json")), `no JSON reply: ${types}`);
    await page.evaluate(() => window.bus.stop());
    types.done();
    assert.deepEqual(await page.evaluate(() => window.errors), []);
  });
}

test("kill -9 and restart the server mid-stream: every message exactly once, in order", { skip, timeout: 90000 }, async () => {
  const first = await startServer({});
  const context = await browser.newContext();
  const page = await heraldPage(context, first.url);
  await startClient(page, {});
  const channel = "/hc/restart";
  await subscribe(page, channel, 0);
  const sent = [];
  const publishSome = async (srv, n) => {
    for (let i = 0; i < n; i++) sent.push(await srv.publish(channel, { n: sent.length + 1, text: `message ${sent.length + 1} ✓ 🎉` }));
  };
  await publishSome(first, 40);
  await waitFor(page, channel, 20);
  await first.stop({ signal: "SIGKILL", keepDir: true });
  await new Promise((r) => setTimeout(r, 1500)); // the client retries (and fails) against nothing
  const second = await startServer({ port: first.port, dir: first.dir });
  try {
    await publishSome(second, 40);
    const got = await waitFor(page, channel, 80, 30000);
    await new Promise((r) => setTimeout(r, 500)); // nothing more arrives
    const all = await page.evaluate((c) => window.got[c], channel);
    assert.equal(all.length, 80, "no duplicates");
    assert.deepEqual(all.map((g) => g.data.n), Array.from({ length: 80 }, (_, i) => i + 1));
    assert.deepEqual(all.map((g) => g.id), sent);
    assert.equal(got[79].data.text, "message 80 ✓ 🎉");
    assert.equal(await page.evaluate(() => window.bus.transport), "stream", "a dead server is not a reason to fall back");
    const errors = await page.evaluate(() => window.errors);
    assert.ok(errors.length >= 1, "the failed reconnects were reported");
    assert.deepEqual(await page.evaluate(() => window.resets), []);

    // Now the store is wiped (a new, empty directory on the same port): ids go backwards, and the app hears of it.
    await second.stop({ keepDir: false });
    const third = await startServer({ port: first.port });
    try {
      await page.waitForFunction(() => window.resets.length > 0, null, { timeout: 20000, polling: 50 });
      // The last id received, not 80: after a crash the log store may skip ids ahead (they only increase).
      assert.deepEqual(await page.evaluate(() => window.resets), [{ channel, lastId: sent.at(-1), serverLastId: 0 }]);
      await third.publish(channel, { n: "after reset" });
      const after = await waitFor(page, channel, 81);
      assert.deepEqual(after[80], { data: { n: "after reset" }, id: 1, gid: after[80].gid });
    } finally {
      await third.stop();
    }
  } finally {
    await page.evaluate(() => window.bus.stop()).catch(() => {});
    await context.close();
    await second.stop().catch(() => {});
  }
});

// A store replaced under the client whose new ids are already above the client's: ids alone cannot tell
// (message 4 of the new store looks like the next one). The epoch Herald names in its replies can.
test("a real herald server restarted on another store with higher ids: a new epoch, reported, nothing of it taken for the old store's", { skip, timeout: 120000 }, async () => {
  const channel = "/hc/epoch";
  const first = await startServer({ real: true });
  const context = await browser.newContext();
  const page = await heraldPage(context, first.url);
  let second;
  try {
    await startClient(page, {});
    await subscribe(page, channel, 0);
    for (let n = 1; n <= 3; n++) await first.cliPublish(channel, { n });
    await waitFor(page, channel, 3);
    const epoch = await page.evaluate(() => window.bus.epoch);
    assert.match(epoch, /^[0-9a-f]{16}$/, "the MessagePack replies name the epoch");
    await first.stop();

    // The new store already holds 5 messages on the channel before the server comes back.
    const dir = mkdtempSync(join(tmpdir(), "herald-epoch-"));
    for (let n = 1; n <= 5; n++) {
      await promisify(execFile)("bundle", ["exec", "ruby", join(ROOT, "exe/herald"), "publish", channel, JSON.stringify({ n: `new ${n}` }), "--dir", dir], { cwd: ROOT });
    }
    second = await startServer({ real: true, port: first.port, dir });
    await page.waitForFunction(() => window.resets.length > 0, null, { timeout: 30000, polling: 50 });
    assert.deepEqual(await page.evaluate(() => window.resets), [{ channel, lastId: 3, serverLastId: 5 }]);
    assert.notEqual(await page.evaluate(() => window.bus.epoch), epoch);
    await second.cliPublish(channel, { n: "after the reset" });
    const got = await waitFor(page, channel, 4);
    await new Promise((r) => setTimeout(r, 300));
    assert.deepEqual((await page.evaluate((c) => window.got[c], channel)).map((g) => [g.id, g.data.n]),
      [[1, 1], [2, 2], [3, 3], [6, "after the reset"]], `got ${JSON.stringify(got)}`);
  } finally {
    await page.evaluate(() => window.bus.stop()).catch(() => {});
    await context.close();
    await first.stop().catch(() => {});
    await second?.stop();
  }
});

test("offline: no requests while offline; back online it reconnects at once and misses nothing", { skip }, async () => {
  const context = await browser.newContext();
  const page = await heraldPage(context, server.url);
  const requests = [];
  page.on("request", (r) => r.url().includes("/message-bus/") && requests.push(Date.now()));
  // A long backoff: only the online event can explain a quick reconnect.
  await startClient(page, { backoff: { base: 60000, cap: 60000 } });
  const channel = fresh("offline");
  await subscribe(page, channel);
  await context.setOffline(true);
  await new Promise((r) => setTimeout(r, 300));
  const whileOffline = requests.length;
  const ids = [];
  for (const text of ["while", "you were", "away ✈️"]) ids.push(await server.publish(channel, text));
  await new Promise((r) => setTimeout(r, 1000));
  assert.equal(requests.length, whileOffline, "no request while offline");
  const back = Date.now();
  await context.setOffline(false);
  const got = await waitFor(page, channel, 3, 5000);
  assert.ok(Date.now() - back < 4000, "reconnected without waiting out the backoff");
  assert.deepEqual(got.map((g) => g.data), ["while", "you were", "away ✈️"]);
  assert.deepEqual(got.map((g) => g.id), ids);
  await page.evaluate(() => window.bus.stop());
  await context.close();
});

test("429 from a full server: the client waits its Retry-After (15 s) instead of hammering it", { skip, timeout: 60000 }, async () => {
  // max_active_clients 0: nothing is ever parked, so a poll with nothing to say is refused with a 429.
  const full = await startServer({ maxClients: 0 });
  const context = await browser.newContext();
  try {
    const page = await heraldPage(context, full.url);
    const statuses = [];
    page.on("response", (r) => r.url().includes("/poll") && statuses.push(r.status()));
    await startClient(page, { transports: ["longpoll"] });
    const channel = fresh("full");
    await subscribe(page, channel); // the first reply (the status) comes at once; the next poll gets the 429
    await page.waitForFunction(() => window.errors !== undefined, null);
    await new Promise((r) => setTimeout(r, 3000));
    assert.deepEqual(statuses, [200, 429], "one refused poll, then quiet for the Retry-After");
    await page.evaluate(() => window.bus.stop());
  } finally {
    await context.close();
    await full.stop();
  }
});

test("targeted messages reach only their user", { skip }, async () => {
  const pages = [];
  for (const user of ["1", "2"]) {
    const context = await browser.newContext();
    await context.addCookies([{ name: "user_id", value: user, url: server.url }]);
    const page = await heraldPage(context, server.url);
    await startClient(page, {});
    pages.push(page);
  }
  const channel = fresh("targeted");
  for (const page of pages) await subscribe(page, channel);
  await server.publish(channel, "for user 1 only", { user_ids: [1] });
  await server.publish(channel, "for everyone");
  const one = await waitFor(pages[0], channel, 2);
  const two = await waitFor(pages[1], channel, 1);
  await new Promise((r) => setTimeout(r, 300));
  assert.deepEqual(one.map((g) => g.data), ["for user 1 only", "for everyone"]);
  assert.deepEqual((await pages[1].evaluate((c) => window.got[c], channel)).map((g) => g.data), ["for everyone"]);
  assert.equal(two.length, 1);
  for (const page of pages) await page.context().close();
});

test("against message_bus's own middleware: JSON (no MessagePack offered), and SSE falls back to long polling", { skip, timeout: 60000 }, async () => {
  // message_bus can miss a message published just after a held poll's first chunk until that poll ends
  // (see test/support/http_server.rb): 3 s polls keep that within waitFor's 15 s.
  const mb = await startServer({ impl: "message_bus", longPollMs: 3000 });
  const context = await browser.newContext();
  try {
    for (const transports of [["stream"], ["sse", "longpoll"]]) {
      const page = await heraldPage(context, mb.url);
      const types = watchTypes(page);
      await startClient(page, { transports });
      const channel = fresh(`mb-${transports[0]}`);
      await subscribe(page, channel);
      for (const data of SAMPLES) await mb.publish(channel, data);
      assert.deepEqual((await waitFor(page, channel, SAMPLES.length)).map((g) => g.data), SAMPLES);
      assert.ok(types.every((t) => !t.includes("msgpack")), types.join());
      assert.equal(await page.evaluate(() => window.bus.transport), transports.at(-1));
      await page.evaluate(() => window.bus.stop());
      await page.close();
    }
  } finally {
    await context.close();
    await mb.stop();
  }
});

test("the MessageBus facade: a page written for message-bus.js, served /message-bus/herald.js", { skip }, async () => {
  const context = await browser.newContext();
  const page = await heraldPage(context, server.url, { viaUrl: true });
  const channel = fresh("facade");
  assert.equal(await page.evaluate(() => window.MessageBus.status()), "stopped");
  await page.evaluate((channel) => {
    window.got.facade = [];
    window.MessageBus.baseUrl = "/";
    window.MessageBus.subscribe(channel, (data, globalId, messageId) => window.got.facade.push({ data, globalId, messageId }));
  }, channel);
  assert.equal(await page.evaluate(() => window.MessageBus.status()), "started");
  await page.waitForFunction((c) => (window.MessageBus.herald.lastIds()[c] ?? -1) >= 0, channel, { polling: 50 });
  const id = await server.publish(channel, "via the facade ✓");
  const got = await waitFor(page, "facade", 1);
  assert.equal(got[0].data, "via the facade ✓");
  assert.equal(got[0].messageId, id);
  assert.ok(got[0].globalId >= id);
  assert.equal(await page.evaluate((c) => window.MessageBus.unsubscribe(c.slice(0, 4) + "*"), channel), true);
  await server.publish(channel, "not delivered");
  await new Promise((r) => setTimeout(r, 300));
  assert.equal((await page.evaluate(() => window.got.facade)).length, 1);
  await page.evaluate(() => window.MessageBus.stop());
  assert.equal(await page.evaluate(() => window.MessageBus.status()), "stopped");
  await context.close();
});

test("the MessageBus facade: pause() holds messages back (they still arrive), resume() delivers them in order; diagnostics()", { skip }, async () => {
  const context = await browser.newContext();
  const page = await heraldPage(context, server.url, { viaUrl: true });
  const logged = [];
  page.on("console", (m) => logged.push(m.text()));
  const channel = fresh("pause");
  await page.evaluate((channel) => {
    window.got.paused = [];
    window.MessageBus.subscribe(channel, (data, globalId, messageId) => window.got.paused.push({ data, messageId }));
  }, channel);
  await page.waitForFunction((c) => (window.MessageBus.herald.lastIds()[c] ?? -1) >= 0, channel, { polling: 50 });
  await page.evaluate(() => window.MessageBus.pause());
  assert.equal(await page.evaluate(() => window.MessageBus.status()), "paused");
  const ids = [];
  for (const text of ["one", "two ✓", "three 🎉"]) ids.push(await server.publish(channel, text));
  await page.waitForFunction(() => window.MessageBus.diagnostics().waiting === 3, null, { polling: 100, timeout: 10000 });
  assert.deepEqual(await page.evaluate(() => window.got.paused), [], "nothing reaches a callback while paused");
  const d = await page.evaluate(() => window.MessageBus.diagnostics());
  assert.equal(d.paused, true);
  assert.equal(d.lastIds[channel], ids[2], "received (and not asked for again)");
  assert.ok(d.requests >= 1 && d.failures === 0, JSON.stringify(d));
  assert.match(d.epoch, /^[0-9a-f]{16}$/);
  assert.deepEqual(d.callbacks, [{ channel, lastId: ids[2] }]);
  assert.ok(logged.some((l) => /^Total ajax calls: \d+ Recent failure count: 0 Total failures: 0$/.test(l)), logged.join("\n"));
  await page.evaluate(() => window.MessageBus.resume());
  assert.equal(await page.evaluate(() => window.MessageBus.status()), "started");
  assert.deepEqual(await page.evaluate(() => window.got.paused), [
    { data: "one", messageId: ids[0] }, { data: "two ✓", messageId: ids[1] }, { data: "three 🎉", messageId: ids[2] }]);
  const id = await server.publish(channel, "after resume");
  await waitFor(page, "paused", 4);
  assert.deepEqual((await page.evaluate(() => window.got.paused))[3], { data: "after resume", messageId: id });
  await page.evaluate(() => window.MessageBus.stop());
  await context.close();
});

// The page's visibility and lifecycle as the browser reports them (a headless page is always visible).
const setVisibility = (page, state) => page.evaluate((state) => {
  Object.defineProperty(document, "visibilityState", { get: () => state, configurable: true });
  Object.defineProperty(document, "hidden", { get: () => state === "hidden", configurable: true });
  document.dispatchEvent(new Event("visibilitychange"));
}, state);

test("a hidden tab lets go of its stream and polls every backgroundInterval; shown again it streams at once", { skip, timeout: 60000 }, async () => {
  const context = await browser.newContext();
  const page = await heraldPage(context, server.url);
  const requests = [];
  page.on("request", (r) => { if (r.url().includes("/poll")) requests.push({ at: Date.now(), poll: r.url().includes("dlp=t") }); });
  const aborted = [];
  page.on("requestfailed", (r) => aborted.push(Date.now()));
  await startClient(page, { transports: ["stream"], backgroundInterval: 1500 });
  const channel = fresh("hidden");
  await subscribe(page, channel);
  assert.equal(requests.at(-1).poll, false, "visible: a held stream");
  const hiddenAt = Date.now();
  await setVisibility(page, "hidden");
  await page.waitForFunction(() => window.bus.transport === "poll", null, { polling: 50, timeout: 2000 });
  assert.ok(aborted.some((t) => t >= hiddenAt), "the stream was let go at once");
  const id = await server.publish(channel, "while hidden");
  const started = Date.now();
  await waitFor(page, channel, 1, 5000);
  const hiddenRequests = requests.filter((r) => r.at >= hiddenAt);
  assert.ok(hiddenRequests.every((r) => r.poll), "only short polls while hidden");
  assert.ok(Date.now() - started < 4000, "picked up by the next background poll");
  await new Promise((r) => setTimeout(r, 3200));
  const polls = requests.filter((r) => r.at >= hiddenAt).length;
  assert.ok(polls >= 2 && polls <= 5, `about one poll per 1.5 s while hidden (${polls} in ~5 s)`);
  const shownAt = Date.now();
  await setVisibility(page, "visible");
  await page.waitForFunction(() => window.bus.transport === "stream", null, { polling: 50, timeout: 1000 });
  const next = await server.publish(channel, "visible again");
  const got = await waitFor(page, channel, 2, 3000);
  assert.deepEqual(got.map((g) => [g.id, g.data]), [[id, "while hidden"], [next, "visible again"]]);
  assert.ok(requests.some((r) => r.at >= shownAt && !r.poll), "a stream once visible");
  await page.evaluate(() => window.bus.stop());
  await context.close();
});

test("pagehide lets go of the connection and makes no other until pageshow; nothing is missed", { skip, timeout: 60000 }, async () => {
  const context = await browser.newContext();
  const page = await heraldPage(context, server.url);
  const requests = [];
  page.on("request", (r) => { if (r.url().includes("/poll")) requests.push(Date.now()); });
  const aborted = [];
  page.on("requestfailed", () => aborted.push(Date.now()));
  await startClient(page, { transports: ["stream"] });
  const channel = fresh("pagehide");
  await subscribe(page, channel);
  const hiddenAt = Date.now();
  await page.evaluate(() => window.dispatchEvent(new PageTransitionEvent("pagehide", { persisted: true })));
  await page.waitForFunction(() => true);
  await new Promise((r) => setTimeout(r, 300));
  assert.ok(aborted.some((t) => t >= hiddenAt), "the request in flight was aborted");
  const id = await server.publish(channel, "while away");
  await new Promise((r) => setTimeout(r, 1200));
  assert.deepEqual(requests.filter((t) => t > hiddenAt), [], "no request between pagehide and pageshow");
  assert.deepEqual(await page.evaluate((c) => window.got[c], channel), []);
  await page.evaluate(() => window.dispatchEvent(new PageTransitionEvent("pageshow", { persisted: true })));
  const got = await waitFor(page, channel, 1, 3000);
  assert.deepEqual(got.map((g) => [g.id, g.data]), [[id, "while away"]]);
  await page.evaluate(() => window.bus.stop());
  await context.close();
});

test("stop() leaves no request, timer or listener behind", { skip }, async () => {
  const context = await browser.newContext();
  // Count the page's live timers and listeners, from before the client loads.
  await context.addInitScript(() => {
    const live = new Set();
    const { setTimeout: set, clearTimeout: clear } = window;
    window.setTimeout = (fn, ms, ...args) => {
      const id = set(() => { live.delete(id); typeof fn === "function" && fn(...args); }, ms);
      live.add(id);
      return id;
    };
    window.clearTimeout = (id) => { live.delete(id); clear(id); };
    window.liveTimers = () => live.size;
    let listeners = 0;
    for (const target of [window, document]) {
      const add = target.addEventListener.bind(target);
      const remove = target.removeEventListener.bind(target);
      target.addEventListener = (...a) => { listeners++; add(...a); };
      target.removeEventListener = (...a) => { listeners--; remove(...a); };
    }
    window.liveListeners = () => listeners;
  });
  const page = await heraldPage(context, server.url);
  const requests = [];
  page.on("request", (r) => r.url().includes("/message-bus/") && requests.push(r.url()));
  const before = await page.evaluate(() => [window.liveTimers(), window.liveListeners()]);
  await startClient(page, { transports: ["poll"], pollInterval: 300 });
  await subscribe(page, fresh("stop"));
  await new Promise((r) => setTimeout(r, 700));
  assert.ok(requests.length >= 2, "it was polling");
  assert.ok(await page.evaluate(() => window.liveListeners()) > before[1]);
  await page.evaluate(() => window.bus.stop());
  const after = await page.evaluate(() => [window.liveTimers(), window.liveListeners()]);
  assert.deepEqual(after, before, "timers and listeners back to what the page had");
  const count = requests.length;
  await new Promise((r) => setTimeout(r, 1000));
  assert.equal(requests.length, count, "no request after stop()");
  assert.equal(await page.evaluate(() => window.bus.status), "stopped");
  await context.close();
});
