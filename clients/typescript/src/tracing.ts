/**
 * The caller's trace, carried to the sidecar: when the application has `@opentelemetry/api` (an optional
 * peer) and a span is active, every call sends the active context through the registered propagator and,
 * whatever that propagator writes, a W3C `traceparent` (what the sidecar reads), so its SERVER span joins
 * the caller's trace. Without the package, or with no span active, nothing is added and nothing is loaded
 * beyond one failed import.
 *
 * The client's own spans (`startCall`), when an OpenTelemetry SDK is registered: a CLIENT span around each
 * call, its retries included, named as the sidecar names its span of that call
 * (`memlane.v1.ContextService/AssembleContext`, with the RPC attributes) or, for the memory operations of
 * the OpenTelemetry GenAI memory conventions, by that operation (`search_memory`, `create_memory`,
 * `update_memory`, `delete_memory`) with its `gen_ai.*` attributes, as the Python client does. The call
 * then sends the CLIENT span's context, so the sidecar's SERVER span is its child.
 */
import { ConnectError, type Interceptor } from "@connectrpc/connect";

type OtelApi = typeof import("@opentelemetry/api");
type Span = import("@opentelemetry/api").Span;
type Context = import("@opentelemetry/api").Context;

let loaded: Promise<OtelApi | undefined> | undefined;

/** `@opentelemetry/api` when it is installed; imported once, on the first call that needs it. */
function otel(): Promise<OtelApi | undefined> {
  loaded ??= import("@opentelemetry/api").catch(() => undefined);
  return loaded;
}

/** The propagation headers of `active` (empty when it holds no span or OpenTelemetry is absent). */
function traceHeaders(api: OtelApi, active: Context = api.context.active()): Record<string, string> {
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

/** The RPCs that are memory operations of the GenAI memory conventions: their spans carry its names. */
const MEMORY_OPERATIONS: Record<string, string> = {
  SearchMemories: "search_memory",
  CreateMemory: "create_memory",
  UpdateMemory: "update_memory",
  DeleteMemory: "delete_memory",
};

/** One call's CLIENT span. */
export interface CallSpan {
  /** The span's propagation headers, for the call to send. */
  headers(): Record<string, string>;
  /** What the response says of the operation (a search's record count). */
  answered(response: unknown): void;
  end(error?: unknown): void;
}

/** A CLIENT span for one call of `service`/`method`, or undefined when no SDK records it. */
export async function startCall(service: string, method: string): Promise<CallSpan | undefined> {
  const api = await otel();
  if (api === undefined) return undefined;
  const attributes: Record<string, string> = { "rpc.system": "grpc", "rpc.service": service, "rpc.method": method };
  const operation = service === "memlane.v1.MemoryService" ? MEMORY_OPERATIONS[method] : undefined;
  if (operation !== undefined) {
    Object.assign(attributes, {
      "gen_ai.operation.name": operation,
      "gen_ai.provider.name": "memlane",
      "gen_ai.memory.store.id": "ltm",
    });
  }
  const parent = api.context.active();
  const span: Span = api.trace
    .getTracer("memlane")
    .startSpan(operation ?? `${service}/${method}`, { kind: api.SpanKind.CLIENT, attributes }, parent);
  if (!span.isRecording()) return undefined;
  const own = api.trace.setSpan(parent, span);
  return {
    headers: () => traceHeaders(api, own),
    answered: (response) => {
      const results = (response as { results?: unknown[] } | undefined)?.results;
      if (operation === "search_memory" && Array.isArray(results)) {
        span.setAttribute("gen_ai.memory.record.count", results.length);
      }
    },
    end: (error) => {
      if (error === undefined) {
        span.setAttribute("rpc.grpc.status_code", 0);
      } else {
        const code = ConnectError.from(error).code;
        span.setAttribute("rpc.grpc.status_code", code);
        span.setAttribute("error.type", String(code));
        span.setStatus({ code: api.SpanStatusCode.ERROR, message: String(code) });
      }
      span.end();
    },
  };
}
