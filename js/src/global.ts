// The classic script Herald serves at {base}message-bus/herald.js: `window.Herald` (the client class) and
// `window.MessageBus` (a drop-in for message-bus.js).
import { Herald } from "./client.js";
import { createMessageBus } from "./facade.js";
import { defineSubscriptionElement } from "./element.js";

const g = globalThis as unknown as { Herald: typeof Herald; MessageBus: ReturnType<typeof createMessageBus> };
g.Herald = Herald;
g.MessageBus ||= createMessageBus(); // loaded twice (a tag and an import): one client
// <herald-subscription channel="..."> subscribes through that same MessageBus while it is in the document.
defineSubscriptionElement(() => g.MessageBus);
