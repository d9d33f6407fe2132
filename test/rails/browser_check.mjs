// Driven by test/rails/rails_app_test.rb: two signed-in users on a Rails app's page in headless Chromium.
// Prints "ready" once both pages are polling, then, after a line on stdin, waits for what the Ruby side
// published and prints what each page received as one line of JSON. Screenshots go to argv[3].
import { createInterface } from "node:readline";
import { join } from "node:path";
import { launchBrowser } from "../browser/helpers.mjs";

const [url, artifacts, label] = process.argv.slice(2);
const browser = await launchBrowser();
try {
  const pages = {};
  for (const user of ["1", "2"]) {
    const page = await (await browser.newContext()).newPage();
    await page.goto(`${url}/login/${user}`);
    await page.waitForFunction(() => Array.isArray(window.received));
    pages[user] = page;
  }
  await new Promise((resolve) => setTimeout(resolve, 500));
  console.log("ready");
  const lines = createInterface({ input: process.stdin });
  const expected = JSON.parse((await lines[Symbol.asyncIterator]().next()).value);
  const deadline = Date.now() + 20000;
  const received = async (user) => pages[user].evaluate(() => window.received);
  while (Date.now() < deadline) {
    const one = await received("1");
    const two = await received("2");
    if (one.length >= expected["1"] && two.length >= expected["2"]) break;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  await new Promise((resolve) => setTimeout(resolve, 1000)); // anything the other user must not get
  for (const user of ["1", "2"]) await pages[user].screenshot({ path: join(artifacts, `rails-${label}-user${user}.png`) });
  console.log(JSON.stringify({ 1: await received("1"), 2: await received("2") }));
} finally {
  await browser.close();
}
