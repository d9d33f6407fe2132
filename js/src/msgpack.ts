// A MessagePack decoder, decode-only, for what Herald sends: a stream of arrays of message maps.
// It is small (about 1.3 KB gzip) and decodes one value at a time from any offset, so the stream reader
// can hand each message of a 250,000-message backlog to its callbacks while the rest is still arriving.
// What keeps it fast in Chromium, each measured (bench/js_client/RESULTS.md): one reused instance; strings
// up to 200 bytes decoded in JavaScript into reused arrays and made by one String.fromCharCode (a
// TextDecoder call costs about 2 us there), longer ones with TextDecoder; a cache of short map keys; maps
// built by a constructor, so that V8 keeps all their properties inline.

/** Returned by {@link MessagePackDecoder.decode} when the bytes end before the value does. */
export const INCOMPLETE: unique symbol = Symbol("incomplete");

/** The one interface the client needs from a decoder, so another implementation can be swapped in. */
export interface MessagePackDecoder {
  /**
   * Decodes the value starting at `offset` in `bytes[0, length)`. Returns it and leaves `end` at the offset
   * after it, or returns {@link INCOMPLETE} when those bytes hold only a part of the value. Between calls
   * with the same array, its bytes before `length` must not change (more may be appended).
   */
  decode(bytes: Uint8Array, offset: number, length: number): unknown;
  readonly end: number;
  /** Drops every reference to the last bytes decoded (called when a response ends). */
  release?(): void;
}

/** A MessagePack extension value other than the timestamp (which decodes to a Date). */
export class ExtValue {
  constructor(readonly type: number, readonly data: Uint8Array) {}
}

const SHORT_STRING = 200; // bytes; longer strings go through TextDecoder (faster past this length)
const KEY_CACHE_MAX_LENGTH = 16;
const KEY_CACHE_PER_LENGTH = 16;

// Objects made by a constructor get room for all their properties inside the object (V8's slack tracking),
// where `{}` has room for four and puts the rest in a separate array. The prototype is Object.prototype:
// the objects cannot be told apart from literals.
function PlainObject() {}
PlainObject.prototype = Object.prototype;
const newObject = (): Record<string, unknown> => new (PlainObject as unknown as new () => Record<string, unknown>)();

class Incomplete {}
const MORE = new Incomplete();

export class Decoder implements MessagePackDecoder {
  end = 0;
  private b: Uint8Array = new Uint8Array(0);
  private v: DataView = new DataView(new ArrayBuffer(0));
  private p = 0;
  private n = 0;
  private text = new TextDecoder("utf-8");
  private keys: Array<Array<{ bytes: Uint8Array; value: string }>> = [];
  // Strings are built in `scratch`, then copied to units[n], an array of exactly n elements kept for strings
  // of n UTF-16 units, for String.fromCharCode.apply: one reused array, cut to each string's length, was
  // trimmed and grown again and again (renderer main-thread CPU for 50k ASCII messages 68 -> 60 ms).
  private units: number[][] = [];
  private scratch: number[] = new Array(SHORT_STRING).fill(0);

  decode(bytes: Uint8Array, offset: number, length: number = bytes.length): unknown {
    this.at(bytes, offset, length);
    try {
      const value = this.read();
      this.end = this.p;
      return value;
    } catch (e) {
      if (e === MORE) return INCOMPLETE;
      throw e;
    }
  }

  /** The offset after the value at `offset`, without building it; -1 when the bytes end first. */
  skip(bytes: Uint8Array, offset: number, length: number = bytes.length): number {
    this.at(bytes, offset, length);
    try {
      this.pass();
      return this.p;
    } catch (e) {
      if (e === MORE) return -1;
      throw e;
    }
  }

  // Where the next decode or skip reads (the DataView belongs to one array).
  private at(bytes: Uint8Array, offset: number, length: number): void {
    if (bytes !== this.b) {
      this.b = bytes;
      this.v = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    }
    this.p = offset;
    this.n = length;
  }

  release(): void {
    this.b = new Uint8Array(0);
    this.v = new DataView(this.b.buffer);
  }

  private need(count: number): void {
    if (this.p + count > this.n) throw MORE;
  }

  private read(): unknown {
    this.need(1);
    const t = this.b[this.p++];
    if (t < 0x80) return t;
    if (t >= 0xe0) return t - 0x100;
    if (t < 0x90) return this.map(t & 0x0f);
    if (t < 0xa0) return this.array(t & 0x0f);
    if (t < 0xc0) return this.str(t & 0x1f);
    const v = this.v;
    let p = this.p;
    switch (t) {
      case 0xc0: return null;
      case 0xc2: return false;
      case 0xc3: return true;
      case 0xcc: this.need(1); this.p = p + 1; return this.b[p];
      case 0xcd: this.need(2); this.p = p + 2; return v.getUint16(p);
      case 0xce: this.need(4); this.p = p + 4; return v.getUint32(p);
      case 0xcf: this.need(8); this.p = p + 8; return v.getUint32(p) * 4294967296 + v.getUint32(p + 4);
      case 0xd0: this.need(1); this.p = p + 1; return v.getInt8(p);
      case 0xd1: this.need(2); this.p = p + 2; return v.getInt16(p);
      case 0xd2: this.need(4); this.p = p + 4; return v.getInt32(p);
      case 0xd3: this.need(8); this.p = p + 8; return v.getInt32(p) * 4294967296 + v.getUint32(p + 4);
      case 0xca: this.need(4); this.p = p + 4; return v.getFloat32(p);
      case 0xcb: this.need(8); this.p = p + 8; return v.getFloat64(p);
      case 0xd9: this.need(1); this.p = p + 1; return this.str(this.b[p]);
      case 0xda: this.need(2); this.p = p + 2; return this.str(v.getUint16(p));
      case 0xdb: this.need(4); this.p = p + 4; return this.str(v.getUint32(p));
      case 0xc4: this.need(1); this.p = p + 1; return this.bin(this.b[p]);
      case 0xc5: this.need(2); this.p = p + 2; return this.bin(v.getUint16(p));
      case 0xc6: this.need(4); this.p = p + 4; return this.bin(v.getUint32(p));
      case 0xdc: this.need(2); this.p = p + 2; return this.array(v.getUint16(p));
      case 0xdd: this.need(4); this.p = p + 4; return this.array(v.getUint32(p));
      case 0xde: this.need(2); this.p = p + 2; return this.map(v.getUint16(p));
      case 0xdf: this.need(4); this.p = p + 4; return this.map(v.getUint32(p));
      case 0xd4: return this.ext(1);
      case 0xd5: return this.ext(2);
      case 0xd6: return this.ext(4);
      case 0xd7: return this.ext(8);
      case 0xd8: return this.ext(16);
      case 0xc7: this.need(1); this.p = p + 1; return this.ext(this.b[p]);
      case 0xc8: this.need(2); this.p = p + 2; return this.ext(v.getUint16(p));
      case 0xc9: this.need(4); this.p = p + 4; return this.ext(v.getUint32(p));
    }
    throw new Error(`MessagePack: unknown type byte 0x${t.toString(16)} at ${p - 1}`);
  }

  private array(count: number): unknown[] {
    const out = new Array(count);
    for (let i = 0; i < count; i++) out[i] = this.read();
    return out;
  }

  private map(count: number): Record<string, unknown> {
    const out = newObject();
    for (let i = 0; i < count; i++) {
      const key = this.key();
      const value = this.read();
      if (key === "__proto__") Object.defineProperty(out, key, { value, enumerable: true, writable: true, configurable: true });
      else out[key] = value;
    }
    return out;
  }

  // Map keys repeat in every message ("global_id", "channel", the app's own field names): short ones are
  // looked up by their bytes instead of being decoded again.
  private key(): string {
    this.need(1);
    const t = this.b[this.p];
    let length = -1;
    if (t >= 0xa0 && t < 0xc0) length = t & 0x1f;
    else if (t === 0xd9) { this.need(2); length = this.b[this.p + 1]; }
    if (length < 1 || length > KEY_CACHE_MAX_LENGTH) {
      const key = this.read();
      return typeof key === "string" ? key : String(key);
    }
    const start = this.p + (t === 0xd9 ? 2 : 1);
    this.p = start;
    this.need(length);
    const b = this.b;
    const bucket = this.keys[length] || (this.keys[length] = []);
    outer: for (let i = 0; i < bucket.length; i++) {
      const cached = bucket[i].bytes;
      for (let j = 0; j < length; j++) if (cached[j] !== b[start + j]) continue outer;
      this.p = start + length;
      return bucket[i].value;
    }
    const value = this.str(length);
    if (bucket.length < KEY_CACHE_PER_LENGTH) bucket.push({ bytes: b.slice(start, start + length), value });
    return value;
  }

  private str(length: number): string {
    this.need(length);
    const b = this.b;
    const start = this.p;
    const end = start + length;
    this.p = end;
    if (length > SHORT_STRING) return this.text.decode(b.subarray(start, end));
    return this.utf8(start, end);
  }

  // Short strings: UTF-16 units gathered in a reused array, then one String.fromCharCode (a `+=` per
  // character made an intermediate string each). Invalid UTF-8 falls back to TextDecoder, which
  // substitutes U+FFFD as it does everywhere else.
  private utf8(start: number, end: number): string {
    const b = this.b;
    const units = this.scratch;
    let n = 0;
    for (let i = start; i < end;) {
      const c = b[i++];
      if (c < 0x80) { units[n++] = c; continue; }
      if (c >= 0xc2 && c < 0xe0 && i < end && (b[i] & 0xc0) === 0x80) {
        units[n++] = ((c & 0x1f) << 6) | (b[i++] & 0x3f);
        continue;
      }
      if (c >= 0xe0 && c < 0xf0 && i + 1 < end && (b[i] & 0xc0) === 0x80 && (b[i + 1] & 0xc0) === 0x80) {
        const code = ((c & 0x0f) << 12) | ((b[i] & 0x3f) << 6) | (b[i + 1] & 0x3f);
        if (code >= 0x800 && (code < 0xd800 || code > 0xdfff)) { units[n++] = code; i += 2; continue; }
      } else if (c >= 0xf0 && c < 0xf5 && i + 2 < end && (b[i] & 0xc0) === 0x80 && (b[i + 1] & 0xc0) === 0x80 && (b[i + 2] & 0xc0) === 0x80) {
        const code = ((c & 0x07) << 18) | ((b[i] & 0x3f) << 12) | ((b[i + 1] & 0x3f) << 6) | (b[i + 2] & 0x3f);
        if (code >= 0x10000 && code <= 0x10ffff) {
          const u = code - 0x10000;
          units[n++] = 0xd800 | (u >> 10);
          units[n++] = 0xdc00 | (u & 0x3ff);
          i += 3;
          continue;
        }
      }
      return this.text.decode(b.subarray(start, end));
    }
    let out = this.units[n];
    if (!out) {
      out = [];
      for (let i = 0; i < n; i++) out.push(0);
      this.units[n] = out;
    }
    for (let i = 0; i < n; i++) out[i] = units[i];
    return String.fromCharCode.apply(null, out);
  }

  private bin(length: number): Uint8Array {
    this.need(length);
    const start = this.p;
    this.p = start + length;
    return this.b.slice(start, start + length); // a copy: the stream reader reuses its buffer
  }

  private ext(length: number): unknown {
    this.need(1 + length);
    const type = this.v.getInt8(this.p);
    const start = this.p + 1;
    this.p = start + length;
    if (type === -1) return timestamp(this.v, start, length);
    return new ExtValue(type, this.b.slice(start, start + length));
  }

  // The structure of one value, checked for completeness without building anything.
  private pass(): void {
    this.need(1);
    const t = this.b[this.p++];
    const v = this.v;
    const p = this.p;
    let skip = 0;
    let items = 0;
    if (t < 0x80 || t >= 0xe0 || t === 0xc0 || t === 0xc2 || t === 0xc3) return;
    if (t < 0x90) items = (t & 0x0f) * 2;
    else if (t < 0xa0) items = t & 0x0f;
    else if (t < 0xc0) skip = t & 0x1f;
    else {
      switch (t) {
        case 0xcc: case 0xd0: skip = 1; break;
        case 0xcd: case 0xd1: skip = 2; break;
        case 0xce: case 0xd2: case 0xca: skip = 4; break;
        case 0xcf: case 0xd3: case 0xcb: skip = 8; break;
        case 0xd9: case 0xc4: this.need(1); skip = 1 + this.b[p]; break;
        case 0xda: case 0xc5: this.need(2); skip = 2 + v.getUint16(p); break;
        case 0xdb: case 0xc6: this.need(4); skip = 4 + v.getUint32(p); break;
        case 0xdc: this.need(2); this.p += 2; items = v.getUint16(p); break;
        case 0xdd: this.need(4); this.p += 4; items = v.getUint32(p); break;
        case 0xde: this.need(2); this.p += 2; items = v.getUint16(p) * 2; break;
        case 0xdf: this.need(4); this.p += 4; items = v.getUint32(p) * 2; break;
        case 0xd4: skip = 2; break;
        case 0xd5: skip = 3; break;
        case 0xd6: skip = 5; break;
        case 0xd7: skip = 9; break;
        case 0xd8: skip = 17; break;
        case 0xc7: this.need(1); skip = 2 + this.b[p]; break;
        case 0xc8: this.need(2); skip = 3 + v.getUint16(p); break;
        case 0xc9: this.need(4); skip = 5 + v.getUint32(p); break;
        default: throw new Error(`MessagePack: unknown type byte 0x${t.toString(16)} at ${p - 1}`);
      }
    }
    if (skip) { this.need(skip); this.p += skip; }
    for (let i = 0; i < items; i++) this.pass();
  }
}

function timestamp(v: DataView, at: number, length: number): Date | ExtValue {
  if (length === 4) return new Date(v.getUint32(at) * 1000);
  if (length === 8) {
    const hi = v.getUint32(at);
    const lo = v.getUint32(at + 4);
    const seconds = (hi & 0x3) * 4294967296 + lo;
    return new Date(seconds * 1000 + (hi >>> 2) / 1e6);
  }
  if (length === 12) {
    const nanos = v.getUint32(at);
    const seconds = v.getInt32(at + 4) * 4294967296 + v.getUint32(at + 8);
    return new Date(seconds * 1000 + nanos / 1e6);
  }
  return new ExtValue(-1, new Uint8Array(v.buffer, v.byteOffset + at, length).slice());
}
