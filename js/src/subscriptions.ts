// Per-channel bookkeeping: which callbacks want which channel from which id, what to ask the server for
// on the next request, and the rules that make delivery exactly-once and in order across reconnects:
//   - each subscription remembers the last message id it was given; a message at or below it is a repeat
//     (a resumed stream, an overlapping poll) and is dropped;
//   - the next request asks, per channel, from the lowest id any of its subscriptions has seen;
//   - `/__status` (docs/protocol.md 1.7) moves subscriptions to the server's position; a position below what a
//     subscription already saw means the server's store was reset (ids went backwards), which is reported;
//   - a new store epoch (Herald names it in its MessagePack replies) means a reset too, even when the new
//     store's ids are above the client's: every subscription starts again from the new store's position,
//     which the next reply's status gives, and the reset is reported then.

/** One message as the server sends it (the same four keys in JSON and MessagePack). */
export interface Message<T = unknown> {
  global_id: number;
  message_id: number;
  channel: string;
  data: T;
}

export type Callback<T = unknown> = (data: T, message: Message<T>) => void;

/** A store reset seen on one channel: the server's last id went below what this client already received, or
 * the server's store is another one (a new epoch). */
export interface ResetEvent {
  channel: string;
  /** The highest id the client had received on the channel. */
  lastId: number;
  /** The server's last id for the channel now; the subscription resumes after it. */
  serverLastId: number;
}

export interface Subscription {
  readonly channel: string;
  readonly callback: Callback<any>;
  /** -1: from now (waiting for the server's position); < -1: that many back; >= 0: last id received. */
  lastId: number;
}

export const STATUS_CHANNEL = "/__status";

export class Subscriptions {
  private channels = new Map<string, Subscription[]>();
  /** The server store's epoch as last seen, null until a reply names one. */
  epoch: string | null = null;
  private resets = new Map<string, number>(); // channel => last id received before a new epoch
  /** Called for a callback that throws; delivery goes on. */
  onCallbackError: (error: unknown, message: Message) => void = (error) => console.error(error);
  onReset: (event: ResetEvent) => void = () => {};

  add(channel: string, callback: Callback<any>, lastId = -1): Subscription {
    if (typeof channel !== "string" || channel === "") throw new TypeError("channel must be a non-empty string");
    if (typeof callback !== "function") throw new TypeError("callback must be a function");
    if (!Number.isInteger(lastId)) throw new TypeError("lastId must be an integer");
    let list = this.channels.get(channel);
    if (!list) this.channels.set(channel, (list = []));
    // "From now" on a channel whose position is known already: now is that position.
    if (lastId === -1) {
      const known = this.position(channel);
      if (known >= 0) lastId = known;
    }
    const sub: Subscription = { channel, callback, lastId };
    list.push(sub);
    return sub;
  }

  /** Returns true if it was subscribed. */
  remove(sub: Subscription): boolean {
    const list = this.channels.get(sub.channel);
    const at = list ? list.indexOf(sub) : -1;
    if (!list || at < 0) return false;
    list.splice(at, 1);
    if (list.length === 0) this.channels.delete(sub.channel);
    return true;
  }

  get size(): number {
    return this.channels.size;
  }

  list(): Subscription[] {
    const out: Subscription[] = [];
    this.channels.forEach((subs) => out.push(...subs));
    return out;
  }

  /** The highest id any subscription on the channel has received, or -1. */
  position(channel: string): number {
    let max = -1;
    for (const sub of this.channels.get(channel) || []) if (sub.lastId > max) max = sub.lastId;
    return max;
  }

  /** channel => the id to resume after: the lowest id received, else the deepest lookbehind, else -1. */
  request(): Map<string, number> {
    const out = new Map<string, number>();
    this.channels.forEach((subs, channel) => {
      let known = Infinity;
      let pending = -1;
      for (const sub of subs) {
        if (sub.lastId >= 0) known = Math.min(known, sub.lastId);
        else pending = Math.min(pending, sub.lastId);
      }
      out.set(channel, known === Infinity ? pending : known);
    });
    return out;
  }

  /** One message or status entry from the server, in the order received. */
  deliver(raw: unknown): void {
    const message = raw as Message;
    if (!message || typeof message !== "object") return;
    const channel = message.channel;
    if (channel === STATUS_CHANNEL) {
      this.status(message.data as Record<string, number>);
      return;
    }
    const subs = this.channels.get(channel);
    if (!subs) return;
    const id = message.message_id;
    for (let i = 0; i < subs.length; i++) {
      const sub = subs[i];
      if (sub.lastId >= 0 && id <= sub.lastId) continue; // seen it already
      sub.lastId = id;
      try {
        sub.callback(message.data, message);
      } catch (error) {
        this.onCallbackError(error, message);
      }
    }
  }

  /**
   * The epoch a reply names (null: none named). Returns false when it is not the one seen before: the reply
   * answers positions in another store and must be dropped; every subscription that had received
   * something asks again from "now" (the next reply's status), where the reset is reported.
   */
  checkEpoch(epoch: string | null): boolean {
    if (!epoch || epoch === this.epoch) return true;
    const known = this.epoch;
    this.epoch = epoch;
    if (known === null) return true;
    this.channels.forEach((subs, channel) => {
      let seen = this.resets.get(channel) ?? -1;
      for (const sub of subs) {
        if (sub.lastId >= 0) {
          seen = Math.max(seen, sub.lastId);
          sub.lastId = -1;
        }
      }
      if (seen >= 0) this.resets.set(channel, seen);
    });
    return false;
  }

  private status(positions: Record<string, number> | null): void {
    if (!positions || typeof positions !== "object") return;
    for (const channel of Object.keys(positions)) {
      const serverLastId = Number(positions[channel]);
      const subs = this.channels.get(channel);
      if (!subs || !Number.isInteger(serverLastId)) continue;
      let reset = this.resets.get(channel) ?? -1;
      this.resets.delete(channel);
      for (const sub of subs) {
        if (sub.lastId > serverLastId) reset = Math.max(reset, sub.lastId);
        sub.lastId = serverLastId;
      }
      if (reset >= 0) this.onReset({ channel, lastId: reset, serverLastId });
    }
  }
}
