// `stream`, `longpoll` and `poll`: one POST to {base}message-bus/{clientId}/poll, its reply read with fetch as it
// arrives. They differ in a few settings: `stream` asks for a chunked reply (and falls back when a proxy buffers
// it), `longpoll` for one held reply, `poll` for an immediate one (`?dlp=t`) at the polling pace.
import { readerFor, type BodyReader } from "./framing.js";
import { positions, type Link, type Outcome, type TransportName } from "./transport.js";

const MSGPACK = "application/vnd.msgpack";
const EPOCH_HEADER = "herald-epoch"; // Herald's store epoch, on its MessagePack replies

export async function http(link: Link, transport: TransportName): Promise<Outcome> {
  const controller = new AbortController();
  let why: "interrupted" | "timeout" | null = null;
  const end = (reason: typeof why) => {
    if (why === null) why = reason;
    controller.abort();
  };
  link.abort = () => end("interrupted");
  const streaming = transport === "stream";
  const poll = transport === "poll";
  const timeout = poll ? 30000 : link.options.requestTimeout;
  const timer = setTimeout(() => end("timeout"), timeout);
  const headers: Record<string, string> = {
    "Content-Type": "application/x-www-form-urlencoded",
    "X-SILENCE-LOGGER": "true",
    ...link.headers,
  };
  if (link.options.msgpack) headers.Accept = `${MSGPACK}, application/json;q=0.9`;
  if (!streaming) headers["Dont-Chunk"] = "true";
  const url = `${link.baseUrl}message-bus/${link.clientId}/poll`;
  const started = Date.now();
  try {
    const response = await link.fetchImpl(url + (poll ? "?dlp=t" : ""), {
      method: "POST",
      headers,
      body: `${positions(link)}&__seq=${++link.seq}`,
      signal: controller.signal,
      credentials: "same-origin",
      cache: "no-store",
    });
    const epochChanged = response.ok && !link.subs.checkEpoch(response.headers.get(EPOCH_HEADER));
    if (!response.ok || epochChanged) {
      await response.body?.cancel().catch(() => {});
      if (response.status === 429) return { kind: "rate-limited", retryAfter: response.headers.get("retry-after") };
      // A new epoch: another store answers (wiped, flushed, replaced): ask again at once from its position.
      return epochChanged ? { kind: "done" } : { kind: "failed", error: new Error(`HTTP ${response.status} from ${url}`) };
    }
    let received = 0;
    const reader = readerFor(response.headers.get("content-type"), (m) => {
      received++;
      link.subs.deliver(m);
    }, link.decoder);
    if (!response.body) {
      if (streaming) return { kind: "unsupported", reason: "no response body stream" };
      reader.push(new Uint8Array(await response.arrayBuffer()));
      reader.finish();
    } else {
      const headersAt = Date.now();
      let firstByteAt = 0;
      await drain(response.body, reader, () => {
        if (!firstByteAt) firstByteAt = Date.now();
      });
      const buffered = firstByteAt - headersAt > link.options.firstChunkTimeout && Date.now() - firstByteAt < 250;
      if (streaming && buffered) return { kind: "unsupported", reason: `the body came all at once after ${firstByteAt - headersAt} ms (a buffering proxy?)` };
    }
    // A server that does not hold requests (message_bus without rack.hijack) answers an empty reply at
    // once: poll it at the polling pace rather than spin.
    return { kind: "done", poll: poll || (received === 0 && Date.now() - started <= 1000) };
  } catch (error) {
    if (why === "interrupted") return { kind: "interrupted" };
    return { kind: "failed", error: why === "timeout" ? new Error(`no reply within ${timeout} ms`) : error };
  } finally {
    clearTimeout(timer);
    link.abort = null;
    link.decoder.release?.(); // the decoder would keep the last body's bytes alive between requests
  }
}

async function drain(body: ReadableStream<Uint8Array>, reader: BodyReader, onBytes: () => void): Promise<void> {
  const stream = body.getReader();
  try {
    for (;;) {
      const { value, done } = await stream.read();
      if (done) break;
      if (value && value.length) {
        onBytes();
        reader.push(value);
      }
    }
    reader.finish();
  } finally {
    stream.releaseLock();
  }
}
