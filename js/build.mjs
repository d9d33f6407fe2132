// Builds the package: `tsc` (ESM + .d.ts in dist/) and one minified classic script, dist/herald.js
// (window.Herald, window.MessageBus), which Herald's middleware serves at {base}message-bus/herald.js.
// The gem ships a copy: lib/herald/rack/herald.js. `node build.mjs --check` fails if that copy is stale.
import { execFileSync } from "node:child_process";
import { readFileSync, writeFileSync, existsSync, copyFileSync } from "node:fs";
import { gzipSync } from "node:zlib";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";

const here = dirname(fileURLToPath(import.meta.url));
const gemCopy = join(here, "..", "lib", "herald", "rack", "herald.js");
const check = process.argv.includes("--check");

execFileSync(process.execPath, [join(here, "..", "node_modules", "typescript", "bin", "tsc"), "-p", here], { stdio: "inherit" });
await build({
  entryPoints: [join(here, "src", "global.ts")],
  outfile: join(here, "dist", "herald.js"),
  bundle: true,
  minify: true,
  format: "iife",
  target: "es2020",
  legalComments: "none",
  banner: { js: "/* Herald browser client (js/ in the Herald repository), MIT */" },
});
const built = readFileSync(join(here, "dist", "herald.js"));
const gzip = gzipSync(built, { level: 9 }).length;
console.log(`dist/herald.js: ${built.length} bytes, ${gzip} gzip`);
// The budget for the served client, decoder included (issue 13).
const BUDGET = 8192;
if (gzip > BUDGET) {
  console.error(`dist/herald.js is ${gzip} bytes gzip, over the ${BUDGET}-byte budget`);
  process.exit(1);
}
if (check) {
  if (!existsSync(gemCopy) || !readFileSync(gemCopy).equals(built)) {
    console.error(`${gemCopy} is stale: run \`npm run build -w js\` and commit it`);
    process.exit(1);
  }
} else {
  copyFileSync(join(here, "dist", "herald.js"), gemCopy);
}
