// A drop-in for message_bus's `window.MessageBus`: the same settings and calls, Herald underneath.
// A page that used message-bus.js (plus its ajax adapter) loads Herald's script instead and changes nothing.
import { Herald, type Diagnostics, type HeraldOptions, type TransportName } from "./client.js";
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
  /** Messages keep arriving (and are not asked for again) but wait for resume() to reach callbacks. */
  pause(): void;
  /** Delivers what arrived while paused, in order, then goes on as before. */
  resume(): void;
  status(): "started" | "stopped" | "paused";
  /** Logs the client's state as message-bus.js does, and returns it. */
  diagnostics(): Diagnostics & { paused: boolean; waiting: number; callbacks: Array<{ channel: string; lastId: number }> };
}

export function createMessageBus(): MessageBusFacade {
  let entries: Entry[] = [];
  let stopped = false;
  let paused = false;
  let later: Array<[Entry, unknown, Message]> = [];
  const call = (entry: Entry, data: unknown, m: Message) => entry.fn(data, m.global_id, m.message_id);
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
      const entry: Entry = { channel, fn, unsubscribe: () => false };
      entry.unsubscribe = herald.subscribe(channel, (data: unknown, m: Message) => {
        if (paused) later.push([entry, data, m]);
        else call(entry, data, m);
      }, { lastId });
      entries.push(entry);
      if (!stopped) herald.start(); // message-bus.js starts on the first subscribe unless stopped
      return fn;
    },

    // A trailing `*` matches every channel with that prefix; without fn, every callback goes.
    unsubscribe(channel, fn) {
      const glob = channel.endsWith("*");
      const prefix = glob ? channel.slice(0, -1) : channel;
      let removed = false;
      const gone = new Set<Entry>();
      entries = entries.filter((e) => {
        const match = (glob ? e.channel.startsWith(prefix) : e.channel === channel) && (!fn || e.fn === fn);
        if (match) {
          removed = e.unsubscribe() || removed;
          gone.add(e);
        }
        return !match;
      });
      if (gone.size) later = later.filter(([e]) => !gone.has(e));
      return removed;
    },

    pause() {
      paused = true;
    },

    resume() {
      paused = false;
      const waiting = later;
      later = [];
      for (const [entry, data, m] of waiting) {
        try {
          call(entry, data, m);
        } catch (error) {
          console.error(error);
        }
      }
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
      if (paused) return "paused";
      return bus.herald ? bus.herald.status : "stopped";
    },

    diagnostics() {
      const herald = client();
      const d = herald.diagnostics();
      const callbacks = entries.map((e) => ({ channel: e.channel, lastId: d.lastIds[e.channel] ?? -1 }));
      console.log(`Stopped: ${d.status === "stopped"} Started: ${d.status === "started"} Paused: ${paused}`);
      console.log("Current callbacks");
      console.log(callbacks);
      console.log(`Total ajax calls: ${d.requests} Recent failure count: ${d.recentFailures} Total failures: ${d.failures}`);
      console.log(`Last ajax call: ${d.sinceLastRequest === null ? "never" : `${d.sinceLastRequest / 1000} seconds ago`}`);
      console.log(`Transport: ${d.transport} Store epoch: ${d.epoch ?? "unknown"} Waiting for resume: ${later.length}`);
      return { ...d, paused, waiting: later.length, callbacks };
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
