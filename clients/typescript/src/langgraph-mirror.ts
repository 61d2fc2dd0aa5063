/**
 * The graph's `messages` channel (root namespace), mirrored into the memlane session's messages, as the
 * Python saver does: memlane's summaries, context assembly, promotion to long-term memory and session
 * lifecycle then see a LangGraph.js conversation with no extra code. Each message is appended once,
 * under its own id (a retry or a re-sent history is a no-op on the sidecar), with the LangChain object
 * kept whole as the native message (`format="langchain"`, LangChain's serialized form). A message that
 * left the channel (`RemoveMessage`) is removed from the session; only messages this mirror wrote are
 * ever removed: they carry `metadata["langgraph.channel"]`.
 */
import { create } from "@bufbuild/protobuf";
import { type BaseMessage, isAIMessage, isBaseMessage, isToolMessage } from "@langchain/core/messages";

import { type Message, MessageSchema, Role } from "./gen/memlane/v1/session_pb.js";
import type { ListMessagesResponse } from "./gen/memlane/v1/session_service_pb.js";

export const MIRROR_KEY = "langgraph.channel";
export const CHANNEL = "messages";
export const LANGCHAIN_FORMAT = "langchain";

const ROLES: Record<string, Role> = {
  human: Role.USER,
  ai: Role.ASSISTANT,
  system: Role.SYSTEM,
  developer: Role.DEVELOPER,
  tool: Role.TOOL,
  function: Role.TOOL,
};

function toolCallIds(m: BaseMessage): string[] {
  if (isAIMessage(m)) {
    const calls = [...(m.tool_calls ?? []), ...(m.invalid_tool_calls ?? [])];
    return calls.map((c) => c.id).filter((id): id is string => Boolean(id));
  }
  if (isToolMessage(m)) return m.tool_call_id ? [m.tool_call_id] : [];
  return [];
}

export function toMessage(m: BaseMessage): Message {
  return create(MessageSchema, {
    messageId: String(m.id),
    role: ROLES[m.getType()] ?? Role.USER,
    content: m.text,
    participantName: m.name ?? "",
    native: { format: LANGCHAIN_FORMAT, json: JSON.stringify(m.toJSON()) },
    toolCallIds: toolCallIds(m),
    metadata: { [MIRROR_KEY]: CHANNEL },
  });
}

export interface MirrorPlan {
  append: Message[];
  remove: string[];
  /** The channel's ids once both ran. */
  ids: Set<string>;
}

/** What to send so the session holds exactly the channel's messages (among those mirrored). */
export function plan(known: ReadonlySet<string>, messages: unknown): MirrorPlan {
  const current = (Array.isArray(messages) ? messages : []).filter(
    (m): m is BaseMessage => isBaseMessage(m) && Boolean(m.id),
  );
  const ids = new Set(current.map((m) => String(m.id)));
  return {
    append: current.filter((m) => !known.has(String(m.id))).map(toMessage),
    remove: [...known].filter((id) => !ids.has(id)).sort(),
    ids,
  };
}

export function mirroredIds(page: ListMessagesResponse): Set<string> {
  return new Set(page.messages.filter((m) => m.metadata[MIRROR_KEY] === CHANNEL).map((m) => m.messageId));
}
