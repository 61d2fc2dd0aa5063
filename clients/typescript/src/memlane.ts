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
 * chat-completions call.
 */
import type { MessageInitShape } from "@bufbuild/protobuf";

import { type ChatMessage, chatFromContext, toMessage } from "./chat.js";
import { Client, type ClientOptions, DEFAULT_TARGET } from "./client.js";
import { NotFoundError } from "./errors.js";
import type {
  AssembleContextRequest,
  AssembleContextRequestSchema,
  AssembleContextResponse,
} from "./gen/memlane/v1/context_pb.js";
import { MemoryKind, type ScoredMemory } from "./gen/memlane/v1/memory_pb.js";
import type { Message } from "./gen/memlane/v1/session_pb.js";
import type { AppendResult } from "./gen/memlane/v1/session_service_pb.js";
import { inSpan } from "./tracing.js";

const KNOWN_SESSIONS = 10_000; // ids remembered as created, so add() costs one round trip after the first

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

/** `ContextOptions` and `includeInput` (default true: the new question ends the window). */
export type ContextCallOptions = ContextOptions & { includeInput?: boolean };

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
   * It is not stored: `add` it with the reply to keep it in the history. */
  async context(sessionId: string, userInput = "", options: ContextCallOptions = {}): Promise<ChatMessage[]> {
    const { includeInput = true, ...fields } = options;
    const responses: AssembleContextResponse[] = [];
    for await (const r of this.client.assembleContext({ ...fields, sessionId, userInput })) responses.push(r);
    return withInput(chatFromContext(responses), userInput, includeInput);
  }

  /** Long-term memories of the user this agent may read, best first, with their score parts; `minScore`
   * leaves out results whose final score is below it (weak matches). */
  async search(
    userId: string,
    query: string,
    options: { limit?: number; minScore?: number } = {},
  ): Promise<ScoredMemory[]> {
    const caller = { userId, agentId: this.agentId };
    const request = { caller, query, limit: options.limit ?? 10, minScore: options.minScore ?? 0 };
    return (await this.client.searchMemories(request)).results;
  }

  /** Stores a fact (or a preference, instruction, episode) about the user; the memory id (that of an
   * existing memory when this one merged into it). */
  async remember(userId: string, content: string, options: { kind?: MemoryKind } = {}): Promise<string> {
    const caller = { userId, agentId: this.agentId };
    const reply = await this.client.createMemory({ caller, kind: options.kind ?? MemoryKind.FACT, content });
    return reply.memory?.memoryId ?? "";
  }

  /** Erases everything held about the user (sessions, memories, archives); counts by kind. */
  async forgetUser(userId: string): Promise<Record<string, number>> {
    this.#known = new Set();
    const reply = await this.client.forgetUser({ userId });
    return Object.fromEntries(Object.entries(reply.erased).map(([k, v]) => [k, Number(v)]));
  }
}
