// Full-jitter backoff: every wait in [0, min(cap, base * 2^attempt)), reaching the cap and no further;
// Retry-After in seconds and as an HTTP date.
import { test } from "node:test";
import assert from "node:assert/strict";
import { Backoff, retryAfter } from "../dist/backoff.js";

test("the ceiling doubles per failure up to the cap; the wait is uniform below it", () => {
  const top = new Backoff({ base: 100, cap: 1000, random: () => 0.999999 });
  assert.deepEqual(Array.from({ length: 7 }, () => top.next()), [99, 199, 399, 799, 999, 999, 999]);
  const bottom = new Backoff({ base: 100, cap: 1000, random: () => 0 });
  assert.deepEqual(Array.from({ length: 3 }, () => bottom.next()), [0, 0, 0]);
  top.reset();
  assert.equal(top.next(), 99);
});

test("with Math.random the waits spread over the whole range (full jitter, not equal jitter)", () => {
  const waits = Array.from({ length: 2000 }, () => {
    const b = new Backoff({ base: 1000, cap: 1000 });
    return b.next();
  });
  assert.ok(Math.min(...waits) < 100, "some waits are near 0");
  assert.ok(Math.max(...waits) > 900, "some are near the cap");
  assert.ok(waits.every((w) => w >= 0 && w < 1000));
  const mean = waits.reduce((a, b) => a + b, 0) / waits.length;
  assert.ok(mean > 400 && mean < 600, `mean ${mean}`);
});

test("many attempts never overflow past the cap", () => {
  const b = new Backoff({ base: 500, cap: 30000, random: () => 0.5 });
  for (let i = 0; i < 2000; i++) assert.ok(b.next() <= 15000);
});

test("Retry-After: seconds, an HTTP date, garbage, and a floor", () => {
  assert.equal(retryAfter("3", 15000), 3000);
  assert.equal(retryAfter(" 0 ", 15000, 100), 100);
  const now = Date.parse("2026-01-01T00:00:00Z");
  assert.equal(retryAfter("Thu, 01 Jan 2026 00:00:10 GMT", 15000, 0, now), 10000);
  assert.equal(retryAfter("soon", 15000), 15000);
  assert.equal(retryAfter(null, 15000), 15000);
});
