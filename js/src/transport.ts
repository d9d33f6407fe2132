// The transport contract. A transport makes one request (a reply, a stream, an event stream), hands each
// message to `link.subs` as it arrives, and says how the request ended: an Outcome. It never waits, retries or
// picks another transport: the client's loop (client.ts) decides all of that from the Outcome.
import type { MessagePackDecoder } from "./msgpack.js";
import type { Subscriptions } from "./subscriptions.js";

/**
 * In order of preference:
 *  - `stream`: a chunked response read with fetch + ReadableStream, each message decoded as it arrives;
 *  - `sse`: Server-Sent Events (EventSource; JSON; Herald only);
 *  - `longpoll`: one reply per request, held by the server until there is something to say;
 *  - `poll`: short polling, one immediate reply every `pollInterval`.
 */
export type TransportName = "stream" | "sse" | "longpoll" | "poll";

export type Outcome =
  | { kind: "done"; poll?: boolean } // ended normally; poll: answered at once, ask again at the polling pace
  | { kind: "failed"; error: unknown } // network or server error: back off
  | { kind: "unsupported"; reason: string } // this transport does not work here: fall back
  | { kind: "rate-limited"; retryAfter: string | null } // 429, with its Retry-After header
  | { kind: "interrupted" }; // aborted on purpose: subscriptions changed, stop, offline, visible again

/** What a transport is given: the client's settings and subscriptions, and a place for its abort. */
export interface Link {
  readonly baseUrl: string;
  readonly clientId: string;
  readonly subs: Subscriptions;
  readonly decoder: MessagePackDecoder;
  readonly fetchImpl: typeof fetch;
  readonly headers: Record<string, string>;
  readonly options: { readonly msgpack: boolean; readonly firstChunkTimeout: number; readonly requestTimeout: number };
  /** The `__seq` of the last POST (message_bus's clients number their requests). */
  seq: number;
  onError(error: unknown): void;
  /** Set while a request is in flight: ends it, and it returns `interrupted`. */
  abort: (() => void) | null;
}

export type Transport = (link: Link, name: TransportName) => Promise<Outcome>;

/** `channel=lastId&...`: the position to resume from on every subscribed channel. */
export function positions(link: Link): string {
  const parts: string[] = [];
  link.subs.request().forEach((lastId, channel) => parts.push(`${encodeURIComponent(channel)}=${lastId}`));
  return parts.join("&");
}
