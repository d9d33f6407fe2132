// The demo page of `herald server` in headless Chromium: a message published from the command line
// (`exe/herald publish`, another process writing the same log) appears on the page, and so does one
// sent with the page's own form. Leaves a screenshot in test/artifacts/demo-page.png.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { startServer, launchBrowser, ROOT, IMPL } from "./helpers.mjs";

let server;
let browser;

before(async () => {
  if (IMPL !== "herald") return;
  [server, browser] = await Promise.all([startServer({ real: true }), launchBrowser()]);
});

after(async () => {
  await browser?.close();
  if (!server) return;
  const exit = await server.stop();
  assert.equal(exit?.code, 0, "herald server should exit cleanly on SIGTERM");
});

test("the demo page shows messages from the command line and from its form", { skip: IMPL !== "herald" && "needs herald server (HERALD_TEST_IMPL)" }, async () => {
  const context = await browser.newContext({ viewport: { width: 900, height: 640 } });
  const page = await context.newPage();
  const firstPoll = page.waitForResponse((r) => r.url().includes("/message-bus/") && r.url().includes("/poll"));
  await page.goto(server.url);
  await firstPoll;
  assert.equal(await page.title(), "Herald live demo");
  // The page is written for MessageBus; Herald's client provides it, streaming MessagePack.
  assert.equal(await page.evaluate(() => window.MessageBus.herald?.transport), "stream");
  assert.equal((await firstPoll).headers()["content-type"], "application/vnd.msgpack");

  const text = `hello from the command line ${Date.now()}`;
  const id = await server.cliPublish("/chat", { text });
  assert.ok(id >= 1);
  const item = page.locator("#messages li", { hasText: text });
  await item.waitFor({ timeout: 10000 });
  assert.equal(await item.getAttribute("data-message-id"), String(id));

  await page.fill("#name", "ada");
  await page.fill("#text", "sent with the form");
  await page.click("button[type=submit]");
  const mine = page.locator("#messages li", { hasText: "sent with the form" });
  await mine.waitFor({ timeout: 10000 });
  assert.match(await mine.textContent(), /ada/);
  assert.equal(await page.inputValue("#text"), "");

  const items = await page.locator("#messages li").allTextContents();
  assert.equal(items.length, 2, `exactly the two messages: ${items}`);
  mkdirSync(join(ROOT, "test/artifacts"), { recursive: true });
  await page.screenshot({ path: join(ROOT, "test/artifacts/demo-page.png"), fullPage: true });
  await context.close();
});
