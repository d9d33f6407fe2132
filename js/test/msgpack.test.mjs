// The MessagePack decoder against @msgpack/msgpack's encoder (a different implementation): every type
// family at its size boundaries, real text (non-ASCII, emoji, NUL, invalid UTF-8), every prefix of a
// value reported incomplete, and a randomized round trip (SEED=n replays it).
import { test } from "node:test";
import assert from "node:assert/strict";
import { encode } from "@msgpack/msgpack";
import { Decoder, INCOMPLETE, ExtValue } from "../dist/msgpack.js";
import { seeded } from "./random.mjs";

const decoder = new Decoder();
const decode = (bytes) => {
  const value = decoder.decode(bytes, 0, bytes.length);
  assert.equal(decoder.end, bytes.length, "the whole value is read");
  return value;
};

const samples = [
  0, 1, 127, 128, 255, 256, 65535, 65536, 2 ** 32 - 1, 2 ** 32, 2 ** 53 - 1,
  -1, -32, -33, -128, -129, -32768, -32769, -(2 ** 31), -(2 ** 31) - 1, -(2 ** 53) + 1,
  0.5, -1.25, 1e300, Number.MIN_VALUE, Infinity, -Infinity,
  null, true, false,
  "", "a", "x".repeat(31), "x".repeat(32), "x".repeat(48), "x".repeat(49), "x".repeat(255), "x".repeat(256), "y".repeat(70000),
  "héllo wörld", "日本語のテキスト", "emoji 🎉👩‍👩‍👧 done", "\u0000nul\u0000", "\r\n|\r\n", "\uffff\u0800\u07ff\u0080",
  "🎉".repeat(40), "ü".repeat(100),
  [], [1, [2, [3, []]]], new Array(16).fill(7), new Array(70000).fill(1),
  {}, { a: 1, b: { c: [1, "two", null] } }, Object.fromEntries(Array.from({ length: 20 }, (_, i) => [`k${i}`, i])),
  { global_id: 5, message_id: 3, channel: "/chat", data: { text: "hi ✓", name: "ada" } },
];

test("decodes what @msgpack/msgpack encodes, at every size boundary", () => {
  for (const value of samples) assert.deepEqual(decode(encode(value)), value, JSON.stringify(value)?.slice(0, 60));
});

test("float32, binary, timestamps and other extensions", () => {
  assert.equal(decode(Uint8Array.of(0xca, 0x3f, 0xc0, 0x00, 0x00)), 1.5);
  const bin = Uint8Array.from({ length: 300 }, (_, i) => i & 0xff);
  assert.deepEqual(decode(encode(bin)), bin);
  assert.deepEqual(decode(encode(new Uint8Array(0))), new Uint8Array(0));
  for (const date of [new Date(0), new Date(1700000000000), new Date(1700000000123), new Date(-1000), new Date(2 ** 35 * 1000)]) {
    assert.equal(decode(encode(date)).getTime(), date.getTime());
  }
  const ext = decode(Uint8Array.of(0xd5, 0x07, 0xab, 0xcd));
  assert.ok(ext instanceof ExtValue);
  assert.equal(ext.type, 7);
  assert.deepEqual(ext.data, Uint8Array.of(0xab, 0xcd));
});

test("uint64 and int64 become Numbers", () => {
  assert.equal(decode(Uint8Array.of(0xcf, 0, 0, 0, 1, 0, 0, 0, 2)), 2 ** 32 + 2);
  assert.equal(decode(Uint8Array.of(0xd3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe)), -2);
});

test("invalid UTF-8 decodes as TextDecoder does (U+FFFD), short and long", () => {
  for (const bytes of [[0xff], [0x61, 0xc3], [0xed, 0xa0, 0x80], [0xf4, 0x90, 0x80, 0x80], [0xc0, 0xaf], new Array(60).fill(0xfe)]) {
    const packed = Uint8Array.of(0xd9, bytes.length, ...bytes);
    assert.equal(decode(packed), new TextDecoder().decode(Uint8Array.from(bytes)));
  }
});

test("a __proto__ key is data, not the prototype", () => {
  const packed = Uint8Array.of(0x81, 0xa9, ...new TextEncoder().encode("__proto__"), 0x81, 0xa1, 0x78, 0x01);
  const value = decode(packed);
  assert.equal(Object.getPrototypeOf(value), Object.prototype);
  assert.deepEqual(Object.getOwnPropertyDescriptor(value, "__proto__").value, { x: 1 });
  assert.equal({}.x, undefined);
});

test("every strict prefix of a value is INCOMPLETE, for decode and skip", () => {
  const value = { global_id: 70000, message_id: 3, channel: "/chät", data: { text: "🎉".repeat(20), list: [1, -200, 3.5, null], bin: new Uint8Array(5) } };
  const bytes = encode(value);
  for (let cut = 0; cut < bytes.length; cut++) {
    assert.equal(decoder.decode(bytes, 0, cut), INCOMPLETE, `cut at ${cut}`);
    assert.equal(decoder.skip(bytes, 0, cut), -1, `skip cut at ${cut}`);
  }
  assert.equal(decoder.skip(bytes, 0, bytes.length), bytes.length);
  assert.deepEqual(decoder.decode(bytes, 0, bytes.length), value);
});

// The decoder does not check the limit before every read: it reads on and looks at its position at the end
// (the bytes after `length` may be another value's, a reused buffer's old bytes, or nothing). Whatever is
// there, a cut value must come back INCOMPLETE: no error, no huge allocation, no value made of garbage.
test("every strict prefix is INCOMPLETE whatever bytes follow the limit (SEED to replay)", () => {
  const random = seeded("garbage after the limit");
  const value = [
    { global_id: 70000, message_id: 3, channel: "/chät", data: { text: "🎉 ok".repeat(30), n: -5, f: 0.25, big: 2 ** 40, list: [1, -200, 3.5, null, true] } },
    { global_id: 1, message_id: 2 ** 31, channel: "/c", data: { bin: new Uint8Array(300), long: "z".repeat(70000), at: new Date(1700000000123) } },
  ];
  const bytes = encode(value);
  const traps = [0xdd, 0xdf, 0xdb, 0xc6, 0xc9, 0xff, 0xff, 0xff, 0xff]; // 32-bit array/map/str/bin/ext headers, max sizes
  for (let cut = 0; cut < bytes.length; cut += cut < 400 ? 1 : 997) {
    const copy = bytes.slice();
    for (let i = cut; i < copy.length; i++) copy[i] = random.next() < 0.5 ? traps[random.int(traps.length)] : random.int(256);
    assert.equal(decoder.decode(copy, 0, cut), INCOMPLETE, `seed ${random.seed}, garbage after ${cut}`);
    assert.equal(decoder.decode(bytes.subarray(0, cut), 0, cut), INCOMPLETE, `nothing after ${cut}`);
  }
  assert.deepEqual(decoder.decode(bytes, 0, bytes.length), value);
});

test("two decoders used in turn on different bodies each read their own", () => {
  const a = encode([{ channel: "/a", data: "é".repeat(10) }, { channel: "/a", data: 1 }]);
  const b = encode([{ channel: "/b", data: "x".repeat(100) }]);
  const da = new Decoder();
  const db = new Decoder();
  assert.equal(da.decode(a, 0, a.length - 3), INCOMPLETE);
  assert.deepEqual(db.decode(b, 0, b.length), [{ channel: "/b", data: "x".repeat(100) }]);
  assert.equal(da.skip(a, 0, a.length), a.length);
  assert.deepEqual(da.decode(a, 0, a.length), [{ channel: "/a", data: "é".repeat(10) }, { channel: "/a", data: 1 }]);
  assert.equal(da.end, a.length);
  assert.equal(db.end, b.length);
});

test("map keys: many distinct keys of every short length, repeated (the key cache)", () => {
  const keys = [];
  for (let length = 1; length <= 20; length++) for (let i = 0; i < 60; i++) keys.push(`${i}`.padStart(length, "k").slice(-length));
  keys.push("ü", "日本", "🎉x", "a\u0000b");
  const value = Array.from({ length: 3 }, (_, round) => Object.fromEntries(keys.map((k, i) => [k, i + round])));
  assert.deepEqual(decode(encode(value)), value);
});

test("a value decoded again after an attempt that ran out of bytes", () => {
  const value = ["a".repeat(10000), "b".repeat(10000), { key: "c".repeat(10000) }];
  const bytes = encode(value);
  assert.equal(decoder.decode(bytes, 0, bytes.length - 5), INCOMPLETE);
  assert.deepEqual(decoder.decode(bytes, 0, bytes.length), value);
});

test("unknown type bytes are an error, not a hang", () => {
  assert.throws(() => decoder.decode(Uint8Array.of(0xc1), 0, 1), /unknown type byte 0xc1/);
});

test("randomized round trip (SEED to replay)", () => {
  const random = seeded("msgpack");
  const value = (depth) => {
    const r = random.int(10);
    if (depth > 3 || r < 4) return random.scalar();
    if (r < 7) return Array.from({ length: random.int(8) }, () => value(depth + 1));
    return Object.fromEntries(Array.from({ length: random.int(8) }, () => [random.text(12), value(depth + 1)]));
  };
  for (let i = 0; i < 2000; i++) {
    const v = value(0);
    assert.deepEqual(decode(encode(v)), v, `seed ${random.seed}, case ${i}`);
  }
});
