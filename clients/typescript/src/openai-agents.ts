/**
 * `MemlaneSession`: the OpenAI Agents SDK for JavaScript's `Session` over a memlane session.
 *
 *     import { MemlaneSession } from "memlane/openai-agents";
 *     const session = new MemlaneSession("support-4417", "127.0.0.1:50051", { userId: "alice" });
 *     const result = await run(agent, "My order arrived damaged.", { session });
 *
 * Each item is one session message holding the item whole as its native object (format
 * `openai.agents-js`), so `getItems` gives back exactly what `addItems` was given; its role, text and
 * tool call id are derived so that memlane's summaries, recall and promotion see the conversation too.
 * A plain chat turn written by another client (`Memlane.add`, the Python SDK session) comes back as an
 * easy message with its text. The session is created on the first `addItems` (for `userId`); reading or
 * clearing one that does not exist yet gives the empty history, as the SDK's `MemorySession`.
 */
import { create } from "@bufbuild/protobuf";
import type { AgentInputItem, Session } from "@openai/agents";

import { Client, type ClientOptions, DEFAULT_TARGET } from "./client.js";
import { NotFoundError } from "./errors.js";
import { newId } from "./ids.js";
import { type Message, MessageSchema, Role } from "./gen/memlane/v1/session_pb.js";
import { MessageOrder } from "./gen/memlane/v1/session_service_pb.js";

export const ITEM_FORMAT = "openai.agents-js";
const ITEM_TYPE_KEY = "openai_agents.type";
const PAGE = 1000; // the server's largest page

const ROLES: Record<string, Role> = {
  user: Role.USER,
  assistant: Role.ASSISTANT,
  system: Role.SYSTEM,
  developer: Role.DEVELOPER,
};
const NAMES: Partial<Record<Role, "user" | "assistant" | "system">> = {
  [Role.USER]: "user",
  [Role.ASSISTANT]: "assistant",
  [Role.SYSTEM]: "system",
  [Role.DEVELOPER]: "system",
};

export interface MemlaneSessionOptions extends ClientOptions {
  userId?: string;
  /** Recorded as the author of the assistant's items (and sent as the caller when auth is off). */
  agentId?: string;
  channel?: string;
}

type Loose = Record<string, unknown>;

function textOf(content: unknown): string {
  if (typeof content === "string") return content;
  if (Array.isArray(content)) {
    return content
      .map((p: unknown) => {
        const part = (p ?? {}) as Loose;
        return typeof part.text === "string" ? part.text : typeof part.refusal === "string" ? part.refusal : "";
      })
      .filter(Boolean)
      .join("\n");
  }
  return "";
}

/** Role, searchable text and tool call ids of one item. */
function summary(item: Loose, kind: string): [Role, string, string[]] {
  const callId = typeof item.callId === "string" ? item.callId : "";
  const calls = callId ? [callId] : [];
  if (kind === "message" || "role" in item) return [ROLES[String(item.role)] ?? Role.USER, textOf(item.content), []];
  if (kind === "function_call") return [Role.ASSISTANT, `${String(item.name ?? "")}(${String(item.arguments ?? "")})`, calls];
  if (kind.endsWith("_result") || kind.endsWith("_output")) {
    const out = item.output;
    const text = typeof out === "string" ? out : textOf(Array.isArray(out) ? out : [out]);
    return [Role.TOOL, text, calls];
  }
  if (kind === "reasoning") return [Role.ASSISTANT, textOf(item.content), []];
  return [Role.ASSISTANT, "", calls]; // hosted tool calls and the like: kept whole, no text
}

export function toMessage(item: AgentInputItem, agentId: string, messageId = ""): Message {
  const loose = item as unknown as Loose;
  const kind = String(loose.type ?? "message");
  const [role, content, toolCallIds] = summary(loose, kind);
  return create(MessageSchema, {
    messageId,
    role,
    content,
    sourceAgentId: role === Role.ASSISTANT ? agentId : "",
    toolCallIds,
    native: { format: ITEM_FORMAT, json: JSON.stringify(item) },
    metadata: { [ITEM_TYPE_KEY]: kind },
  });
}

/** The item a message holds: its native object, or for a plain turn of another client an easy message
 * with its text; undefined for what has no item form here (another framework's tool traffic). */
export function toItem(m: Message): AgentInputItem | undefined {
  if (m.native?.format === ITEM_FORMAT && m.native.json) {
    const native: unknown = JSON.parse(m.native.json);
    if (native && typeof native === "object") return native as AgentInputItem;
  }
  const role = NAMES[m.role];
  if (role === undefined || !m.content || m.toolCallIds.length > 0) return undefined;
  if (m.native?.json) {
    const native = JSON.parse(m.native.json) as Loose;
    if (native && (native.tool_calls || native.tool_call_id)) return undefined; // Memlane.add's tool traffic
  }
  if (role === "assistant") {
    return { role, status: "completed", content: [{ type: "output_text", text: m.content }] } as AgentInputItem;
  }
  return { role, content: m.content } as AgentInputItem;
}

export class MemlaneSession implements Session {
  readonly client: Client;
  readonly sessionId: string;
  readonly userId: string;
  readonly agentId: string;
  readonly channel: string;
  readonly #owns: boolean;
  #created = false;

  constructor(sessionId: string, target: string | Client = DEFAULT_TARGET, options: MemlaneSessionOptions = {}) {
    this.sessionId = sessionId;
    this.#owns = !(target instanceof Client);
    this.client = target instanceof Client ? target : new Client(target, options);
    this.userId = options.userId ?? "openai-agents";
    this.agentId = options.agentId ?? "";
    this.channel = options.channel ?? "openai-agents";
  }

  /** Closes the client this session made (not one it was given). */
  close(): void {
    if (this.#owns) this.client.close();
  }

  async getSessionId(): Promise<string> {
    return this.sessionId;
  }

  /** The history oldest first; with `limit`, its latest `limit` items (0 or less: none, as the SDK's
   * MemorySession). */
  async getItems(limit?: number): Promise<AgentInputItem[]> {
    if (limit !== undefined && limit <= 0) return [];
    const newestFirst = limit !== undefined;
    const items: AgentInputItem[] = [];
    let pageToken = "";
    try {
      for (;;) {
        const page = await this.client.listMessages({
          sessionId: this.sessionId,
          order: newestFirst ? MessageOrder.NEWEST_FIRST : MessageOrder.OLDEST_FIRST,
          pageSize: newestFirst ? Math.min(limit, PAGE) : PAGE,
          pageToken,
        });
        for (const m of page.messages) {
          const item = toItem(m);
          if (item !== undefined) items.push(item);
        }
        pageToken = page.nextPageToken;
        if (!pageToken || (newestFirst && items.length >= limit)) break;
      }
    } catch (err) {
      if (err instanceof NotFoundError) return [];
      throw err;
    }
    return newestFirst ? items.slice(0, limit).reverse() : items;
  }

  async addItems(items: AgentInputItem[]): Promise<void> {
    if (items.length === 0) return;
    // Ids are given here, once, so the append sent again after re-creating the session lands once.
    const request = {
      sessionId: this.sessionId,
      messages: items.map((i) => toMessage(i, this.agentId, newId())),
    };
    if (!this.#created) await this.#create();
    try {
      await this.client.appendMessages(request);
    } catch (err) {
      if (!(err instanceof NotFoundError)) throw err;
      await this.#create(); // erased or retired since: the same ids land once when sent again
      await this.client.appendMessages(request);
    }
  }

  /** Removes the latest item and returns it (undefined when the session is empty). */
  async popItem(): Promise<AgentInputItem | undefined> {
    for (;;) {
      let removed;
      try {
        removed = await this.client.removeMessages({ sessionId: this.sessionId, last: 1 });
      } catch (err) {
        if (err instanceof NotFoundError) return undefined;
        throw err;
      }
      const last = removed.removed.at(-1);
      if (last === undefined) return undefined;
      const item = toItem(last);
      if (item !== undefined) return item;
      // A message with no item form (another framework's tool traffic): gone too; keep looking.
    }
  }

  async clearSession(): Promise<void> {
    try {
      await this.client.removeMessages({ sessionId: this.sessionId, all: true });
    } catch (err) {
      if (!(err instanceof NotFoundError)) throw err;
    }
  }

  async #create(): Promise<void> {
    await this.client.createSession({
      sessionId: this.sessionId,
      userId: this.userId,
      agentId: this.agentId,
      channel: this.channel,
    });
    this.#created = true;
  }
}
