/** The caller's OpenTelemetry trace reaches the sidecar: with a tracer provider registered (an in-memory
 * exporter) each call is a CLIENT span of the client's under the agent's span, named as the sidecar names
 * its SERVER span of the call (or by its GenAI memory operation), and the sidecar's SERVER spans of
 * `Memlane.add()` and `Memlane.context()` are its children; with no span active, one `add()` is one trace
 * (a `memlane.add` span of the client's); `propagateTrace: false` leaves the calls out of it. The sidecar's spans are read from its own
 * console exporter (test/sidecar.ts turns it on). Interceptors of the caller's run on every call. */
import { readFileSync } from "node:fs";
import { type Interceptor } from "@connectrpc/connect";
import { SpanKind, trace } from "@opentelemetry/api";
import { InMemorySpanExporter, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base";
import { NodeTracerProvider } from "@opentelemetry/sdk-trace-node";
import { afterAll, describe, expect, inject, it } from "vitest";

import { Client, Memlane } from "../src/index.js";
import { target, unique } from "./helpers.js";

interface ServerSpan {
  name: string;
  traceId: string;
  parentId: string | null;
}

const exporter = new InMemorySpanExporter();
const provider = new NodeTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
provider.register(); // the global provider, an AsyncLocalStorage context manager and the W3C propagator
const tracer = trace.getTracer("agent-under-test");
const m = new Memlane(target(), { agentId: "traced-bot" });
afterAll(async () => {
  m.close();
  await provider.shutdown();
});

/** The sidecar's spans (console exporter: one indented JSON object per span) of one trace. */
function serverSpans(traceId: string): ServerSpan[] {
  const found: ServerSpan[] = [];
  for (const [block] of readFileSync(inject("sidecarLog"), "utf8").matchAll(/^\{\n[\s\S]*?\n\}$/gm)) {
    let span: { name?: string; context?: { trace_id?: string }; parent_id?: string | null };
    try {
      span = JSON.parse(block) as typeof span;
    } catch {
      continue; // another JSON-looking block of the log
    }
    if (span.name && span.context?.trace_id === `0x${traceId}`) {
      found.push({ name: span.name, traceId, parentId: span.parent_id?.replace(/^0x/, "") ?? null });
    }
  }
  return found;
}

/** Polls the log (the sidecar's exporter writes in batches) until `names` are all there. */
async function waitForSpans(traceId: string, names: string[]): Promise<ServerSpan[]> {
  const deadline = Date.now() + 30_000;
  for (;;) {
    const spans = serverSpans(traceId);
    if (names.every((n) => spans.some((s) => s.name === n))) return spans;
    if (Date.now() > deadline) throw new Error(`no spans ${names} of trace ${traceId}: ${JSON.stringify(spans)}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

const CREATE = "memlane.v1.SessionService/CreateSession";
const APPEND = "memlane.v1.SessionService/AppendMessages";
const ASSEMBLE = "memlane.v1.ContextService/AssembleContext";

describe("OpenTelemetry context", () => {
  it("the sidecar's spans are children of the agent's span", async () => {
    const sid = unique("chat");
    const [traceId, spanId] = await tracer.startActiveSpan("agent-turn", async (span) => {
      await m.add(unique("u"), sid, [{ role: "user", content: "Where is parcel 3318?" }]);
      await m.context(sid, "Where is parcel 3318?");
      span.end();
      return [span.spanContext().traceId, span.spanContext().spanId] as const;
    });
    const spans = await waitForSpans(traceId, [CREATE, APPEND, ASSEMBLE]);
    const mine = exporter.getFinishedSpans().filter((s) => s.spanContext().traceId === traceId);
    for (const name of [CREATE, APPEND, ASSEMBLE]) {
      const client = mine.find((s) => s.name === name);
      expect(client?.kind, name).toBe(SpanKind.CLIENT);
      expect(client?.parentSpanContext?.spanId, name).toBe(spanId);
      expect(client?.attributes["rpc.grpc.status_code"], name).toBe(0);
      expect(spans.find((s) => s.name === name)?.parentId, name).toBe(client?.spanContext().spanId);
    }
    // Under the agent's span the client adds no operation span of its own.
    expect(mine.map((s) => s.name)).not.toContain("memlane.add");
  });

  it("a memory operation's CLIENT span carries its GenAI name", async () => {
    const client = new Client(target(), { agentId: "traced-bot" });
    try {
      const traceId = await tracer.startActiveSpan("agent-search", async (span) => {
        await client.searchMemories({ caller: { userId: unique("u"), agentId: "traced-bot" }, query: "parcel" });
        span.end();
        return span.spanContext().traceId;
      });
      const [search] = exporter.getFinishedSpans().filter(
        (s) => s.spanContext().traceId === traceId && s.name === "search_memory",
      );
      expect(search?.kind).toBe(SpanKind.CLIENT);
      expect(search?.attributes["gen_ai.operation.name"]).toBe("search_memory");
      expect(search?.attributes["gen_ai.memory.store.id"]).toBe("ltm");
      expect(search?.attributes["gen_ai.memory.record.count"]).toBe(0);
    } finally {
      client.close();
    }
  });

  it("one add() is one trace when no span is active", async () => {
    exporter.reset();
    await m.add(unique("u"), unique("chat"), [{ role: "user", content: "hello" }]);
    const [add] = exporter.getFinishedSpans().filter((s) => s.name === "memlane.add");
    expect(add).toBeDefined();
    const spans = await waitForSpans(add!.spanContext().traceId, [CREATE, APPEND]);
    for (const name of [CREATE, APPEND]) {
      const [client] = exporter.getFinishedSpans().filter((s) => s.name === name);
      expect(client?.parentSpanContext?.spanId, name).toBe(add!.spanContext().spanId);
      expect(spans.find((s) => s.name === name)?.parentId, name).toBe(client?.spanContext().spanId);
    }
  });

  it("propagateTrace: false keeps the calls out of the caller's trace; interceptors run on every call", async () => {
    const seen: Array<string | null> = [];
    const spy: Interceptor = (next) => async (req) => {
      req.header.set("x-test-interceptor", "1");
      seen.push(req.header.get("traceparent"));
      return await next(req);
    };
    const quiet = new Client(target(), { propagateTrace: false, interceptors: [spy] });
    const traced = new Client(target(), { interceptors: [spy] });
    try {
      const traceId = await tracer.startActiveSpan("agent-turn", async (span) => {
        await quiet.listSessions({ userId: unique("u"), pageSize: 1 });
        await traced.listSessions({ userId: unique("u"), pageSize: 1 });
        span.end();
        return span.spanContext().traceId;
      });
      expect(seen).toHaveLength(2);
      expect(seen[0]).toBeNull(); // opted out
      expect(seen[1]).toMatch(new RegExp(`^00-${traceId}-[0-9a-f]{16}-01$`)); // ours ran before the caller's
      const spans = await waitForSpans(traceId, ["memlane.v1.SessionService/ListSessions"]);
      expect(spans.filter((s) => s.name === "memlane.v1.SessionService/ListSessions")).toHaveLength(1);
    } finally {
      quiet.close();
      traced.close();
    }
  });
});
