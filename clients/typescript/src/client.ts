/**
 * `Client`: one method per RPC of memlane.v1 (all six services, flat, in lowerCamelCase), over gRPC
 * (HTTP/2, `@connectrpc/connect-node`).
 *
 * Each method takes the request (a message or a plain object of its fields) and optional Connect
 * `CallOptions` (`timeoutMs` is the call's deadline; the client's default otherwise). Writes get
 * client-side ids when they have none (messages, sessions, feedback, removals), which makes them safe to
 * retry, so UNAVAILABLE is retried with backoff on unary calls (and on a stream before its first item);
 * the two writes that cannot be made so without the caller's id are sent once (see `prepare`). Other
 * codes throw the typed error at once. A ConnectError never escapes.
 */
import { create, type DescMessage, type DescMethod, type Message } from "@bufbuild/protobuf";
import {
  type CallOptions,
  type Client as ConnectClient,
  Code,
  ConnectError,
  createClient,
  type Interceptor,
  type Transport,
} from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import type * as http2 from "node:http2";
import { setTimeout as sleep } from "node:timers/promises";

import { fromConnectError, retryHint } from "./errors.js";
import { AdminService } from "./gen/memlane/v1/admin_pb.js";
import { CheckpointService } from "./gen/memlane/v1/checkpoint_pb.js";
import { ContextService } from "./gen/memlane/v1/context_pb.js";
import type { CreateMemoryRequest, ExtractMemoriesRequest, RecordFeedbackRequest } from "./gen/memlane/v1/memory_pb.js";
import { MemoryService } from "./gen/memlane/v1/memory_pb.js";
import { ProcedureService } from "./gen/memlane/v1/procedure_pb.js";
import type {
  AppendMessagesRequest,
  CreateSessionRequest,
  RemoveMessagesRequest,
} from "./gen/memlane/v1/session_service_pb.js";
import { SessionService } from "./gen/memlane/v1/session_service_pb.js";
import { newId } from "./ids.js";
import { backoff, DEFAULT_RETRY, type RetryPolicy } from "./retry.js";
import { type CallSpan, startCall, traceContext } from "./tracing.js";

export const DEFAULT_TARGET = "127.0.0.1:50051";
export const DEFAULT_TIMEOUT_MS = 30_000;
export const AGENT_HEADER = "x-memlane-agent";
export const USER_TOKEN_HEADER = "x-memlane-user-token";

const SERVICES = [
  SessionService,
  ContextService,
  MemoryService,
  AdminService,
  CheckpointService,
  ProcedureService,
] as const;

/** Every RPC of memlane.v1, typed from the generated descriptors. */
export type Rpcs = ConnectClient<typeof SessionService> &
  ConnectClient<typeof ContextService> &
  ConnectClient<typeof MemoryService> &
  ConnectClient<typeof AdminService> &
  ConnectClient<typeof CheckpointService> &
  ConnectClient<typeof ProcedureService>;

export interface ClientOptions {
  /** Bearer token of the calling agent (`authorization: Bearer ...`). */
  token?: string;
  /** Agent id sent as `x-memlane-agent` (what the sidecar knows the caller as when auth is off). */
  agentId?: string;
  /** A signed end-user token (JWT), when the sidecar binds users. */
  userToken?: string;
  /** Default deadline of each call, in milliseconds (30 s). */
  timeoutMs?: number;
  retry?: RetryPolicy;
  /** Largest message sent or received (16 MiB). */
  maxMessageBytes?: number;
  /** TLS / mTLS options (`ca`, `cert`, `key`) for an `https://` target. */
  nodeOptions?: http2.SecureClientSessionOptions;
  /** Connect interceptors run on every call (and every retry), after this client has set its identity
   * and trace headers: extra headers, logging, your own tracing. */
  interceptors?: Interceptor[];
  /** Send the caller's OpenTelemetry context (`traceparent`, ...) when `@opentelemetry/api` is installed
   * and a span is active (default true). */
  propagateTrace?: boolean;
}

/** Fills client-side ids so a retried write lands once; returns whether the call is safe to retry.
 * CreateMemory without `memoryId` (a retry could store a second item) and ExtractMemories outside
 * `dryRun` (a retry merges the same items again) are not. */
function prepare(request: Message): boolean {
  switch (request.$typeName) {
    case "memlane.v1.CreateMemoryRequest":
      return Boolean((request as CreateMemoryRequest).memoryId);
    case "memlane.v1.ExtractMemoriesRequest":
      return (request as ExtractMemoriesRequest).dryRun;
    case "memlane.v1.AppendMessagesRequest":
      for (const m of (request as AppendMessagesRequest).messages) if (!m.messageId) m.messageId = newId();
      break;
    case "memlane.v1.CreateSessionRequest": {
      const r = request as CreateSessionRequest;
      if (!r.sessionId) r.sessionId = newId();
      break;
    }
    case "memlane.v1.RecordFeedbackRequest": {
      const r = request as RecordFeedbackRequest;
      if (!r.feedbackId) r.feedbackId = newId(); // the server counts one piece of feedback once
      break;
    }
    case "memlane.v1.RemoveMessagesRequest": {
      const r = request as RemoveMessagesRequest;
      if (!r.requestId) r.requestId = newId();
      break;
    }
  }
  return true;
}

function baseUrl(target: string): string {
  if (/^https?:\/\//.test(target)) return target;
  return `http://${target}`;
}

type AnyFn = (request: unknown, options?: CallOptions) => unknown;

export interface Client extends Rpcs {}

/** The full client. Call `close()` when done (it closes the HTTP/2 connection). */
export class Client {
  readonly target: string;
  readonly #session: Http2SessionManager;
  readonly #timeoutMs: number;
  readonly #retry: RetryPolicy;
  readonly #propagate: boolean;

  constructor(target: string = DEFAULT_TARGET, options: ClientOptions = {}) {
    this.target = target;
    this.#propagate = options.propagateTrace !== false;
    this.#timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    this.#retry = options.retry ?? DEFAULT_RETRY;
    const url = baseUrl(target);
    this.#session = new Http2SessionManager(url, { pingIntervalMs: 30_000 }, options.nodeOptions);
    const maxBytes = options.maxMessageBytes ?? 16 * 1024 * 1024;
    const transport: Transport = createGrpcTransport({
      baseUrl: url,
      sessionManager: this.#session,
      interceptors: [
        identity(options),
        ...(options.propagateTrace === false ? [] : [traceContext()]),
        ...(options.interceptors ?? []),
      ],
      readMaxBytes: maxBytes,
      writeMaxBytes: maxBytes,
    });
    const self = this as unknown as Record<string, AnyFn>;
    for (const service of SERVICES) {
      const raw = createClient(service, transport) as unknown as Record<string, AnyFn>;
      for (const method of service.methods) {
        const call = raw[method.localName];
        if (call === undefined) continue;
        self[method.localName] =
          method.methodKind === "server_streaming" ? this.#stream(method, call) : this.#unary(method, call);
      }
    }
  }

  /** Closes the connection (open calls end with CANCELLED). */
  close(): void {
    this.#session.abort();
  }

  [Symbol.dispose](): void {
    this.close();
  }

  #options(options: CallOptions | undefined, span?: CallSpan): CallOptions {
    const out: CallOptions = { ...options, timeoutMs: options?.timeoutMs ?? this.#timeoutMs };
    if (span !== undefined && this.#propagate) {
      // The call's own CLIENT span is its context (the trace interceptor leaves headers set here).
      const headers = new Headers(options?.headers);
      for (const [name, value] of Object.entries(span.headers())) headers.set(name, value);
      out.headers = headers;
    }
    return out;
  }

  /** Milliseconds to wait before attempt `attempt + 1`; throws the typed error when it is final. */
  #retryDelay(thrown: unknown, attempt: number, safe: boolean, started: boolean): number {
    const err = ConnectError.from(thrown);
    if (safe && !started && attempt < this.#retry.maxAttempts) {
      if (this.#retry.retryable.has(err.code)) return backoff(this.#retry, attempt) * 1000;
      const hint = err.code === Code.ResourceExhausted ? retryHint(err) : 0;
      if (hint > 0) return backoff(this.#retry, attempt, hint) * 1000; // shed under load: come back when told
    }
    throw fromConnectError(thrown);
  }

  #unary(method: DescMethod, call: AnyFn): AnyFn {
    return async (request: unknown, options?: CallOptions) => {
      const message = create(method.input as DescMessage, request as never);
      const safe = prepare(message);
      const span = await startCall(method.parent.typeName, method.name);
      try {
        for (let attempt = 1; ; attempt++) {
          try {
            const response = await call(message, this.#options(options, span));
            span?.answered(response);
            span?.end();
            return response;
          } catch (thrown) {
            await sleep(this.#retryDelay(thrown, attempt, safe, false));
          }
        }
      } catch (thrown) {
        span?.end(thrown);
        throw thrown;
      }
    };
  }

  #stream(method: DescMethod, call: AnyFn): AnyFn {
    const client = this;
    return (request: unknown, options?: CallOptions) =>
      (async function* () {
        const message = create(method.input as DescMessage, request as never);
        const span = await startCall(method.parent.typeName, method.name);
        let failed: unknown;
        try {
          for (let attempt = 1; ; attempt++) {
            let started = false;
            try {
              // A partial stream cannot be resumed: only a stream that yielded nothing is retried. A
              // consumer that stops early returns this generator, which cancels the call.
              const items = call(message, client.#options(options, span)) as AsyncIterable<unknown>;
              for await (const item of items) {
                started = true;
                yield item;
              }
              return;
            } catch (thrown) {
              await sleep(client.#retryDelay(thrown, attempt, true, started));
            }
          }
        } catch (thrown) {
          failed = thrown;
          throw thrown;
        } finally {
          span?.end(failed); // also when the consumer stopped early: no error of the call's
        }
      })();
  }
}

function identity(options: ClientOptions): Interceptor {
  return (next) => async (req) => {
    if (options.token) req.header.set("authorization", `Bearer ${options.token}`);
    if (options.agentId) req.header.set(AGENT_HEADER, options.agentId);
    if (options.userToken) req.header.set(USER_TOKEN_HEADER, options.userToken);
    return await next(req);
  };
}

/** Every item of a paginated listing: `fetch(pageToken)` returns one page, `items(page)` its items. */
export async function* iterPages<P extends { nextPageToken: string }, T>(
  fetch: (pageToken: string) => Promise<P>,
  items: (page: P) => readonly T[],
): AsyncGenerator<T> {
  let token = "";
  for (;;) {
    const page = await fetch(token);
    yield* items(page);
    token = page.nextPageToken;
    if (!token) return;
  }
}
