// Driven by test/rails/rails_app_test.rb: Herald::Web mounted at /herald in a Rails app (Puma cluster), each
// page opened in headless Chromium as an operator would, with a screenshot of each in argv[3]. Prints one
// line of JSON: each page's HTTP status and visible text, and the browser's console errors.
import { join } from "node:path";
import { launchBrowser } from "../browser/helpers.mjs";

const [url, artifacts] = process.argv.slice(2);
const browser = await launchBrowser();
try {
  const page = await (await browser.newContext({ viewport: { width: 1200, height: 900 } })).newPage();
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  page.on("response", (r) => { if (r.status() >= 400) errors.push(`${r.status()} ${r.url()}`); });
  const pages = {};
  for (const name of ["subscribers", "dead", "channels", "store"]) {
    const response = await page.goto(`${url}/herald/${name}`);
    pages[name] = { status: response.status(), text: await page.innerText("body") };
    await page.screenshot({ path: join(artifacts, `dashboard-${name}.png`), fullPage: true });
  }
  console.log(JSON.stringify({ pages, errors }));
} finally {
  await browser.close();
}
