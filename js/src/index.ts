// The package's public API: the client, the MessageBus facade, the <herald-subscription> element, and the
// types their options and callbacks name. Everything else (transports, framing, the decoder) is internal.
export { Herald, TRANSPORTS } from "./client.js";
export type { HeraldOptions, SubscribeOptions, Status, TransportName, Diagnostics } from "./client.js";
export type { Message, Callback, ResetEvent } from "./subscriptions.js";
export type { BackoffOptions } from "./backoff.js";
export type { MessagePackDecoder } from "./msgpack.js";
export { createMessageBus } from "./facade.js";
export type { MessageBusFacade, MessageBusCallback } from "./facade.js";
export { defineSubscriptionElement } from "./element.js";
export type { HeraldMessageDetail } from "./element.js";
