// <herald-subscription>: subscribes while connected, unsubscribes when removed, one herald:message event per
// message, Turbo Stream HTML applied when asked. A minimal custom-elements stand-in (Node has no DOM); the
// browser test (test/browser/turbo_subscription.test.mjs) runs it in Chromium under Turbo Drive.
import { test } from "node:test";
import assert from "node:assert/strict";

class FakeElement {
  constructor() {
    this.attributes = new Map();
    this.events = [];
  }
  getAttribute(name) {
    return this.attributes.has(name) ? this.attributes.get(name) : null;
  }
  hasAttribute(name) {
    return this.attributes.has(name);
  }
  dispatchEvent(event) {
    this.events.push(event);
    return !event.defaultPrevented;
  }
}
const registry = new Map();
globalThis.HTMLElement = FakeElement;
globalThis.customElements = { get: (n) => registry.get(n), define: (n, c) => registry.set(n, c) };
globalThis.CustomEvent ??= class extends Event {
  constructor(type, init) {
    super(type, init);
    this.detail = init.detail;
  }
};

const { defineSubscriptionElement, createMessageBus } = await import("../dist/index.js");

// The real facade over a client that never polls: what the element asks for is what the page would.
function fakeBus() {
  const calls = [];
  const subscribed = [];
  return {
    calls,
    subscribed,
    subscribe(channel, fn, lastId) {
      calls.push(["subscribe", channel, lastId]);
      subscribed.push([channel, fn]);
      return fn;
    },
    unsubscribe(channel, fn) {
      calls.push(["unsubscribe", channel]);
      const i = subscribed.findIndex(([c, f]) => c === channel && f === fn);
      if (i >= 0) subscribed.splice(i, 1);
      return i >= 0;
    },
    deliver(channel, data, id) {
      for (const [c, fn] of subscribed.slice()) if (c === channel) fn(data, id * 10, id);
    },
  };
}

let bus = fakeBus();
defineSubscriptionElement(() => bus);
const Element = registry.get("herald-subscription");

function element(attrs) {
  const el = new Element();
  for (const [k, v] of Object.entries(attrs)) el.attributes.set(k, v);
  return el;
}

test("subscribes while connected, once, and unsubscribes when removed", () => {
  bus = fakeBus();
  const el = element({ channel: "/chat/héllo 👋" });
  el.connectedCallback();
  el.connectedCallback(); // connected again without leaving: still one subscription
  assert.deepEqual(bus.calls, [["subscribe", "/chat/héllo 👋", -1]]);
  bus.deliver("/chat/héllo 👋", { text: "日本語 🎉" }, 3);
  assert.equal(el.events.length, 1);
  assert.equal(el.events[0].type, "herald:message");
  assert.equal(el.events[0].bubbles, true);
  assert.deepEqual(el.events[0].detail, { channel: "/chat/héllo 👋", data: { text: "日本語 🎉" }, globalId: 30, messageId: 3 });
  el.disconnectedCallback();
  bus.deliver("/chat/héllo 👋", "after removal", 4);
  assert.equal(el.events.length, 1);
  assert.equal(bus.subscribed.length, 0);
});

test("ten page visits (a new element each, the old one removed) leave one subscription", () => {
  bus = fakeBus();
  let current = null;
  for (let visit = 0; visit < 10; visit++) {
    const next = element({ channel: "/chat" });
    current?.disconnectedCallback();
    next.connectedCallback();
    current = next;
  }
  assert.equal(bus.subscribed.length, 1);
  bus.deliver("/chat", "once", 1);
  assert.equal(current.events.length, 1);
});

test("last-id asks for the backlog; no channel, no subscription", () => {
  bus = fakeBus();
  element({ channel: "/news", "last-id": "0" }).connectedCallback();
  element({}).connectedCallback();
  assert.deepEqual(bus.calls, [["subscribe", "/news", 0]]);
});

test("turbo-stream: Turbo.renderStreamMessage gets the HTML, unless a listener prevented it", () => {
  bus = fakeBus();
  const rendered = [];
  globalThis.Turbo = { renderStreamMessage: (html) => rendered.push(html) };
  try {
    const stream = '<turbo-stream action="append" target="log"><template><li>é 🎉</li></template></turbo-stream>';
    const el = element({ channel: "/streams", "turbo-stream": "" });
    el.connectedCallback();
    bus.deliver("/streams", stream, 1);
    bus.deliver("/streams", { html: stream }, 2);
    bus.deliver("/streams", { other: 1 }, 3);
    const plain = element({ channel: "/streams" });
    plain.connectedCallback();
    bus.deliver("/streams", stream, 4); // both elements get it; only the turbo-stream one renders
    assert.deepEqual(rendered, [stream, stream, stream]);
    el.dispatchEvent = (event) => (event.preventDefault(), false);
    bus.deliver("/streams", stream, 5);
    assert.equal(rendered.length, 3);
  } finally {
    delete globalThis.Turbo;
  }
});

test("works with the MessageBus facade itself", () => {
  const facade = createMessageBus();
  facade.heraldOptions = { fetch: () => new Promise(() => {}) }; // never answers: nothing polls for real
  bus = facade;
  const el = element({ channel: "/facade" });
  el.connectedCallback();
  assert.deepEqual(Object.keys(facade.herald.lastIds()), ["/facade"]);
  el.disconnectedCallback();
  assert.deepEqual(Object.keys(facade.herald.lastIds()), []);
  facade.stop();
});
