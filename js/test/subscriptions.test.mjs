// Id bookkeeping: what the next request asks for, repeats dropped, /__status moving positions, a store
// reset (ids going backwards) reported, lookbehind, callbacks that throw.
import { test } from "node:test";
import assert from "node:assert/strict";
import { Subscriptions } from "../dist/subscriptions.js";

const m = (channel, id, data = id) => ({ global_id: id * 10, message_id: id, channel, data });
const status = (positions) => ({ global_id: -1, message_id: -1, channel: "/__status", data: positions });

function setup() {
  const subs = new Subscriptions();
  const got = [];
  const resets = [];
  subs.onReset = (e) => resets.push(e);
  return { subs, got, resets, cb: (tag) => (data, msg) => got.push([tag, msg.channel, msg.message_id, data]) };
}

test("a new subscription asks from now (-1) and the status sets its position", () => {
  const { subs, got, cb } = setup();
  subs.add("/a", cb("x"));
  assert.deepEqual([...subs.request()], [["/a", -1]]);
  subs.deliver(status({ "/a": 41 }));
  assert.deepEqual([...subs.request()], [["/a", 41]]);
  subs.deliver(m("/a", 42));
  assert.deepEqual(got, [["x", "/a", 42, 42]]);
  assert.deepEqual([...subs.request()], [["/a", 42]]);
});

test("repeats are dropped: a resumed stream re-sending what was delivered delivers nothing twice", () => {
  const { subs, got, cb } = setup();
  subs.add("/a", cb("x"), 0);
  for (const id of [1, 2, 3, 2, 3, 1, 4, 4, 5]) subs.deliver(m("/a", id));
  assert.deepEqual(got.map((g) => g[2]), [1, 2, 3, 4, 5]);
});

test("messages for other channels and malformed entries are ignored", () => {
  const { subs, got, cb } = setup();
  subs.add("/a", cb("x"), 0);
  subs.deliver(m("/b", 1));
  subs.deliver(null);
  subs.deliver("junk");
  subs.deliver(status(null));
  assert.deepEqual(got, []);
});

test("two subscriptions on a channel: the request asks from the lower id; each gets only what it has not seen", () => {
  const { subs, got, cb } = setup();
  subs.add("/a", cb("low"), 2);
  subs.add("/a", cb("high"), 4);
  assert.deepEqual([...subs.request()], [["/a", 2]]);
  for (const id of [3, 4, 5]) subs.deliver(m("/a", id));
  assert.deepEqual(got.map((g) => `${g[0]}${g[2]}`), ["low3", "low4", "low5", "high5"]);
  assert.deepEqual(got.filter((g) => g[0] === "high").map((g) => g[2]), [5]);
  assert.deepEqual(got.filter((g) => g[0] === "low").map((g) => g[2]), [3, 4, 5]);
});

test("'from now' on a channel whose position is known starts at that position", () => {
  const { subs, got, cb } = setup();
  subs.add("/a", cb("first"), 7);
  subs.add("/a", cb("late"));
  assert.deepEqual([...subs.request()], [["/a", 7]]);
  subs.deliver(m("/a", 8));
  assert.deepEqual(got.map((g) => g[0]), ["first", "late"]);
});

test("lookbehind: -3 is sent as is and the replies go through", () => {
  const { subs, got, cb } = setup();
  subs.add("/a", cb("x"), -3);
  assert.deepEqual([...subs.request()], [["/a", -3]]);
  subs.deliver(m("/a", 9));
  subs.deliver(m("/a", 10));
  assert.deepEqual(got.map((g) => g[2]), [9, 10]);
});

test("a status below what was received is a store reset: reported once per channel, then resumed from there", () => {
  const { subs, got, resets, cb } = setup();
  subs.add("/a", cb("x"), 0);
  subs.add("/a", cb("y"), 0);
  subs.add("/b", cb("z"), 0);
  for (const id of [1, 2, 3]) subs.deliver(m("/a", id));
  subs.deliver(m("/b", 1));
  subs.deliver(status({ "/a": 1, "/b": 1 }));
  assert.deepEqual(resets, [{ channel: "/a", lastId: 3, serverLastId: 1 }]);
  assert.deepEqual([...subs.request()], [["/a", 1], ["/b", 1]]);
  subs.deliver(m("/a", 2, "after reset"));
  assert.deepEqual(got.slice(-2).map((g) => g[3]), ["after reset", "after reset"]);
});

test("a status above the position (messages withheld from this user) moves past them silently", () => {
  const { subs, resets, cb } = setup();
  subs.add("/a", cb("x"), 3);
  subs.deliver(status({ "/a": 9 }));
  assert.deepEqual(resets, []);
  assert.deepEqual([...subs.request()], [["/a", 9]]);
});

test("a callback that throws is reported and the others still run", () => {
  const { subs, got, cb } = setup();
  const errors = [];
  subs.onCallbackError = (e) => errors.push(e.message);
  subs.add("/a", () => { throw new Error("boom"); }, 0);
  subs.add("/a", cb("ok"), 0);
  subs.deliver(m("/a", 1));
  assert.deepEqual(errors, ["boom"]);
  assert.equal(got.length, 1);
});

test("remove: the channel leaves the request when its last subscription goes", () => {
  const { subs, cb } = setup();
  const a = subs.add("/a", cb("x"), 0);
  const b = subs.add("/a", cb("y"), 0);
  assert.equal(subs.remove(a), true);
  assert.equal(subs.remove(a), false);
  assert.equal(subs.size, 1);
  subs.remove(b);
  assert.equal(subs.size, 0);
  assert.deepEqual([...subs.request()], []);
  assert.throws(() => subs.add("", cb("x")), TypeError);
  assert.throws(() => subs.add("/a", cb("x"), 1.5), TypeError);
});

test("a new store epoch: the reply is refused, every channel asks from now, and the reset is reported with the new position", () => {
  const subs = new Subscriptions();
  const resets = [];
  subs.onReset = (e) => resets.push(e);
  const got = [];
  subs.add("/a", (d) => got.push(d), 0);
  subs.add("/b", (d) => got.push(d), -1);
  assert.equal(subs.checkEpoch(null), true, "no epoch named (JSON, message_bus): nothing to compare");
  assert.equal(subs.checkEpoch("e1"), true, "the first epoch seen");
  subs.deliver({ global_id: 9, message_id: 5, channel: "/a", data: "five" });
  assert.equal(subs.checkEpoch("e1"), true);
  assert.equal(subs.checkEpoch("e2"), false, "another store");
  assert.deepEqual([...subs.request()], [["/a", -1], ["/b", -1]]);
  assert.deepEqual(resets, [], "reported once the new position is known");
  subs.deliver({ global_id: -1, message_id: -1, channel: "/__status", data: { "/a": 7, "/b": 2 } });
  assert.deepEqual(resets, [{ channel: "/a", lastId: 5, serverLastId: 7 }]);
  subs.deliver({ global_id: 20, message_id: 7, channel: "/a", data: "old seven" });
  subs.deliver({ global_id: 21, message_id: 8, channel: "/a", data: "eight" });
  assert.deepEqual(got, ["five", "eight"]);
  assert.equal(subs.epoch, "e2");
});
