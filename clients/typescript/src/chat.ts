/**
 * OpenAI chat-format messages <-> memlane messages and assembled context (no I/O here). A chat message is
 * stored whole as the message's native object (`openai.chat`, the format the Python client uses), so
 * `context()` gives back exactly what `add()` was given (tool calls, content parts), from either client.
 */
import { create } from "@bufbuild/protobuf";

import { InvalidArgumentError } from "./errors.js";
import type { AssembleContextResponse, ContextMessage } from "./gen/memlane/v1/context_pb.js";
import { type Message, MessageSchema, NativeMessageSchema, Role } from "./gen/memlane/v1/session_pb.js";

export const CHAT_FORMAT = "openai.chat";

/** One message in the OpenAI chat format (`{ role: "user", content: "..." }`). */
export interface ChatMessage {
  role: string;
  content?: string | Array<Record<string, unknown>> | null;
  name?: string;
  tool_call_id?: string;
  tool_calls?: Array<Record<string, unknown>>;
  [key: string]: unknown;
}

const ROLES: Record<string, Role> = {
  user: Role.USER,
  assistant: Role.ASSISTANT,
  system: Role.SYSTEM,
  developer: Role.DEVELOPER,
  tool: Role.TOOL,
  function: Role.TOOL,
};
const NAMES: Partial<Record<Role, string>> = {
  [Role.USER]: "user",
  [Role.ASSISTANT]: "assistant",
  [Role.SYSTEM]: "system",
  [Role.DEVELOPER]: "developer",
  [Role.TOOL]: "tool",
};

/** The text of a content string or list of content parts (images and audio carry no text). */
function textOf(content: unknown): string {
  if (content === null || content === undefined) return "";
  if (typeof content === "string") return content;
  if (Array.isArray(content)) {
    return content
      .map((p: unknown) => (p && typeof p === "object" && "text" in p ? String((p as { text: unknown }).text ?? "") : ""))
      .filter(Boolean)
      .join("\n");
  }
  throw new InvalidArgumentError(`content must be a string or a list of parts, not ${typeof content}`);
}

export function toMessage(chat: ChatMessage | Message, agentId: string): Message {
  if ("$typeName" in chat && chat.$typeName === "memlane.v1.Message") return chat as Message;
  const c = chat as ChatMessage;
  const role = ROLES[String(c.role)];
  if (role === undefined) {
    throw new InvalidArgumentError(`role ${JSON.stringify(c.role)} is not one of ${Object.keys(ROLES).join(", ")}`);
  }
  let text = textOf(c.content);
  if (!text && c.tool_calls?.length) text = JSON.stringify(c.tool_calls); // searchable, and never empty
  return create(MessageSchema, {
    role,
    content: text,
    participantName: c.name ? String(c.name) : "",
    sourceAgentId: role === Role.ASSISTANT ? agentId : "",
    native: create(NativeMessageSchema, { format: CHAT_FORMAT, json: JSON.stringify(c) }),
  });
}

function chatOf(m: ContextMessage): ChatMessage {
  if (m.native?.format === CHAT_FORMAT && m.native.json) {
    const native: unknown = JSON.parse(m.native.json);
    if (native && typeof native === "object" && "role" in native) return native as ChatMessage; // as stored
  }
  const chat: ChatMessage = { role: NAMES[m.role] ?? "user", content: m.content };
  if (m.name) chat.name = m.name;
  return chat;
}

/** Every block of an assembled context, in order, as chat messages: system prompt, profile, memories and
 * summary come as system messages, the conversation as its own turns. */
export function chatFromContext(responses: readonly AssembleContextResponse[]): ChatMessage[] {
  return responses.flatMap((r) => r.blocks.flatMap((b) => b.messages.map(chatOf)));
}
