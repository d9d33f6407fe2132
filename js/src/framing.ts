// Turning response bytes into messages, as they arrive. Three body shapes (docs/protocol.md 1.4, 1.5 and
// Herald's MessagePack addition):
//   application/vnd.msgpack     a sequence of MessagePack arrays of message maps (one for a poll reply)
//   text/plain (a JSON stream)  JSON arrays, each followed by "\r\n|\r\n" ("\r\n||\r\n" escapes it inside)
//   application/json            one JSON array, the whole body
import { Decoder, INCOMPLETE, type MessagePackDecoder } from "./msgpack.js";

/** What every reader calls for each message (or `/__status` entry), in order. */
export type Sink = (message: unknown) => void;

export interface BodyReader {
  push(chunk: Uint8Array): void;
  /** The body ended; throws if it ended in the middle of something. */
  finish(): void;
}

export const SEPARATOR = "\r\n|\r\n";
const JOINT = 4096; // bytes of a new chunk joined to the rest of the last one
const ESCAPED_SEPARATOR = /\r\n\|\|\r\n/g;

/**
 * MessagePack: each element of a top-level array goes to the sink as soon as its bytes are in, so the
 * first message of a large backlog is delivered while the rest is still arriving.
 */
export class MessagePackReader implements BodyReader {
  private buf: Uint8Array = new Uint8Array(0);
  private len = 0; // bytes of buf in use
  private pos = 0; // next unread byte
  private left = 0; // elements of the current array not yet read
  private stuck = false; // the last attempt ran out of bytes: check completeness cheaply before decoding again

  constructor(private sink: Sink, private decoder: MessagePackDecoder = new Decoder()) {}

  push(chunk: Uint8Array): void {
    const rest = this.len - this.pos;
    if (rest > 0 && rest < JOINT && chunk.length > JOINT) {
      // A value cut by the edge of the last chunk: read it from a small joint of its start and this chunk's
      // beginning, then go on in the chunk itself (appending the whole chunk to the rest cost a 64 KiB copy
      // and allocation per chunk, 14% of a cold run's profile).
      const joint = new Uint8Array(rest + JOINT);
      joint.set(this.buf.subarray(this.pos, this.len));
      joint.set(chunk.subarray(0, JOINT), rest);
      this.buf = joint;
      this.pos = 0;
      this.len = joint.length;
      this.read(rest);
      if (this.pos >= rest) {
        this.buf = chunk;
        this.pos -= rest;
        this.len = chunk.length;
      } else {
        this.len = rest; // a longer value: its start, then the whole chunk
        this.append(chunk);
      }
    } else {
      this.append(chunk);
    }
    this.read(Infinity);
  }

  // Reads values while they start before `limit`.
  private read(limit: number): void {
    const d = this.decoder;
    while (this.pos < limit) {
      if (this.left === 0) {
        if (this.pos >= this.len) break;
        const header = this.arrayHeader();
        if (header < 0) break;
        this.left = header;
        continue;
      }
      if (this.stuck && d instanceof Decoder && d.skip(this.buf, this.pos, this.len) < 0) break;
      const value = d.decode(this.buf, this.pos, this.len);
      if (value === INCOMPLETE) {
        this.stuck = true;
        break;
      }
      this.stuck = false;
      this.pos = d.end;
      this.left--;
      this.sink(value);
    }
  }

  finish(): void {
    if (this.left > 0 || this.pos < this.len) throw new Error("MessagePack body ended in the middle of a message");
  }

  // Keeps only the unread tail; a chunk that arrives with nothing pending is used as is, without a copy.
  private append(chunk: Uint8Array): void {
    const rest = this.len - this.pos;
    if (rest === 0) {
      this.buf = chunk;
      this.len = chunk.length;
      this.pos = 0;
      return;
    }
    if (this.buf.length - this.len >= chunk.length && this.pos === 0) {
      this.buf.set(chunk, this.len);
      this.len += chunk.length;
      return;
    }
    const size = Math.max(rest + chunk.length, rest * 2);
    const next = new Uint8Array(size);
    next.set(this.buf.subarray(this.pos, this.len), 0);
    next.set(chunk, rest);
    this.buf = next;
    this.len = rest + chunk.length;
    this.pos = 0;
  }

  // The element count of the array starting at pos (and moves past its header); -1 if incomplete.
  private arrayHeader(): number {
    const b = this.buf;
    const p = this.pos;
    const t = b[p];
    if (t >= 0x90 && t <= 0x9f) {
      this.pos = p + 1;
      return t & 0x0f;
    }
    if (t === 0xdc) {
      if (p + 3 > this.len) return -1;
      this.pos = p + 3;
      return (b[p + 1] << 8) | b[p + 2];
    }
    if (t === 0xdd) {
      if (p + 5 > this.len) return -1;
      this.pos = p + 5;
      return ((b[p + 1] << 24) >>> 0) + ((b[p + 2] << 16) | (b[p + 3] << 8) | b[p + 4]);
    }
    throw new Error(`MessagePack body: expected an array, got type byte 0x${t.toString(16)}`);
  }
}

/**
 * message_bus's chunked JSON stream: segments split on the separator, each one JSON array. The separator
 * is looked for in each chunk's bytes as it arrives (never in the text received so far, which would be
 * quadratic on a large backlog), and a segment is decoded once, when its end is in. A chunk is kept as a
 * view, not copied: joining each 64 KiB chunk to the previous one's last bytes cost ~120 ms per 50 MB.
 */
export class JsonStreamReader implements BodyReader {
  private parts: Uint8Array[] = []; // bytes of the current segment, before `tail`
  private tail: Uint8Array = EMPTY; // the last bytes seen (< 5): maybe the start of a separator

  constructor(private sink: Sink) {}

  push(chunk: Uint8Array): void {
    if (chunk.length < 4) return this.scan(join(this.tail, chunk), 0); // a tiny piece: copying is cheap
    let start = 0;
    if (this.tail.length) {
      // A separator that begins in the tail ends within the chunk's first 4 bytes.
      const window = join(this.tail, chunk.subarray(0, 4));
      const at = separatorBefore(window, this.tail.length);
      if (at >= 0) {
        this.parts.push(window.subarray(0, at));
        this.segment();
        start = at + SEPARATOR_BYTES - this.tail.length;
      } else {
        this.parts.push(this.tail);
      }
      this.tail = EMPTY;
    }
    this.scan(chunk, start);
  }

  finish(): void {
    this.parts.push(this.tail);
    this.tail = EMPTY;
    const rest = new TextDecoder("utf-8").decode(concat(this.parts));
    this.parts = [];
    if (rest.trim() !== "") throw new Error("JSON stream ended in the middle of a segment");
  }

  // Cuts a segment at every separator in bytes from start; keeps the last 4 bytes (maybe the start of a
  // separator) as the tail.
  private scan(bytes: Uint8Array, start: number): void {
    let i = start;
    while ((i = bytes.indexOf(13, i)) >= 0 && i + SEPARATOR_BYTES <= bytes.length) {
      if (separatorAt(bytes, i)) {
        this.parts.push(bytes.subarray(start, i));
        this.segment();
        start = i + SEPARATOR_BYTES;
        i = start;
      } else {
        i++;
      }
    }
    const keep = Math.max(start, bytes.length - 4);
    if (keep > start) this.parts.push(bytes.subarray(start, keep));
    this.tail = bytes.slice(keep);
  }

  private segment(): void {
    let json = new TextDecoder("utf-8").decode(concat(this.parts));
    this.parts = [];
    if (json.indexOf("||") >= 0) json = json.replace(ESCAPED_SEPARATOR, SEPARATOR);
    deliverArray(JSON.parse(json), this.sink);
  }
}

/** A plain JSON reply: the whole body is one array. */
export class JsonBodyReader implements BodyReader {
  private parts: Uint8Array[] = [];

  constructor(private sink: Sink) {}

  push(chunk: Uint8Array): void {
    this.parts.push(chunk);
  }

  finish(): void {
    const body = new TextDecoder("utf-8").decode(concat(this.parts));
    this.parts = [];
    if (body.trim() === "") return;
    deliverArray(JSON.parse(body), this.sink);
  }
}

const EMPTY = new Uint8Array(0);
const SEPARATOR_BYTES = 5; // "\r\n|\r\n"

function separatorAt(b: Uint8Array, i: number): boolean {
  return b[i] === 13 && b[i + 1] === 10 && b[i + 2] === 124 && b[i + 3] === 13 && b[i + 4] === 10;
}

// The first separator in b starting before `before` (and wholly in b), or -1.
function separatorBefore(b: Uint8Array, before: number): number {
  for (let i = 0; i < before && i + SEPARATOR_BYTES <= b.length; i++) if (separatorAt(b, i)) return i;
  return -1;
}

function join(a: Uint8Array, b: Uint8Array): Uint8Array {
  if (!a.length) return b;
  const out = new Uint8Array(a.length + b.length);
  out.set(a, 0);
  out.set(b, a.length);
  return out;
}

function deliverArray(value: unknown, sink: Sink): void {
  if (!Array.isArray(value)) throw new Error("expected a JSON array of messages");
  for (let i = 0; i < value.length; i++) sink(value[i]);
}

function concat(parts: Uint8Array[]): Uint8Array {
  if (parts.length === 1) return parts[0];
  let size = 0;
  for (const p of parts) size += p.length;
  const out = new Uint8Array(size);
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

/** The reader for a response's content type. */
export function readerFor(contentType: string | null, sink: Sink, decoder?: MessagePackDecoder): BodyReader {
  // message_bus's hijacked streams repeat the content type: "application/json; charset=utf-8, text/plain;
  // charset=utf-8" (a browser joins the two headers). Streaming wins, as in message-bus.js.
  const type = (contentType || "").toLowerCase();
  if (type.includes("application/vnd.msgpack")) return new MessagePackReader(sink, decoder);
  if (type.includes("application/json") && !type.includes("text/plain")) return new JsonBodyReader(sink);
  return new JsonStreamReader(sink);
}
