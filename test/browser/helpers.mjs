// Shared by the browser tests: start a server in a child process, drive Debian's Chromium with
// playwright-core. HERALD_TEST_IMPL=message_bus runs the same tests against message_bus's middleware.
import { spawn, execFile } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { chromium } from "playwright-core";

export const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
export const IMPL = process.env.HERALD_TEST_IMPL || "herald";
const CHROMIUM = process.env.CHROMIUM_PATH || "/usr/bin/chromium";

// `real: true` runs the real `exe/herald server`; otherwise test/support/http_server.rb, which adds a
// test-only targeted-publish route and a cookie user id lookup.
// `port` and `dir` restart a server where a stopped one was (stop({ keepDir: true }) keeps its log).
export async function startServer({ real = false, userCookie, impl = IMPL, port: askedPort = 0, dir: askedDir, maxClients, longPollMs } = {}) {
  const dir = askedDir || mkdtempSync(join(tmpdir(), "herald-browser-"));
  const args = real && impl === "herald"
    ? ["exec", "ruby", join(ROOT, "exe/herald"), "server", "--port", String(askedPort), "--dir", dir]
    : ["exec", "ruby", join(ROOT, "test/support/http_server.rb"), "--impl", impl, "--port", String(askedPort), "--dir", dir,
      ...(userCookie ? ["--user-cookie", userCookie] : []), ...(maxClients !== undefined ? ["--max-clients", String(maxClients)] : []),
      ...(longPollMs !== undefined ? ["--long-poll-ms", String(longPollMs)] : [])];
  const child = spawn("bundle", args, { cwd: ROOT, stdio: ["ignore", "pipe", "pipe"] });
  let output = "";
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`server did not start: ${output}`)), 30000);
    const onData = (chunk) => {
      output += chunk;
      const match = output.match(/listening (?:on http:\/\/[\d.]+:)?(\d+)/);
      if (match) { clearTimeout(timer); resolve(Number(match[1])); }
    };
    child.stdout.on("data", onData);
    child.stderr.on("data", onData);
    child.on("exit", (code) => { clearTimeout(timer); reject(new Error(`server exited ${code}: ${output}`)); });
  });
  const url = `http://127.0.0.1:${port}`;
  return {
    url,
    port,
    dir,
    child,
    output: () => output,
    async publish(channel, data, targets = {}) {
      const response = await fetch(`${url}/test/publish`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ channel, data, ...targets }),
      });
      if (response.status !== 201) throw new Error(`publish: ${response.status} ${await response.text()}`);
      return (await response.json()).message_id;
    },
    // `herald publish` from the command line, in another process, on the server's log directory.
    async cliPublish(channel, data) {
      const { stdout } = await promisify(execFile)("bundle",
        ["exec", "ruby", join(ROOT, "exe/herald"), "publish", channel, JSON.stringify(data), "--dir", dir],
        { cwd: ROOT });
      return Number(stdout.trim());
    },
    async stop({ signal = "SIGTERM", keepDir = false } = {}) {
      // Drop the start-up listener first: removing it after registering this one would drop this one too
      // (and the exit status would never be seen).
      child.removeAllListeners("exit");
      const exited = child.exitCode !== null || child.signalCode !== null
        ? Promise.resolve({ code: child.exitCode, signal: child.signalCode })
        : new Promise((resolve) => child.once("exit", (code, signal) => resolve({ code, signal })));
      child.kill(signal);
      const result = await exited;
      if (!keepDir) rmSync(dir, { recursive: true, force: true });
      return result;
    },
  };
}

export async function launchBrowser() {
  const args = process.getuid && process.getuid() === 0 ? ["--no-sandbox"] : [];
  return chromium.launch({ executablePath: CHROMIUM, headless: true, args });
}

// A page on the server's origin with message_bus's JS client (from node_modules, as served by the
// server) and our ajax adapter loaded, and `window.received` collecting what a subscription gets.
export async function clientPage(context, url, settings = {}) {
  const page = await context.newPage();
  page.on("pageerror", (error) => console.error("page error:", error));
  await page.goto(`${url}/blank`);
  await page.addScriptTag({ url: "/assets/message-bus.js" });
  await page.addScriptTag({ url: "/assets/message-bus-ajax.js" });
  await page.evaluate((settings) => {
    Object.assign(window.MessageBus, settings);
    window.received = {};
  }, settings);
  return page;
}

// Subscribes and waits for the reply to the first poll (the client starts polling 0.5-1 s after its
// first subscribe): from then on the client's position is known to the server.
export async function subscribe(page, channel, lastId = -1) {
  const firstReply = page.waitForResponse((r) => r.url().includes("/message-bus/"), { timeout: 10000 });
  await page.evaluate(([channel, lastId]) => {
    window.received[channel] = [];
    window.MessageBus.subscribe(channel, (data, globalId, messageId) => {
      window.received[channel].push({ data, globalId, messageId });
    }, lastId);
  }, [channel, lastId]);
  await firstReply;
  await new Promise((resolve) => setTimeout(resolve, 200));
}

export async function waitForReceived(page, channel, count, timeout = 10000) {
  await page.waitForFunction(([channel, count]) => (window.received[channel] || []).length >= count,
    [channel, count], { timeout, polling: 50 });
  return page.evaluate((channel) => window.received[channel], channel);
}
