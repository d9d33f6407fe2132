// <herald-subscription> in headless Chromium, on `herald server`'s page: the body replaced 10 times as Turbo
// Drive replaces it on each visit (the old element leaves, a new one arrives), then one publish from the
// command line is shown once. Turbo itself drives the same page in the Rails app test (test/rails/feed_check.mjs).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { startServer, launchBrowser, IMPL } from "./helpers.mjs";

let server;
let browser;
const CHANNEL = "/drive/é 🎉";

before(async () => {
  if (IMPL !== "herald") return;
  [server, browser] = await Promise.all([startServer({ real: true }), launchBrowser()]);
});

after(async () => {
  await browser?.close();
  await server?.stop();
});

test("10 body swaps, then one publish shown once", { skip: IMPL !== "herald" && "needs herald server (HERALD_TEST_IMPL)" }, async () => {
  const page = await (await browser.newContext()).newPage();
  await page.goto(server.url);
  await page.waitForFunction(() => customElements.get("herald-subscription"));
  for (let visit = 1; visit <= 10; visit++) {
    await page.evaluate(([visit, channel]) => {
      const body = document.createElement("body");
      body.innerHTML = `<h1>visit ${visit}</h1><ul id="feed"></ul><herald-subscription id="sub"></herald-subscription>`;
      body.querySelector("#sub").setAttribute("channel", channel);
      document.documentElement.replaceChild(body, document.body);
      document.getElementById("sub").addEventListener("herald:message", ({ detail }) => {
        const li = document.createElement("li");
        li.textContent = `${detail.channel} ${detail.messageId} ${detail.data.text}`;
        document.getElementById("feed").append(li);
      });
    }, [visit, CHANNEL]);
  }
  assert.equal(await page.evaluate(() => document.querySelectorAll("herald-subscription").length), 1);
  await new Promise((resolve) => setTimeout(resolve, 1000)); // the client's next request names the channel
  const id = await server.cliPublish(CHANNEL, { text: "once ✓ 日本語" });
  await page.locator("#feed li").first().waitFor({ timeout: 10000 });
  await new Promise((resolve) => setTimeout(resolve, 1500)); // duplicates would come now
  assert.deepEqual(await page.locator("#feed li").allTextContents(), [`${CHANNEL} ${id} once ✓ 日本語`]);
  // Removed for good: the client lets go of the channel.
  await page.evaluate(() => document.getElementById("sub").remove());
  assert.equal(await page.evaluate((c) => c in window.MessageBus.herald.lastIds(), CHANNEL), false);
});
