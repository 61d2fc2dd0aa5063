/**
 * memlane: the TypeScript client of the memlane memory sidecar.
 *
 *     import { Memlane } from "memlane";
 *     const m = new Memlane("127.0.0.1:50051", { agentId: "bot" });
 *     await m.add("u1", "chat-1", [{ role: "user", content: "hi" }]);
 *     const messages = await m.context("chat-1", "hi");
 *
 * with the memory's lifecycle beside it (`remember`, `search`, `get`, `getAll`, `update`, `delete`,
 * `history`; `closeSession` ends a conversation), as Python's `Memlane` has it.
 *
 * Every RPC: `Client` (`m.client`), with the generated message types and schemas exported here.
 * Adapters: `memlane/langgraph` (a LangGraph.js checkpointer), `memlane/openai-agents` (a Session).
 */
export { type ChatMessage, CHAT_FORMAT, chatFromContext, toMessage } from "./chat.js";
export {
  AGENT_HEADER,
  Client,
  type ClientOptions,
  DEFAULT_TARGET,
  DEFAULT_TIMEOUT_MS,
  iterPages,
  type Rpcs,
  USER_TOKEN_HEADER,
} from "./client.js";
export * from "./errors.js";
export { newId } from "./ids.js";
export {
  type ContextCallOptions,
  type ContextOptions,
  Memlane,
  type MemlaneOptions,
  type UpdateOptions,
} from "./memlane.js";
export { DEFAULT_RETRY, NO_RETRY, type RetryPolicy } from "./retry.js";
export * from "./gen/memlane/v1/admin_pb.js";
export * from "./gen/memlane/v1/checkpoint_pb.js";
export * from "./gen/memlane/v1/context_pb.js";
export * from "./gen/memlane/v1/memory_pb.js";
export * from "./gen/memlane/v1/procedure_pb.js";
export * from "./gen/memlane/v1/session_pb.js";
export * from "./gen/memlane/v1/session_service_pb.js";
