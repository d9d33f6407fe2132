// Driven by test/rails/rails_app_test.rb: Turbo Streams pages (turbo_stream_from "room") in headless Chromium,
// on a Rails app under a Puma cluster with `adapter: herald`. Commands, one per line on stdin:
//   open            opens one more page (its own browser context: its own WebSocket), waits until its
//                   turbo-cable-stream-source is connected; prints "opened <pid of the worker that rendered it>"
//   expect <json>   {"ids": [...]}: waits until every page shows an element for each id, prints one line of JSON:
//                   per page, how many such elements, the first one's text length (UTF-16 units) and its text
//                   when short (up to 100 units: a slice of a longer one could split a surrogate pair)
// Screenshots of the pages go to argv[3].
import { createInterface } from "node:readline";
import { join } from "node:path";
import { launchBrowser } from "../browser/helpers.mjs";

const [url, artifacts, label] = process.argv.slice(2);
const browser = await launchBrowser();
const pages = [];
try {
  for await (const line of createInterface({ input: process.stdin })) {
    const [command, ...rest] = line.split(" ");
    if (command === "open") {
      const page = await (await browser.newContext()).newPage();
      await page.goto(`${url}/turbo`);
      await page.waitForSelector("turbo-cable-stream-source[connected]", { state: "attached", timeout: 30000 });
      pages.push(page);
      console.log(`opened ${await page.textContent("#pid")}`);
    } else if (command === "expect") {
      const { ids } = JSON.parse(rest.join(" "));
      const seen = (page) => page.evaluate((ids) => ids.map((id) => {
        const found = document.querySelectorAll(`#messages [id="${id}"]`);
        const text = found.length ? found[0].textContent : "";
        return { id, count: found.length, length: text.length, text: text.length <= 100 ? text : null };
      }), ids);
      const deadline = Date.now() + 30000;
      while (Date.now() < deadline) {
        const all = await Promise.all(pages.map(seen));
        if (all.every((items) => items.every((item) => item.count > 0))) break;
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
      await new Promise((resolve) => setTimeout(resolve, 500)); // a duplicate would come now
      for (const [i, page] of pages.entries()) await page.screenshot({ path: join(artifacts, `rails-${label}-turbo${i + 1}.png`) });
      console.log(JSON.stringify(await Promise.all(pages.map(async (page) => ({ pid: await page.textContent("#pid"), items: await seen(page) })))));
    }
  }
} finally {
  await browser.close();
}
