// `sse`: Server-Sent Events from {base}message-bus/{clientId}/sse. The client reconnects itself (not
// EventSource) so that it resumes from its own per-channel ids: the stream the server closes after 25 s, or a
// broken one, ends the request.
import { positions, type Link, type Outcome } from "./transport.js";

export function sse(link: Link): Promise<Outcome> {
  if (typeof EventSource === "undefined") return Promise.resolve({ kind: "unsupported", reason: "no EventSource" });
  const url = `${link.baseUrl}message-bus/${link.clientId}/sse?${positions(link)}`;
  return new Promise<Outcome>((resolve) => {
    const source = new EventSource(url, { withCredentials: false });
    let opened = false;
    let settled = false;
    const timer = setTimeout(() => finish({ kind: "failed", error: new Error("SSE: no end within requestTimeout") }), link.options.requestTimeout);
    const finish = (outcome: Outcome) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      source.close();
      if (link.abort === interrupt) link.abort = null;
      resolve(outcome);
    };
    const interrupt = () => finish({ kind: "interrupted" });
    link.abort = interrupt;
    const deliver = (event: MessageEvent) => {
      try {
        link.subs.deliver(JSON.parse(event.data));
      } catch (error) {
        link.onError(error);
      }
    };
    source.onopen = () => {
      opened = true;
    };
    source.onmessage = deliver;
    source.addEventListener("status", deliver as EventListener);
    source.onerror = () => {
      if (opened) return finish({ kind: "done" });
      // Never opened: the server is down, or does not speak SSE (message_bus answers JSON). Ask it.
      source.close();
      probe(link, url).then(finish);
    };
  });
}

async function probe(link: Link, url: string): Promise<Outcome> {
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(), 5000);
  try {
    const response = await link.fetchImpl(url, { headers: { Accept: "text/event-stream" }, signal: controller.signal, cache: "no-store" });
    const type = response.headers.get("content-type") || "";
    controller.abort();
    if (response.status === 429) return { kind: "rate-limited", retryAfter: response.headers.get("retry-after") };
    if (response.ok && type.startsWith("text/event-stream")) return { kind: "failed", error: new Error("SSE connection failed") };
    if (response.status >= 500) return { kind: "failed", error: new Error(`HTTP ${response.status}`) };
    return { kind: "unsupported", reason: `the server answers ${response.status} ${type}, not an event stream` };
  } catch (error) {
    return { kind: "failed", error };
  } finally {
    clearTimeout(timer);
  }
}
