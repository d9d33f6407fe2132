// A drop-in for message_bus's `window.MessageBus`: the same settings and calls, Herald underneath.
// A page that used message-bus.js (plus its ajax adapter) loads Herald's script instead and changes nothing.
import { Herald, type HeraldOptions, type TransportName } from "./client.js";
import type { Message } from "./subscriptions.js";

export type MessageBusCallback = (data: any, globalId: number, messageId: number) => void;

interface Entry {
  channel: string;
  fn: MessageBusCallback;
  unsubscribe: () => boolean;
}

export interface MessageBusFacade {
  baseUrl: string;
  headers: Record<string, string>;
  clientId: string | undefined;
  enableLongPolling: boolean;
  enableChunkedEncoding: boolean;
  callbackInterval: number;
  backgroundCallbackInterval: number;
  /** Extra options for the Herald client, read at start(). */
  heraldOptions: HeraldOptions;
  /** The Herald client once started. */
  herald: Herald | null;
  subscribe(channel: string, fn: MessageBusCallback, lastId?: number): MessageBusCallback;
  unsubscribe(channel: string, fn?: MessageBusCallback): boolean;
  start(): void;
  stop(): void;
  status(): "started" | "stopped";
}

export function createMessageBus(): MessageBusFacade {
  let entries: Entry[] = [];
  let stopped = false;
  const bus: MessageBusFacade = {
    baseUrl: "/",
    headers: {},
    clientId: undefined,
    enableLongPolling: true,
    enableChunkedEncoding: true,
    callbackInterval: 15000,
    backgroundCallbackInterval: 60000,
    heraldOptions: {},
    herald: null,

    subscribe(channel, fn, lastId = -1) {
      if (typeof channel !== "string") throw new TypeError("Channel name must be a string!");
      if (typeof fn !== "function") throw new TypeError("Callback must be a function!");
      if (typeof lastId !== "number") throw new TypeError("lastId must be a number!");
      const herald = client();
      const unsubscribe = herald.subscribe(channel, (data: unknown, m: Message) => fn(data, m.global_id, m.message_id), { lastId });
      entries.push({ channel, fn, unsubscribe });
      if (!stopped) herald.start(); // message-bus.js starts on the first subscribe unless stopped
      return fn;
    },

    // A trailing `*` matches every channel with that prefix; without fn, every callback goes.
    unsubscribe(channel, fn) {
      const glob = channel.endsWith("*");
      const prefix = glob ? channel.slice(0, -1) : channel;
      let removed = false;
      entries = entries.filter((e) => {
        const match = (glob ? e.channel.startsWith(prefix) : e.channel === channel) && (!fn || e.fn === fn);
        if (match) removed = e.unsubscribe() || removed;
        return !match;
      });
      return removed;
    },

    start() {
      stopped = false;
      client().start();
    },

    stop() {
      stopped = true;
      void bus.herald?.stop();
    },

    status() {
      return bus.herald ? bus.herald.status : "stopped";
    },
  };

  function client(): Herald {
    if (bus.herald) return bus.herald;
    let transports: TransportName[] = ["stream", "sse", "longpoll", "poll"];
    if (!bus.enableChunkedEncoding) transports = ["longpoll", "poll"];
    if (!bus.enableLongPolling) transports = ["poll"];
    bus.herald = new Herald({
      baseUrl: bus.baseUrl,
      clientId: bus.clientId,
      headers: bus.headers,
      pollInterval: bus.callbackInterval,
      backgroundInterval: bus.backgroundCallbackInterval,
      transports,
      ...bus.heraldOptions,
      autoStart: false,
    });
    return bus.herald;
  }

  return bus;
}
