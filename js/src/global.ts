// The classic script Herald serves at {base}message-bus/herald.js: `window.Herald` (the client class) and
// `window.MessageBus` (a drop-in for message-bus.js).
import { Herald } from "./client.js";
import { createMessageBus } from "./facade.js";

const g = globalThis as unknown as { Herald: typeof Herald; MessageBus: ReturnType<typeof createMessageBus> };
g.Herald = Herald;
g.MessageBus = createMessageBus();
