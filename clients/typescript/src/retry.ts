/**
 * Retry policy, as the Python client's: only calls that are safe to repeat (client-side ids make nearly
 * every write so), exponential backoff with full jitter. UNAVAILABLE is retried; so is
 * RESOURCE_EXHAUSTED when the server shed the call under load and said when to come back
 * (`retry-after-ms`): the wait is then at least that hint. Without the hint it is a limit, and final.
 */
import { Code } from "@connectrpc/connect";

export interface RetryPolicy {
  readonly maxAttempts: number;
  /** Seconds. */
  readonly initialBackoff: number;
  readonly maxBackoff: number;
  readonly multiplier: number;
  readonly retryable: ReadonlySet<Code>;
}

export const DEFAULT_RETRY: RetryPolicy = Object.freeze({
  maxAttempts: 4,
  initialBackoff: 0.05,
  maxBackoff: 1.0,
  multiplier: 2.0,
  retryable: new Set([Code.Unavailable]),
});

export const NO_RETRY: RetryPolicy = Object.freeze({ ...DEFAULT_RETRY, maxAttempts: 1 });

/** Seconds to sleep before retry number `attempt` (1-based); with a server hint, the hint plus jitter,
 * so shed callers do not all come back at once. */
export function backoff(policy: RetryPolicy, attempt: number, hint = 0): number {
  const cap = Math.min(policy.maxBackoff, policy.initialBackoff * policy.multiplier ** (attempt - 1));
  return (hint > 0 ? hint : 0) + Math.random() * cap;
}
