// Driven by test/rails/rails_app_test.rb (check_turbo_drive_subscription): the README's page example
// (<%= herald_subscribe %>) in a default Rails app (importmap-rails, Turbo). Opens /feed, makes 10 Turbo Drive
// visits (no full page load: a marker set before them survives), prints "ready"; after a line on stdin, waits
// for what was published and prints what the page shows as one line of JSON. Screenshot to argv[3].
import { createInterface } from "node:readline";
import { join } from "node:path";
import { launchBrowser } from "../browser/helpers.mjs";

const [url, artifacts] = process.argv.slice(2);
const browser = await launchBrowser();
try {
  const page = await (await browser.newContext()).newPage();
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  await page.goto(`${url}/feed`);
  await page.waitForFunction(() => window.Turbo && customElements.get("herald-subscription") && window.MessageBus.herald);
  await page.evaluate(() => { window.marker = "no full load"; });
  for (let v = 1; v <= 10; v++) {
    await page.evaluate((v) => new Promise((resolve) => {
      document.addEventListener("turbo:load", resolve, { once: true });
      window.Turbo.visit(`/feed?v=${v}`);
    }), v);
  }
  await page.waitForFunction(() => document.querySelector("h1").textContent === "Feed, visit 10");
  await new Promise((resolve) => setTimeout(resolve, 1000)); // the client's request names the new subscription
  console.log("ready");
  const lines = createInterface({ input: process.stdin });
  await lines[Symbol.asyncIterator]().next();
  await page.waitForFunction(() => document.querySelectorAll("#chat li").length >= 1, null, { timeout: 20000 }).catch(() => {});
  await new Promise((resolve) => setTimeout(resolve, 1500)); // duplicates would come now
  await page.screenshot({ path: join(artifacts, "rails-turbo-drive-feed.png") });
  const state = await page.evaluate(() => ({
    items: [...document.querySelectorAll("#chat li")].map((li) => li.textContent),
    marker: window.marker ?? null,
    subscriptions: document.querySelectorAll("herald-subscription").length,
    channels: Object.keys(window.MessageBus.herald.lastIds()),
  }));
  console.log(JSON.stringify({ ...state, errors }));
} finally {
  await browser.close();
}
