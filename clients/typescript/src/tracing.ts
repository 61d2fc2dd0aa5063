/**
 * The caller's trace, carried to the sidecar: when the application has `@opentelemetry/api` (an optional
 * peer) and a span is active, every call sends the active context through the registered propagator and,
 * whatever that propagator writes, a W3C `traceparent` (what the sidecar reads), so its SERVER span is a
 * child of the caller's span. Without the package, or with no span active, nothing is added and nothing
 * is loaded beyond one failed import.
 */
import type { Interceptor } from "@connectrpc/connect";

type OtelApi = typeof import("@opentelemetry/api");

let loaded: Promise<OtelApi | undefined> | undefined;

/** `@opentelemetry/api` when it is installed; imported once, on the first call that needs it. */
function otel(): Promise<OtelApi | undefined> {
  loaded ??= import("@opentelemetry/api").catch(() => undefined);
  return loaded;
}

/** The active context's propagation headers (empty when no span is active or OpenTelemetry is absent). */
function traceHeaders(api: OtelApi): Record<string, string> {
  const active = api.context.active();
  const span = api.trace.getSpanContext(active);
  if (span === undefined || !api.isSpanContextValid(span)) return {};
  const carrier: Record<string, string> = {};
  api.propagation.inject(active, carrier);
  // No propagator registered (the API's default is a no-op) or another format: the sidecar reads W3C.
  const sampled = (span.traceFlags & api.TraceFlags.SAMPLED) === api.TraceFlags.SAMPLED;
  carrier.traceparent ??= `00-${span.traceId}-${span.spanId}-${sampled ? "01" : "00"}`;
  return carrier;
}

/** Sends the caller's active trace context with every call (headers an earlier interceptor set win). */
export function traceContext(): Interceptor {
  return (next) => async (req) => {
    const api = await otel();
    if (api !== undefined) {
      for (const [name, value] of Object.entries(traceHeaders(api))) {
        if (!req.header.has(name)) req.header.set(name, value);
      }
    }
    return await next(req);
  };
}

/** Runs `work` in a span named `name` when OpenTelemetry is present and no span is active, so the calls
 * of one high-level operation (`Memlane.add`: CreateSession then AppendMessages) share one trace; under
 * a caller's span they are in its trace already and no span is added. */
export async function inSpan<T>(name: string, work: () => Promise<T>): Promise<T> {
  const api = await otel();
  const current = api?.trace.getActiveSpan()?.spanContext();
  if (api === undefined || (current !== undefined && api.isSpanContextValid(current))) return await work();
  return await api.trace.getTracer("memlane").startActiveSpan(name, async (span) => {
    try {
      return await work();
    } catch (err) {
      span.setStatus({ code: api.SpanStatusCode.ERROR, message: err instanceof Error ? err.name : "error" });
      throw err;
    } finally {
      span.end();
    }
  });
}
