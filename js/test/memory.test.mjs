// What the client keeps after a request ends: nothing of the body's bytes (a 9 MB backlog body stayed
// reachable through the decoder until the next request, after stop() too).
import { test } from "node:test";
import assert from "node:assert/strict";
import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";
import { encode } from "@msgpack/msgpack";
import { Herald } from "../dist/index.js";

setFlagsFromString("--expose-gc");
const gc = runInNewContext("gc");

test("after stop() the decoder keeps no reference to the last body", async () => {
  let served = false;
  let bodyRef = null;
  const fetch = async (_url, init) => {
    if (served) return new Promise((_, reject) => init.signal.addEventListener("abort", () => reject(new DOMException("aborted", "AbortError"))));
    served = true;
    const body = encode(Array.from({ length: 50 }, (_, i) => ({ global_id: i + 1, message_id: i + 1, channel: "/c", data: { text: `message ${i} `.repeat(20) } })));
    bodyRef = new WeakRef(body.buffer);
    const stream = new ReadableStream({ start(c) { c.enqueue(body); c.close(); } });
    return new Response(stream, { headers: { "content-type": "application/vnd.msgpack" } });
  };
  const bus = new Herald({ transports: ["longpoll"], fetch });
  const got = [];
  await new Promise((resolve) => bus.subscribe("/c", (data) => { got.push(data.text); if (got.length === 50) resolve(); }, { lastId: 0 }));
  await bus.stop();
  got.length = 0;
  for (let i = 0; i < 3 && bodyRef.deref(); i++) {
    await new Promise((r) => setTimeout(r, 10));
    gc();
  }
  assert.equal(bodyRef.deref(), undefined, "the body's bytes are still reachable");
});
