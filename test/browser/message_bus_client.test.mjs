// message_bus's own JS client (npm message-bus-client, unmodified) in headless Chromium against Herald:
// streaming, long-polling without streaming, short polling, and targeted delivery per user.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { startServer, launchBrowser, clientPage, subscribe, waitForReceived, IMPL } from "./helpers.mjs";

let server;
let browser;

before(async () => {
  [server, browser] = await Promise.all([startServer({ userCookie: "user_id" }), launchBrowser()]);
});

after(async () => {
  await browser?.close();
  if (!server) return;
  const exit = await server.stop();
  assert.equal(exit?.code, 0, `server should exit cleanly on SIGTERM (${IMPL})`);
});

// Records each poll request and the content type of its reply.
function watchPolls(page) {
  const polls = [];
  page.on("request", (request) => {
    if (request.url().includes("/message-bus/")) {
      polls.push({ url: request.url(), dontChunk: request.headers()["dont-chunk"], contentType: null, request });
    }
  });
  page.on("response", (response) => {
    const poll = polls.find((p) => p.request === response.request());
    if (poll) poll.contentType = response.headers()["content-type"];
  });
  return polls;
}

async function receivesLive(settings, channel) {
  const context = await browser.newContext();
  const page = await clientPage(context, server.url, settings);
  const polls = watchPolls(page);
  await subscribe(page, channel);
  const ids = [];
  for (const n of [1, 2, 3]) {
    ids.push(await server.publish(channel, { n }));
    await waitForReceived(page, channel, n);
  }
  const received = await waitForReceived(page, channel, 3);
  assert.deepEqual(received.map((m) => m.data), [{ n: 1 }, { n: 2 }, { n: 3 }]);
  assert.deepEqual(received.map((m) => m.messageId), ids);
  await context.close();
  return polls;
}

test("streaming (chunked) delivery", async () => {
  const polls = await receivesLive({}, "/stream");
  assert.ok(polls.length >= 1);
  assert.ok(polls.every((p) => !p.url.includes("dlp=t") && p.dontChunk === undefined), "streaming polls");
  // message_bus 4.5.1 sends two content-type headers on streams (fixed in 4.5.2); Herald sends exactly one.
  const streamed = IMPL === "herald"
    ? (type) => type === "text/plain; charset=utf-8"
    : (type) => (type || "").includes("text/plain; charset=utf-8");
  assert.ok(polls.some((p) => streamed(p.contentType)), "a chunked text/plain reply");
});

test("long-polling without streaming", async () => {
  const polls = await receivesLive({ enableChunkedEncoding: false }, "/longpoll");
  assert.ok(polls.every((p) => p.dontChunk === "true" && !p.url.includes("dlp=t")));
  assert.ok(polls.some((p) => p.contentType === "application/json; charset=utf-8"));
});

test("short polling (dlp=t)", async () => {
  const polls = await receivesLive({ enableLongPolling: false, callbackInterval: 300 }, "/polling");
  assert.ok(polls.length >= 2, "several polls");
  assert.ok(polls.every((p) => p.url.includes("?dlp=t") && p.dontChunk === "true"));
});

test("targeted messages reach only their user", async () => {
  const pages = {};
  const contexts = [];
  for (const user of ["1", "2"]) {
    const context = await browser.newContext();
    contexts.push(context);
    await context.addCookies([{ name: "user_id", value: user, url: server.url }]);
    pages[user] = await clientPage(context, server.url);
    await subscribe(pages[user], "/private");
  }
  await server.publish("/private", { to: "user 1" }, { user_ids: [1] });
  await server.publish("/private", { to: "user 2" }, { user_ids: [2] });
  await server.publish("/private", { to: "users 2 and 3" }, { user_ids: [2, 3] });
  await server.publish("/private", { to: "everyone" });
  // A page that saw "everyone" has seen everything published before it that was meant for it.
  const one = await waitForReceived(pages["1"], "/private", 2);
  const two = await waitForReceived(pages["2"], "/private", 3);
  await new Promise((resolve) => setTimeout(resolve, 300));
  assert.deepEqual((await pages["1"].evaluate(() => window.received["/private"])).map((m) => m.data.to),
    ["user 1", "everyone"]);
  assert.deepEqual((await pages["2"].evaluate(() => window.received["/private"])).map((m) => m.data.to),
    ["user 2", "users 2 and 3", "everyone"]);
  assert.equal(one.length + two.length, 5);
  // A user with no cookie sees only the public message, also from the backlog.
  const anonymous = await browser.newContext();
  contexts.push(anonymous);
  const page = await clientPage(anonymous, server.url);
  await subscribe(page, "/private", 0);
  const seen = await waitForReceived(page, "/private", 1);
  await new Promise((resolve) => setTimeout(resolve, 300));
  assert.deepEqual((await page.evaluate(() => window.received["/private"])).map((m) => m.data.to), ["everyone"]);
  assert.equal(seen.length, 1);
  await Promise.all(contexts.map((c) => c.close()));
});
