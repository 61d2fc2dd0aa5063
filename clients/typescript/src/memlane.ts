/**
 * `Memlane`: the high-level class for the common path, over the full `Client` (still reachable as
 * `.client`):
 *
 *     const m = new Memlane("127.0.0.1:50051", { agentId: "support-bot" });
 *     await m.add("alice", "chat-1", [{ role: "user", content: "My order 4417 arrived damaged." }]);
 *     const messages = await m.context("chat-1", "what happened to my order?"); // OpenAI chat format
 *
 * Sessions are created on first use; `context` returns the assembled window (system prompt, profile,
 * recalled memories, summary, recent turns, then the new question) as chat messages ready for a
 * chat-completions call. The long-term memories have the lifecycle mem0's `Memory` has (`remember`,
 * `search`, `get`, `getAll`, `update`, `delete`, `history`; `forgetUser` for its `delete_all`), and
 * `closeSession` ends a conversation: the same names and shapes as Python's `Memlane`, in camelCase
 * (docs/integrations.md compares them).
 */
import type { MessageInitShape } from "@bufbuild/protobuf";

import { type ChatMessage, chatFromContext, toMessage } from "./chat.js";
import { Client, type ClientOptions, DEFAULT_TARGET, iterPages } from "./client.js";
import { NotFoundError } from "./errors.js";
import type {
  AssembleContextRequest,
  AssembleContextRequestSchema,
  AssembleContextResponse,
} from "./gen/memlane/v1/context_pb.js";
import { type Memory, MemoryKind, type MemoryVersion, type ScoredMemory } from "./gen/memlane/v1/memory_pb.js";
import type { Message, Session } from "./gen/memlane/v1/session_pb.js";
import type { AppendResult } from "./gen/memlane/v1/session_service_pb.js";
import { inSpan } from "./tracing.js";

const KNOWN_SESSIONS = 10_000; // ids remembered as created, so add() costs one round trip after the first
const PAGE_SIZE = 500; // the most ListMemories and ListMemoryVersions return in one page
const DEFAULT_LIMIT = 100; // getAll and history: items returned at most, as mem0's get_all

export interface MemlaneOptions extends ClientOptions {
  /** This agent's id in the sessions it creates and the memories it writes (request fields, as the
   * Python `Memlane` sends it; the caller's identity is the token's, or `callerAgentId` when auth is
   * off). */
  agentId?: string;
  /** Sent as `x-memlane-agent` (the caller's identity when the sidecar runs without auth). */
  callerAgentId?: string;
  /** Channel of the sessions this agent creates. */
  channel?: string;
}

/** Any AssembleContextRequest field but the session and the input (`model`, `contextWindowTokens`,
 * `reservedOutputTokens`, `systemPrompt`, `memoryLimit`, ...). */
export type ContextOptions = Omit<
  Exclude<MessageInitShape<typeof AssembleContextRequestSchema>, AssembleContextRequest>,
  "$typeName" | "sessionId" | "userInput"
>;

/** `ContextOptions`, `includeInput` (default true: the new question ends the window) and `userId` (the
 * session is created for that user on first use, as `add` does). */
export type ContextCallOptions = ContextOptions & { includeInput?: boolean; userId?: string };

/** What `update` may change besides the content; what is left out stays as it is. */
export interface UpdateOptions {
  kind?: MemoryKind;
  slot?: string;
  importance?: number;
  metadata?: Record<string, string>;
}

/** Up to `limit` items of a paginated listing, fetching only the pages needed. */
async function take<T>(items: AsyncIterable<T>, limit: number): Promise<T[]> {
  const out: T[] = [];
  for await (const item of items) {
    out.push(item);
    if (out.length >= limit) break; // returns the generator: no further page is fetched
  }
  return out;
}

function pageSize(limit: number): number {
  if (!Number.isInteger(limit) || limit < 1) throw new RangeError(`limit must be at least 1, not ${limit}`);
  return Math.min(limit, PAGE_SIZE);
}

/** The NOT_FOUND of a context call on a session nobody created, saying how to create it. */
function noSession(err: NotFoundError, sessionId: string): NotFoundError {
  const how =
    `pass { userId } to context() to create session ${JSON.stringify(sessionId)} for that user ` +
    "(as add() does), or add() to it first";
  return new NotFoundError(`${err.message}: ${how}`, err.code, {
    reason: err.reason,
    fieldViolations: err.fieldViolations,
    info: err.info,
    cause: err,
  });
}

/** The window ends with the new question, ready to send: the server charged it to the budget. Not twice
 * when it was added first (then it is already the session's last turn). */
function withInput(chat: ChatMessage[], userInput: string, include: boolean): ChatMessage[] {
  if (!include || !userInput) return chat;
  const last = chat.at(-1);
  if (last?.role === "user" && last.content === userInput) return chat;
  return [...chat, { role: "user", content: userInput }];
}

export class Memlane {
  readonly client: Client;
  readonly agentId: string;
  readonly channel: string;
  readonly #owns: boolean;
  #known = new Set<string>();

  /** `agentId` names this agent in the sessions it creates and the memories it writes. */
  constructor(target: string | Client = DEFAULT_TARGET, options: MemlaneOptions = {}) {
    this.#owns = !(target instanceof Client);
    const { agentId: _fields, callerAgentId, ...clientOptions } = options;
    this.client =
      target instanceof Client ? target : new Client(target, { ...clientOptions, agentId: callerAgentId });
    this.agentId = options.agentId ?? "";
    this.channel = options.channel ?? "";
  }

  close(): void {
    if (this.#owns) this.client.close();
  }

  [Symbol.dispose](): void {
    this.close();
  }

  async #ensureSession(userId: string, sessionId: string): Promise<void> {
    if (this.#known.has(sessionId)) return;
    await this.client.createSession({ sessionId, userId, agentId: this.agentId, channel: this.channel });
    this.#known.add(sessionId);
    if (this.#known.size > KNOWN_SESSIONS) this.#known.delete(this.#known.values().next().value as string);
  }

  /** Appends chat messages (OpenAI format, or memlane `Message`s) to the session, creating it for
   * `userId` on first use; one result per message (id, sequence number, token count). */
  async add(userId: string, sessionId: string, messages: Iterable<ChatMessage | Message>): Promise<AppendResult[]> {
    const batch = [...messages].map((m) => toMessage(m, this.agentId));
    // Its two calls in one trace (a span of its own when the caller has none active).
    return await inSpan("memlane.add", () => this.#add(userId, sessionId, batch));
  }

  async #add(userId: string, sessionId: string, batch: Message[]): Promise<AppendResult[]> {
    await this.#ensureSession(userId, sessionId);
    try {
      return (await this.client.appendMessages({ sessionId, messages: batch })).results;
    } catch (err) {
      if (!(err instanceof NotFoundError)) throw err;
      // The session was erased or retired since: create it again, once. The same message ids land once.
      this.#known.delete(sessionId);
      await this.#ensureSession(userId, sessionId);
      return (await this.client.appendMessages({ sessionId, messages: batch })).results;
    }
  }

  /** The assembled context as OpenAI chat messages, ready for the model call. `userInput`: the new turn
   * (the recall query), returned as the last user message unless `includeInput: false` (or it was added
   * to the session first: it is then there once, as the last turn), as Python's `Memlane.context` does.
   * It is not stored: `add` it with the reply to keep it in the history. `userId`: the session is
   * created for that user on first use, as `add` does, so the first turn of a new conversation has its
   * context (the user's profile and memories); without it, a session nobody created is a
   * `NotFoundError` that says so. */
  async context(sessionId: string, userInput = "", options: ContextCallOptions = {}): Promise<ChatMessage[]> {
    const { includeInput = true, userId = "", ...fields } = options;
    const assemble = async (): Promise<AssembleContextResponse[]> => {
      const responses: AssembleContextResponse[] = [];
      for await (const r of this.client.assembleContext({ ...fields, sessionId, userInput })) responses.push(r);
      return responses;
    };
    const responses = await inSpan("memlane.context", async () => {
      if (userId) await this.#ensureSession(userId, sessionId);
      try {
        return await assemble();
      } catch (err) {
        if (!(err instanceof NotFoundError)) throw err;
        if (!userId) throw noSession(err, sessionId);
        this.#known.delete(sessionId); // erased or retired since: create it again, once
        await this.#ensureSession(userId, sessionId);
        return await assemble();
      }
    });
    return withInput(chatFromContext(responses), userInput, includeInput);
  }

  #caller(userId: string): { userId: string; agentId: string } {
    return { userId, agentId: this.agentId };
  }

  /** Long-term memories of the user this agent may read, best first, with their score parts; `minScore`
   * leaves out results whose final score is below it (weak matches). */
  async search(
    userId: string,
    query: string,
    options: { limit?: number; minScore?: number } = {},
  ): Promise<ScoredMemory[]> {
    const caller = this.#caller(userId);
    const request = { caller, query, limit: options.limit ?? 10, minScore: options.minScore ?? 0 };
    return (await this.client.searchMemories(request)).results;
  }

  /** Stores a fact (or a preference, instruction, episode) about the user; the memory id (that of an
   * existing memory when this one merged into it). `slot` names the single-valued attribute it states
   * ("location", "units"): a newer value in the same slot supersedes the older one (kept in `history`,
   * no longer served). */
  async remember(userId: string, content: string, options: { kind?: MemoryKind; slot?: string } = {}): Promise<string> {
    const reply = await this.client.createMemory({
      caller: this.#caller(userId),
      kind: options.kind ?? MemoryKind.FACT,
      content,
      slot: options.slot ?? "",
    });
    return reply.memory?.memoryId ?? "";
  }

  /** One memory of the user that this agent may read; `NotFoundError` when there is none. */
  async get(userId: string, memoryId: string): Promise<Memory> {
    const reply = await this.client.getMemory({ caller: this.#caller(userId), memoryId });
    return reply.memory!;
  }

  /** The user's memories this agent may read, newest first, `limit` at most (100; paged through);
   * `kinds` narrows them (empty: every kind). Superseded and deleted ones are in `history`. */
  async getAll(userId: string, options: { kinds?: MemoryKind[]; limit?: number } = {}): Promise<Memory[]> {
    const limit = options.limit ?? DEFAULT_LIMIT;
    const base = { caller: this.#caller(userId), filter: { kinds: options.kinds ?? [] }, pageSize: pageSize(limit) };
    const pages = iterPages((pageToken) => this.client.listMemories({ ...base, pageToken }), (p) => p.memories);
    return await take(pages, limit);
  }

  /** Changes what is given (new content is embedded again), each change kept as a version; the memory
   * as it is now. `NotFoundError` for a memory this agent may not read; nothing given is an
   * `InvalidArgumentError`. */
  async update(userId: string, memoryId: string, content?: string, options: UpdateOptions = {}): Promise<Memory> {
    const given = { content, ...options };
    const fields = Object.fromEntries(Object.entries(given).filter(([, v]) => v !== undefined));
    const reply = await this.client.updateMemory({
      caller: this.#caller(userId),
      memory: { ...fields, memoryId },
      updateMask: { paths: Object.keys(fields).sort() }, // the field names are the same in the proto
    });
    return reply.memory!;
  }

  /** Deletes one memory (its versions stay in `history` for the whole-user view); `NotFoundError` when
   * there is none this agent may read. */
  async delete(userId: string, memoryId: string): Promise<void> {
    await this.client.deleteMemory({ caller: this.#caller(userId), memoryId });
  }

  /** The kept versions of one memory, oldest first (created, merged into, edited, superseded, deleted:
   * who, when, why, and the memory as each change left it), `limit` at most (100). An agent gets
   * `NotFoundError` for a memory it may not read; a caller naming no agent (the whole-user view) also
   * sees deleted memories' versions, and an empty list for an id never stored. */
  async history(userId: string, memoryId: string, options: { limit?: number } = {}): Promise<MemoryVersion[]> {
    const limit = options.limit ?? DEFAULT_LIMIT;
    const base = { caller: this.#caller(userId), memoryId, pageSize: pageSize(limit) };
    const pages = iterPages((pageToken) => this.client.listMemoryVersions({ ...base, pageToken }), (p) => p.versions);
    return await take(pages, limit);
  }

  /** Ends the conversation now (what its inactivity timeout would do: summary, promotion to long-term
   * memory, archive, in the background); the closed session. `close()` closes this client's connection
   * instead. */
  async closeSession(sessionId: string): Promise<Session> {
    return (await this.client.closeSession({ sessionId })).session!;
  }

  /** Erases everything held about the user (sessions, memories, archives); counts by kind. */
  async forgetUser(userId: string): Promise<Record<string, number>> {
    this.#known = new Set();
    const reply = await this.client.forgetUser({ userId });
    return Object.fromEntries(Object.entries(reply.erased).map(([k, v]) => [k, Number(v)]));
  }
}
