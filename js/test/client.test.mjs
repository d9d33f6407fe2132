// The client's loop (client.ts) over its transports (transport_*.ts), with a fake fetch in place of the
// network only: fallback from a stream a proxy buffers to long polling, exponential backoff after failures and
// its reset after a success, a 429's Retry-After, a store epoch change, unsubscribing mid-request, and a
// streamed reply cut at every byte through the whole path (fetch, body reader, decoder, subscriptions).
// Node has no EventSource: `sse` answers "unsupported" here, which is itself a fallback step.
// The same behaviours against a real server in Chromium: test/browser/herald_client.test.mjs.
import { test } from "node:test";
import assert from "node:assert/strict";
import { encode } from "@msgpack/msgpack";
import { Herald } from "../dist/index.js";

const MSGPACK = "application/vnd.msgpack";
const msg = (id, data, channel = "/c") => ({ global_id: id + 100, message_id: id, channel, data });
const status = (positions) => ({ global_id: -1, message_id: -1, channel: "/__status", data: positions });

// A request the server holds until the client aborts it.
const held = (init) => new Promise((_, reject) => init.signal.addEventListener("abort", () => reject(new DOMException("aborted", "AbortError"))));

// A body whose chunks arrive one by one (after `delay` ms for the first, when given).
function streamed(chunks, { delay = 0 } = {}) {
  return new ReadableStream({
    async start(c) {
      if (delay) await new Promise((r) => setTimeout(r, delay));
      for (const chunk of chunks) c.enqueue(chunk);
      c.close();
    },
  });
}

// A fake network: each fetch takes the next reply from `replies` (a function of the call; none left: held)
// and is recorded with its time, URL, headers and body.
function network(replies) {
  const calls = [];
  const fetch = async (url, init) => {
    const call = { at: Date.now(), url, headers: init.headers || {}, body: init.body };
    calls.push(call);
    const reply = replies.shift();
    return reply ? reply(init, call) : held(init);
  };
  const until = async (n, timeout = 10000) => {
    const deadline = Date.now() + timeout;
    while (calls.length < n) {
      if (Date.now() > deadline) throw new Error(`${calls.length} requests, waited for ${n}`);
      await new Promise((r) => setTimeout(r, 5));
    }
    return calls;
  };
  return { fetch, calls, until };
}

function client(fetch, options = {}) {
  const errors = [];
  const resets = [];
  const bus = new Herald({ fetch, onError: (e) => errors.push(e), onReset: (e) => resets.push(e), ...options });
  return { bus, errors, resets };
}

const msgpackReply = (messages, headers = {}) => () => new Response(encode(messages), { headers: { "content-type": MSGPACK, ...headers } });
const empty = () => new Response("[]", { headers: { "content-type": "application/json" } });
const gaps = (calls) => calls.slice(1).map((c, i) => c.at - calls[i].at);

test("a stream a proxy buffers falls back (sse: none in Node) to long polling, and the best is tried again after retryBestAfter", async () => {
  const net = network([
    // The whole body at once, well after its headers: a buffering proxy. Its messages still count.
    () => new Response(streamed([encode([status({ "/c": 0 }), msg(1, "a")])], { delay: 80 }), { headers: { "content-type": MSGPACK } }),
    empty,
    empty,
  ]);
  const { bus, errors } = client(net.fetch, { firstChunkTimeout: 40, retryBestAfter: 2, pollInterval: 10 });
  const got = [];
  bus.subscribe("/c", (data) => got.push(data), { lastId: 0 });
  const calls = await net.until(4);
  await bus.stop();
  const kinds = calls.map((c) => (c.url.endsWith("?dlp=t") ? "poll" : c.headers["Dont-Chunk"] ? "longpoll" : "stream"));
  assert.deepEqual(kinds, ["stream", "longpoll", "longpoll", "stream"]);
  assert.deepEqual(got, ["a"]);
  assert.deepEqual(errors, [], "a fallback is not an error");
  assert.equal(bus.diagnostics().failures, 0);
});

test("a stream with no body stream falls back at once; the last transport failing too is reported and backs off", async () => {
  const net = network([() => new Response(null, { headers: { "content-type": MSGPACK } }), empty]);
  const { bus, errors } = client(net.fetch, { transports: ["stream", "longpoll"], pollInterval: 10 });
  bus.subscribe("/c", () => {}, { lastId: 0 });
  const calls = await net.until(2);
  assert.equal(calls[1].headers["Dont-Chunk"], "true");
  assert.equal(bus.transport, "longpoll");
  await bus.stop();
  assert.deepEqual(errors, []);

  const only = network([]);
  const sseOnly = client(only.fetch, { transports: ["sse"], backoff: { base: 40, random: () => 0.999 } });
  sseOnly.bus.subscribe("/c", () => {});
  await new Promise((r) => setTimeout(r, 150));
  await sseOnly.bus.stop();
  assert.ok(sseOnly.errors.length >= 2 && sseOnly.errors.length <= 4, `backs off between attempts: ${sseOnly.errors.length} in 150 ms`);
  assert.match(String(sseOnly.errors[0]), /sse: no EventSource/);
  assert.equal(only.calls.length, 0);
});

test("failures back off exponentially (full jitter), a success resets the backoff, counts in diagnostics()", async () => {
  const fail = () => Promise.reject(new TypeError("network down"));
  const net = network([fail, fail, fail, fail, empty, fail, fail]);
  // random() just below 1: each wait is its ceiling minus 1 ms: 29, 59, 119, 239 ms.
  const { bus, errors } = client(net.fetch, { transports: ["longpoll"], pollInterval: 10, backoff: { base: 30, cap: 1000, random: () => 0.999 } });
  bus.subscribe("/c", () => {}, { lastId: 0 });
  const calls = await net.until(7);
  const d = bus.diagnostics();
  await bus.stop();
  const g = gaps(calls);
  [29, 59, 119, 239].forEach((wait, i) => assert.ok(g[i] >= wait - 2, `gap ${i + 1}: ${g[i]} ms, backoff ${wait}`));
  assert.ok(g[4] >= 98, `after a success: the polling pace (at least 100 ms), ${g[4]}`);
  assert.ok(g[5] >= 27 && g[5] < 239, `after a success the backoff starts over: ${g[5]} ms`);
  assert.equal(errors.length, 6);
  assert.match(String(errors[0]), /network down/);
  assert.deepEqual([d.requests, d.failures, d.recentFailures], [7, 6, 2]);
});

test("429: waits its Retry-After (seconds; at least 100 ms), is no failure, and leaves the backoff alone", async () => {
  const limited = (after) => () => new Response("busy", { status: 429, headers: after === null ? {} : { "retry-after": after } });
  const net = network([limited("1"), limited("0"), () => Promise.reject(new TypeError("down"))]);
  const { bus, errors } = client(net.fetch, { transports: ["longpoll"], backoff: { base: 30, random: () => 0.999 } });
  bus.subscribe("/c", () => {}, { lastId: 0 });
  const calls = await net.until(4);
  const d = bus.diagnostics();
  await bus.stop();
  const g = gaps(calls);
  assert.ok(g[0] >= 998 && g[0] < 5000, `Retry-After: 1 waited ${g[0]} ms`);
  assert.ok(g[1] >= 98 && g[1] < 1000, `Retry-After: 0 waited ${g[1]} ms (the 100 ms floor)`);
  assert.ok(g[2] >= 27 && g[2] < 1000, `the first failure after 429s waits the first backoff step: ${g[2]} ms`);
  assert.equal(errors.length, 1);
  assert.equal(d.failures, 1);
});

test("a new store epoch: its reply is dropped, the client asks again at once from now, and the reset is reported", async () => {
  const net = network([
    msgpackReply([status({ "/c": 5 }), msg(6, "six"), msg(7, "seven")], { "herald-epoch": "A" }),
    msgpackReply([msg(8, "from the new store, for positions of the old one")], { "herald-epoch": "B" }),
    msgpackReply([status({ "/c": 2 }), msg(3, "three")], { "herald-epoch": "B" }),
  ]);
  const { bus, errors, resets } = client(net.fetch, { transports: ["longpoll"] });
  const got = [];
  bus.subscribe("/c", (data, m) => got.push([m.message_id, data]));
  const calls = await net.until(4);
  await bus.stop();
  assert.deepEqual(calls.map((c) => c.body), ["%2Fc=-1&__seq=1", "%2Fc=7&__seq=2", "%2Fc=-1&__seq=3", "%2Fc=3&__seq=4"]);
  assert.deepEqual(got, [[6, "six"], [7, "seven"], [3, "three"]]);
  assert.deepEqual(resets, [{ channel: "/c", lastId: 7, serverLastId: 2 }]);
  assert.equal(bus.epoch, "B");
  assert.ok(calls[2].at - calls[1].at < 1000, "asked again without the polling pace");
  assert.deepEqual(errors, []);
});

test("unsubscribe ends the request in flight (no error) and the next one asks for what is left; none left, no request", async () => {
  const net = network([]);
  const { bus, errors } = client(net.fetch, { transports: ["stream"] });
  const offA = bus.subscribe("/a", () => {}, { lastId: 3 });
  bus.subscribe("/b ü", () => {}, { lastId: 9 });
  bus.subscribe("/b ü", () => {}, { lastId: 4 });
  await net.until(1);
  assert.equal(net.calls[0].body, "%2Fa=3&%2Fb%20%C3%BC=4&__seq=1");
  assert.equal(offA(), true);
  assert.equal(offA(), false);
  await net.until(2);
  assert.equal(net.calls[1].body, "%2Fb%20%C3%BC=4&__seq=2");
  assert.equal(bus.unsubscribe("/b*"), true);
  await new Promise((r) => setTimeout(r, 200));
  assert.equal(net.calls.length, 2, "no subscriptions: no request");
  assert.equal(bus.status, "started");
  bus.subscribe("/d", () => {}, { lastId: 0 });
  await net.until(3);
  assert.equal(net.calls[2].body, "%2Fd=0&__seq=3");
  await bus.stop();
  assert.equal(bus.status, "stopped");
  assert.deepEqual(errors, []);
  assert.equal(bus.diagnostics().failures, 0);
});

// Herald's MessagePack stream and message_bus's JSON chunks, with the text users send.
const messages = [
  msg(1, "plain"),
  msg(2, { text: "héllo 🎉 日本 👩‍👩‍👧", n: 2 }),
  msg(3, "nul \u0000 and the separator \r\n|\r\n and its escape \r\n||\r\n"),
  msg(4, ""),
  msg(5, "✓".repeat(100)),
  msg(6, "other channel", "/other"),
  msg(7, [1, -2, 3.5, null, true, { deep: "ü" }]),
];
const want = messages.filter((m) => m.channel === "/c").map((m) => [m.message_id, m.data]);
const concat = (...parts) => {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) { out.set(p, at); at += p.length; }
  return out;
};
const segment = (array) => JSON.stringify(array).replaceAll("\r\n|\r\n", "\r\n||\r\n") + "\r\n|\r\n";
const BODIES = {
  [MSGPACK]: concat(encode([status({ "/c": 0 }), ...messages.slice(0, 3)]), ...messages.slice(3).map((m) => encode([m])), encode([])),
  "text/plain; charset=utf-8": new TextEncoder().encode(segment([status({ "/c": 0 }), ...messages.slice(0, 3)]) + messages.slice(3).map((m) => segment([m])).join("") + segment([])),
};

for (const [type, bytes] of Object.entries(BODIES)) {
  test(`a streamed ${type} reply cut at every byte, and one byte per chunk: every message once, in order`, async () => {
    const cuts = [...Array.from({ length: bytes.length - 1 }, (_, i) => [bytes.subarray(0, i + 1), bytes.subarray(i + 1)]),
      Array.from(bytes, (b) => Uint8Array.of(b))];
    // Each cut is its own client; they run side by side (after a stream the next request waits 100 ms).
    const one = async (chunks, n) => {
      const net = network([() => new Response(streamed(chunks), { headers: { "content-type": type } })]);
      const { bus, errors } = client(net.fetch, { transports: ["stream"] });
      const got = [];
      bus.subscribe("/c", (data, m) => got.push([m.message_id, data]), { lastId: 0 });
      await net.until(2); // the stream ended: the next request is out
      await bus.stop();
      assert.deepEqual(got, want, `cut ${n} of ${bytes.length}`);
      assert.deepEqual(errors, []);
      assert.equal(net.calls[1].body, "%2Fc=7&__seq=2");
    };
    for (let at = 0; at < cuts.length; at += 100) await Promise.all(cuts.slice(at, at + 100).map((chunks, i) => one(chunks, at + i)));
  });
}
