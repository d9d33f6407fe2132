// Reconnect delays: exponential backoff with full jitter (a uniformly random wait in [0, min(cap,
// base * 2^attempt))), so a thousand tabs that lost the same server do not all come back in the same
// instant; and the wait a 429's Retry-After asks for.

export interface BackoffOptions {
  /** The first retry waits up to this many ms (default 500). */
  base?: number;
  /** No wait is longer than this (default 30 000 ms). */
  cap?: number;
  /** A source of [0, 1) numbers; Math.random by default (tests pass their own). */
  random?: () => number;
}

export class Backoff {
  attempt = 0;
  readonly base: number;
  readonly cap: number;
  private random: () => number;

  constructor({ base = 500, cap = 30000, random = Math.random }: BackoffOptions = {}) {
    this.base = base;
    this.cap = cap;
    this.random = random;
  }

  /** The wait before the next retry after one more failure. */
  next(): number {
    const ceiling = Math.min(this.cap, this.base * 2 ** Math.min(this.attempt, 30));
    this.attempt++;
    return Math.floor(this.random() * ceiling);
  }

  reset(): void {
    this.attempt = 0;
  }
}

/**
 * Milliseconds a Retry-After header asks for (seconds or an HTTP date), at least `floor`; `fallback` when
 * the header is missing or unreadable.
 */
export function retryAfter(header: string | null, fallback: number, floor = 0, now = Date.now()): number {
  if (header) {
    const text = header.trim();
    if (/^\d+$/.test(text)) return Math.max(floor, Number(text) * 1000);
    const date = Date.parse(text);
    if (!Number.isNaN(date)) return Math.max(floor, date - now);
  }
  return Math.max(floor, fallback);
}
