// <herald-subscription channel="/chat">: a subscription that lives as long as the element is in the document,
// as turbo-rails' <turbo-cable-stream-source> does. Turbo Drive and Turbo Frames replace the body or a frame:
// the old element leaves (unsubscribes), the new one arrives (subscribes), so a page visited ten times listens
// once, with no lifecycle code in the page.
//
// Each message is dispatched on the element as a bubbling, cancelable `herald:message` CustomEvent, detail
// { channel, data, globalId, messageId }. With the `turbo-stream` attribute, a message whose data is a String
// (or has a String `html`) is then applied with Turbo.renderStreamMessage (<turbo-stream> elements) when Turbo
// is on the page, unless a listener called preventDefault(). `last-id` (default -1: new messages only) asks for
// the backlog after that id. The channel is read when the element is connected.
import type { MessageBusFacade, MessageBusCallback } from "./facade.js";

export interface HeraldMessageDetail {
  channel: string;
  data: unknown;
  globalId: number;
  messageId: number;
}

interface TurboGlobal {
  renderStreamMessage(html: string): void;
}

type Facade = Pick<MessageBusFacade, "subscribe" | "unsubscribe">;

/** Defines <herald-subscription>, subscribing through the MessageBus facade `bus` returns (the page's client). */
export function defineSubscriptionElement(bus: () => Facade): void {
  if (typeof customElements === "undefined" || customElements.get("herald-subscription")) return;

  class HeraldSubscriptionElement extends HTMLElement {
    private unsubscribe: (() => void) | null = null;

    connectedCallback(): void {
      const channel = this.getAttribute("channel");
      if (!channel || this.unsubscribe) return;
      const fn: MessageBusCallback = (data, globalId, messageId) => {
        const detail: HeraldMessageDetail = { channel, data, globalId, messageId };
        if (this.dispatchEvent(new CustomEvent("herald:message", { detail, bubbles: true, cancelable: true })) && this.hasAttribute("turbo-stream")) {
          const html = typeof data === "string" ? data : (data as { html?: unknown } | null)?.html;
          const turbo = (globalThis as { Turbo?: TurboGlobal }).Turbo;
          if (typeof html === "string" && turbo) turbo.renderStreamMessage(html);
        }
      };
      bus().subscribe(channel, fn, Number(this.getAttribute("last-id") ?? -1));
      this.unsubscribe = () => bus().unsubscribe(channel, fn);
    }

    disconnectedCallback(): void {
      this.unsubscribe?.();
      this.unsubscribe = null;
    }
  }

  customElements.define("herald-subscription", HeraldSubscriptionElement);
}
