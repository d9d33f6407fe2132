// The dashboard (Herald::Web, mounted at /herald by `herald server`'s demo) in headless Chromium, with real
// data written by another process (test/browser/dashboard_worker.rb: deferred subscribers, dead letters):
// each page renders (screenshots in tmp/dashboard/), user values stay text, Pause/Resume and Delete work
// through the forms (CSRF token), and the live tail shows a message published by another process
// (`herald publish`) within 1 s.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { startServer, launchBrowser, ROOT, IMPL } from "./helpers.mjs";

const SHOTS = join(ROOT, "tmp/dashboard");
let server;
let browser;
let worker;

before(async () => {
  if (IMPL !== "herald") return;
  [server, browser] = await Promise.all([startServer({ real: true }), launchBrowser()]);
  worker = spawn("bundle", ["exec", "ruby", join(ROOT, "test/browser/dashboard_worker.rb"), server.dir], { cwd: ROOT, stdio: ["ignore", "pipe", "pipe"] });
  let output = "";
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`worker not ready: ${output}`)), 30000);
    const onData = (chunk) => { output += chunk; if (output.includes("ready")) { clearTimeout(timer); resolve(); } };
    worker.stdout.on("data", onData);
    worker.stderr.on("data", (chunk) => { output += chunk; });
    worker.on("exit", (code) => { clearTimeout(timer); reject(new Error(`worker exited ${code}: ${output}`)); });
  });
  mkdirSync(SHOTS, { recursive: true });
});

after(async () => {
  if (worker) { worker.removeAllListeners("exit"); worker.kill("SIGTERM"); }
  await browser?.close();
  await server?.stop();
});

const skip = IMPL !== "herald" && "needs herald server (HERALD_TEST_IMPL)";

async function open(path) {
  const context = await browser.newContext({ viewport: { width: 1200, height: 700 } });
  const page = await context.newPage();
  page.on("dialog", (dialog) => {
    if (dialog.type() === "confirm") return dialog.accept();
    throw new Error(`unexpected ${dialog.type()}: ${dialog.message()}`); // an alert() would be injected script
  });
  const errors = [];
  page.on("pageerror", (error) => errors.push(error));
  const response = await page.goto(`${server.url}/herald${path}`);
  assert.equal(response.status(), 200, path);
  return { page, context, errors };
}

test("every page renders real data, escaped", { skip }, async () => {
  const pages = {
    subscribers: ["/subscribers", ["Mailer", "Lease holder", "running"]],
    dead: ["/dead", ["DeliveryFailed", "SMTP 451 for <user0@example.com>", "dead letters"]],
    channels: ["/channels", ["/orders", "/chat <script>alert(1)</script>"]],
    channel: ["/channel?name=%2Fchat+%3Cscript%3Ealert%281%29%3C%2Fscript%3E", ["<img src=x onerror=alert(1)> 日本語 🎉", "Live tail"]],
    store: ["/store", ["epoch", "segments", "fsync", "free disk bytes"]],
  };
  for (const [name, [path, texts]] of Object.entries(pages)) {
    const { page, context, errors } = await open(path);
    const text = await page.locator("main").innerText();
    for (const t of texts) assert.ok(text.includes(t), `${name}: ${t} in ${text.slice(0, 600)}`);
    assert.equal(await page.locator("main script:not([src])").count() <= 1, true, "only the tail's own script");
    assert.equal(await page.locator("img").count(), 0, "a payload's <img> stays text");
    await page.screenshot({ path: join(SHOTS, `${name}.png`), fullPage: true });
    if (name === "dead") await page.screenshot({ path: join(SHOTS, "readme.png"), clip: { x: 0, y: 0, width: 1200, height: 400 } });
    assert.deepEqual(errors, [], `${name}: no script errors`);
    await context.close();
  }
});

test("pause, resume and delete through the forms", { skip }, async () => {
  const { page, context } = await open("/subscribers");
  const mailer = page.locator("tr[data-subscriber=Mailer]");
  await mailer.locator("button", { hasText: "Pause" }).click();
  await page.locator(".notice", { hasText: "Paused Mailer" }).waitFor();
  assert.match(await page.locator("tr[data-subscriber=Mailer]").innerText(), /paused/);
  await page.locator("tr[data-subscriber=Mailer] button", { hasText: "Resume" }).click();
  await page.locator(".notice", { hasText: "Resumed Mailer" }).waitFor();
  await page.goto(`${server.url}/herald/dead?subscriber=Mailer`);
  const before = Number((await page.locator("form.bar .muted").innerText()).match(/(\d+) dead letters/)[1]);
  await page.locator("tr[data-letter] button", { hasText: "Delete" }).first().click();
  await page.locator(".notice", { hasText: "Deleted 1 dead letters" }).waitFor();
  const afterCount = Number((await page.locator("form.bar .muted").innerText()).match(/(\d+) dead letters/)[1]);
  assert.equal(afterCount, before - 1);
  await context.close();
});

test("the live tail shows a message published by another process within 1 s", { skip }, async () => {
  const { page, context } = await open("/channel?name=%2Ftail");
  await page.waitForResponse((r) => r.url().includes("/message-bus/"));
  await new Promise((resolve) => setTimeout(resolve, 300));
  const text = `from another process <b>${Date.now()}</b>`;
  const id = await server.cliPublish("/tail", { text });
  const published = Date.now();
  const row = page.locator("#tail tr", { hasText: text });
  await row.waitFor({ timeout: 1000 });
  const shown = Date.now() - published;
  console.log(`live tail: message ${id} shown ${shown} ms after \`herald publish\` returned`);
  assert.equal(await page.locator("#tail b").count(), 0, "shown as text");
  await page.screenshot({ path: join(SHOTS, "tail.png"), fullPage: true });
  await context.close();
});
