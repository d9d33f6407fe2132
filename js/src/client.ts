// The client: one connection for all subscriptions, and the loop that picks a transport, makes one request
// with it (transport_*.ts), and decides from its Outcome (transport.ts) what follows: the next request at once
// or at the polling pace, a backoff, a Retry-After wait, a fallback to the next transport.
import { Backoff, retryAfter, type BackoffOptions } from "./backoff.js";
import { Decoder, type MessagePackDecoder } from "./msgpack.js";
import { Subscriptions, type Callback, type Message, type ResetEvent, type Subscription } from "./subscriptions.js";
import type { TransportName } from "./transport.js";
import { http } from "./transport_http.js";
import { sse } from "./transport_sse.js";

export type { TransportName };

export const TRANSPORTS: readonly TransportName[] = ["stream", "sse", "longpoll", "poll"];

export interface HeraldOptions {
  /** Where the app is mounted; the client talks to `${baseUrl}message-bus/...`. Default "/". */
  baseUrl?: string;
  /** 1-128 characters of A-Z a-z 0-9 _ . ~ -; a random 32-hex id by default. Messages published with
   * `client_ids:` go only to the named clients. */
  clientId?: string;
  /** Transports to try, best first (default: all, in the order of {@link TRANSPORTS}). */
  transports?: TransportName[];
  /** Ask for MessagePack (default true); servers that do not speak it answer JSON. */
  msgpack?: boolean;
  /** Extra request headers (not sent by EventSource, which cannot). */
  headers?: Record<string, string>;
  /** Short polling: ms between polls when the tab is visible (default 15 000). */
  pollInterval?: number;
  /** Hidden tabs poll (without holding a connection) every this many ms (default 60 000; 0 keeps streaming). */
  backgroundInterval?: number;
  /** A stream whose first body byte comes later than this many ms after its headers and whose whole body
   * then arrives at once at its end went through a buffering proxy: the next request uses the next
   * transport (default 3000). A server slow to build a large backlog is not mistaken for one: its stream
   * stays open after the backlog. */
  firstChunkTimeout?: number;
  /** A held request is abandoned after this many ms (default 60 000; the server holds 25 s). Catches
   * connections that died silently, e.g. across a laptop's sleep. */
  requestTimeout?: number;
  /** After falling back, try the best transport again after this many requests (default 30). */
  retryBestAfter?: number;
  /** Reconnect backoff (full jitter): `{ base: 500, cap: 30000 }` ms by default. */
  backoff?: BackoffOptions;
  /** Called when the server's store was reset: its ids went backwards on a channel, or its epoch changed. */
  onReset?: (event: ResetEvent) => void;
  /** Called for failed requests and throwing callbacks (default: console.warn / console.error). */
  onError?: (error: unknown) => void;
  /** The MessagePack decoder (default: Herald's own). */
  decoder?: MessagePackDecoder;
  /** fetch to use (default: globalThis.fetch). */
  fetch?: typeof fetch;
  /** subscribe() starts the client when it is stopped (default true; the MessageBus facade says false). */
  autoStart?: boolean;
}

export interface SubscribeOptions {
  /** Resume after this message id; -1 (default): from now; -2: the last message too; -3: the last two... */
  lastId?: number;
}

export type Status = "started" | "stopped";

/** What {@link Herald.diagnostics} reports (message-bus.js's `diagnostics()` logs the same counts). */
export interface Diagnostics {
  status: Status;
  transport: TransportName;
  /** Requests made, and how many of them failed (all time, and since the last success). */
  requests: number;
  failures: number;
  recentFailures: number;
  /** ms since the last request started (null: none yet). */
  sinceLastRequest: number | null;
  offline: boolean;
  hidden: boolean;
  /** The store epoch the server last named, and the last id per channel. */
  epoch: string | null;
  lastIds: Record<string, number>;
}

const MIN_INTERVAL = 100; // ms between requests when the last one answered at once

function randomId(): string {
  const bytes = new Uint8Array(16);
  globalThis.crypto.getRandomValues(bytes);
  let out = "";
  for (const b of bytes) out += b.toString(16).padStart(2, "0");
  return out;
}

const hasDocument = typeof document !== "undefined";
const hasWindow = typeof window !== "undefined" && typeof window.addEventListener === "function";

export class Herald {
  readonly clientId: string;
  readonly baseUrl: string;
  /** The transport of the current (or last) request. */
  transport: TransportName;
  /** @internal */
  options: Required<Pick<HeraldOptions, "msgpack" | "pollInterval" | "backgroundInterval" | "firstChunkTimeout" | "requestTimeout" | "retryBestAfter">>;
  private transports: TransportName[];
  private transportIndex = 0;
  private requestsSinceFallback = 0;
  /** @internal */
  subs = new Subscriptions();
  private backoff: Backoff;
  /** @internal */
  decoder: MessagePackDecoder;
  /** @internal */
  fetchImpl: typeof fetch;
  /** @internal */
  headers: Record<string, string>;
  /** @internal */
  onError: (error: unknown) => void;
  private running = false;
  private loop: Promise<void> | null = null;
  /** @internal */
  seq = 0;
  /** @internal Ends the request in flight (set by its transport). */
  abort: (() => void) | null = null;
  private wake: (() => void) | null = null; // ends the wait between requests
  private offline = false;
  private away = false; // between pagehide and pageshow
  private dirty = false; // interrupted between requests: the next wait is skipped
  private hidden = false;
  private listeners: Array<[EventTarget, string, EventListener]> = [];
  private autoStart: boolean;
  private requests = 0;
  private failures = 0;
  private recentFailures = 0;
  private lastRequestAt = 0;

  constructor(options: HeraldOptions = {}) {
    let base = options.baseUrl ?? "/";
    if (!base.endsWith("/")) base += "/";
    this.baseUrl = base;
    this.clientId = options.clientId ?? randomId();
    if (!/^[A-Za-z0-9_.~-]{1,128}$/.test(this.clientId)) throw new TypeError("clientId must be 1-128 characters of A-Z a-z 0-9 _ . ~ -");
    this.transports = (options.transports ?? TRANSPORTS.slice()).filter((t) => TRANSPORTS.includes(t));
    if (this.transports.length === 0) throw new TypeError(`transports must name some of ${TRANSPORTS.join(", ")}`);
    this.transport = this.transports[0];
    this.options = {
      msgpack: options.msgpack ?? true,
      pollInterval: options.pollInterval ?? 15000,
      backgroundInterval: options.backgroundInterval ?? 60000,
      firstChunkTimeout: options.firstChunkTimeout ?? 3000,
      requestTimeout: options.requestTimeout ?? 60000,
      retryBestAfter: options.retryBestAfter ?? 30,
    };
    this.backoff = new Backoff(options.backoff);
    this.decoder = options.decoder ?? new Decoder();
    this.fetchImpl = options.fetch ?? globalThis.fetch.bind(globalThis);
    this.headers = options.headers ?? {};
    this.autoStart = options.autoStart ?? true;
    this.onError = options.onError ?? ((error) => console.warn("herald:", error));
    this.subs.onCallbackError = options.onError ?? ((error) => console.error(error));
    if (options.onReset) this.subs.onReset = options.onReset;
  }

  /**
   * Calls `callback(data, message)` for every message on `channel` after `lastId`, exactly once and in
   * order, across reconnects. Starts the client if needed. Returns the function that unsubscribes.
   */
  subscribe<T = unknown>(channel: string, callback: Callback<T>, { lastId = -1 }: SubscribeOptions = {}): () => boolean {
    const sub = this.subs.add(channel, callback as Callback<any>, lastId);
    this.changed();
    return () => this.remove(sub);
  }

  /** Removes subscriptions on `channel` (a trailing `*` matches a prefix), only `callback`'s if given. */
  unsubscribe(channel: string, callback?: Callback<any>): boolean {
    const glob = channel.endsWith("*");
    const prefix = glob ? channel.slice(0, -1) : channel;
    let removed = false;
    for (const sub of this.subs.list()) {
      const match = glob ? sub.channel.startsWith(prefix) : sub.channel === channel;
      if (match && (!callback || sub.callback === callback)) removed = this.subs.remove(sub) || removed;
    }
    if (removed) this.changed();
    return removed;
  }

  /** The last id received per channel (the highest among its subscriptions). */
  lastIds(): Record<string, number> {
    const out: Record<string, number> = {};
    for (const sub of this.subs.list()) out[sub.channel] = this.subs.position(sub.channel);
    return out;
  }

  /** The server store's epoch as last seen (Herald names it in its MessagePack replies), or null. */
  get epoch(): string | null {
    return this.subs.epoch;
  }

  get status(): Status {
    return this.running ? "started" : "stopped";
  }

  /** The client's state and counts, for a console or a bug report. */
  diagnostics(): Diagnostics {
    return {
      status: this.status,
      transport: this.transport,
      requests: this.requests,
      failures: this.failures,
      recentFailures: this.recentFailures,
      sinceLastRequest: this.lastRequestAt ? Date.now() - this.lastRequestAt : null,
      offline: this.offline,
      hidden: this.hidden,
      epoch: this.epoch,
      lastIds: this.lastIds(),
    };
  }

  start(): void {
    if (this.running) return;
    this.running = true;
    this.listen();
    this.loop = this.run().catch((error) => this.onError(error));
  }

  /** Ends the request in flight and every timer and listener; subscriptions stay for a later start(). */
  async stop(): Promise<void> {
    if (!this.running) return;
    this.running = false;
    for (const [target, type, fn] of this.listeners) target.removeEventListener(type, fn);
    this.listeners = [];
    this.interrupt();
    await this.loop;
    this.loop = null;
  }

  private remove(sub: Subscription): boolean {
    const removed = this.subs.remove(sub);
    if (removed) this.changed();
    return removed;
  }

  // The channel set changed: the request in flight asks for the old one.
  private changed(): void {
    if (this.running) this.interrupt();
    else if (this.autoStart) this.start();
  }

  private interrupt(): void {
    this.dirty = true;
    const abort = this.abort;
    const wake = this.wake;
    this.abort = null;
    this.wake = null;
    abort?.();
    wake?.();
  }

  private listen(): void {
    const on = (target: EventTarget, type: string, fn: EventListener) => {
      target.addEventListener(type, fn);
      this.listeners.push([target, type, fn]);
    };
    if (hasWindow) {
      this.offline = typeof navigator !== "undefined" && navigator.onLine === false;
      on(window, "offline", () => {
        this.offline = true;
        this.interrupt();
      });
      on(window, "online", () => {
        this.offline = false;
        this.backoff.reset();
        this.interrupt();
      });
      // Leaving the page (or entering the back/forward cache): let go of the connection at once and make
      // no other until the page is shown again (a request in flight can keep a page out of that cache).
      on(window, "pagehide", () => {
        this.away = true;
        this.interrupt();
      });
      on(window, "pageshow", () => {
        this.away = false;
        this.interrupt();
      });
    }
    if (hasDocument) {
      this.hidden = document.visibilityState === "hidden";
      on(document, "visibilitychange", () => {
        const hidden = document.visibilityState === "hidden";
        const wasHidden = this.hidden;
        this.hidden = hidden;
        if (wasHidden !== hidden && this.options.backgroundInterval > 0) this.interrupt(); // hidden: poll now and then from now on; visible again: catch up now
      });
    }
  }

  private async run(): Promise<void> {
    await null; // subscriptions made in the same task as start() go out in the first request
    while (this.running) {
      if (this.offline || this.away || this.subs.size === 0) {
        this.dirty = false;
        await this.sleep(Infinity);
        continue;
      }
      this.dirty = false;
      const transport = this.pick();
      const started = Date.now();
      this.requests++;
      this.lastRequestAt = started;
      const outcome = await (transport === "sse" ? sse : http)(this, transport);
      if (outcome.kind === "failed") {
        this.failures++;
        this.recentFailures++;
      } else if (outcome.kind === "done") {
        this.recentFailures = 0;
      }
      if (!this.running) break;
      let delay = 0;
      switch (outcome.kind) {
        case "done":
          this.backoff.reset();
          this.requestsSinceFallback++;
          delay = Math.max((outcome.poll ? this.pollDelay() : 0) - (Date.now() - started), MIN_INTERVAL - (Date.now() - started), 0);
          break;
        case "failed":
          this.onError(outcome.error);
          delay = this.backoff.next();
          break;
        case "rate-limited":
          delay = retryAfter(outcome.retryAfter, 15000, MIN_INTERVAL);
          break;
        case "unsupported":
          if (this.transportIndex < this.transports.length - 1) {
            this.transportIndex++;
            this.requestsSinceFallback = 0;
          } else {
            this.onError(new Error(`${transport}: ${outcome.reason}`));
            delay = this.backoff.next();
          }
          break;
        case "interrupted":
          break;
      }
      if (delay > 0) await this.sleep(delay);
    }
  }

  private pick(): TransportName {
    if (this.transportIndex > 0 && this.requestsSinceFallback >= this.options.retryBestAfter) {
      this.transportIndex = 0;
      this.requestsSinceFallback = 0;
    }
    // A hidden tab holds no connection: it polls now and then (and at once when it is shown again).
    if (this.hidden && this.options.backgroundInterval > 0) return (this.transport = "poll");
    return (this.transport = this.transports[this.transportIndex]);
  }

  // Waits `ms` unless interrupted first.
  private sleep(ms: number): Promise<void> {
    return new Promise((resolve) => {
      if (this.dirty) return resolve();
      const timer = ms === Infinity ? null : setTimeout(done, ms);
      const self = this;
      function done() {
        if (timer !== null) clearTimeout(timer);
        if (self.wake === done) self.wake = null;
        resolve();
      }
      this.wake = done;
    });
  }

  private pollDelay(): number {
    return this.hidden && this.options.backgroundInterval > 0 ? this.options.backgroundInterval : this.options.pollInterval;
  }
}

export type { Message, Callback, ResetEvent };
