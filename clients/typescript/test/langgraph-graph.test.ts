/** A real LangGraph.js graph on `MemlaneSaver`: its state survives a new saver (another process's view),
 * and its `messages` channel is mirrored into the memlane session, so memlane's context assembly sees the
 * conversation; a RemoveMessage removes the mirrored message. */
import { AIMessage, HumanMessage, RemoveMessage } from "@langchain/core/messages";
import { END, MessagesAnnotation, START, StateGraph } from "@langchain/langgraph";
import { afterAll, describe, expect, it } from "vitest";

import { Client, Role } from "../src/index.js";
import { MemlaneSaver } from "../src/langgraph.js";
import { LANGCHAIN_FORMAT, MIRROR_KEY } from "../src/langgraph-mirror.js";
import { target, unique } from "./helpers.js";

const client = new Client(target());
afterAll(() => client.close());

function build(saver: MemlaneSaver) {
  return new StateGraph(MessagesAnnotation)
    .addNode("reply", (state) => {
      const last = state.messages.at(-1);
      return { messages: [new AIMessage({ content: `You said: ${String(last?.content)}`, id: unique("ai") })] };
    })
    .addEdge(START, "reply")
    .addEdge("reply", END)
    .compile({ checkpointer: saver });
}

describe("MemlaneSaver with a real graph", () => {
  it("persists the state and mirrors the conversation into the session", async () => {
    const userId = unique("u");
    const thread = unique("thread");
    const config = { configurable: { thread_id: thread } };
    const saver = new MemlaneSaver(client, { userId });
    const graph = build(saver);
    await graph.invoke({ messages: [new HumanMessage({ content: "My parcel 5521 is late.", id: unique("h") })] }, config);
    await graph.invoke({ messages: [new HumanMessage({ content: "Any news?", id: unique("h") })] }, config);

    // Another saver (nothing cached) sees the same state: the checkpoints are the sidecar's.
    const state = await build(new MemlaneSaver(client, { userId })).getState(config);
    expect(state.values.messages.map((m: { text: string }) => m.text)).toEqual([
      "My parcel 5521 is late.",
      "You said: My parcel 5521 is late.",
      "Any news?",
      "You said: Any news?",
    ]);

    const stored = (await client.listMessages({ sessionId: thread })).messages;
    expect(stored.map((m) => [m.role, m.content])).toEqual([
      [Role.USER, "My parcel 5521 is late."],
      [Role.ASSISTANT, "You said: My parcel 5521 is late."],
      [Role.USER, "Any news?"],
      [Role.ASSISTANT, "You said: Any news?"],
    ]);
    expect(stored.every((m) => m.native?.format === LANGCHAIN_FORMAT && m.metadata[MIRROR_KEY] === "messages")).toBe(true);
    expect(stored.map((m) => m.messageId)).toEqual(state.values.messages.map((m: { id: string }) => m.id));
    const session = (await client.getSession({ sessionId: thread })).session!;
    expect([session.userId, session.channel]).toEqual([userId, "langgraph"]);

    // memlane's own context assembly reads the graph's conversation.
    const turns = [];
    for await (const r of client.assembleContext({ sessionId: thread, userInput: "parcel" })) {
      turns.push(...r.blocks.flatMap((b) => b.messages.map((m) => m.content)));
    }
    expect(turns).toContain("My parcel 5521 is late.");

    // A message removed from the channel leaves the session too.
    const first = state.values.messages[0] as HumanMessage;
    await graph.updateState(config, { messages: [new RemoveMessage({ id: String(first.id) })] });
    const after = (await client.listMessages({ sessionId: thread })).messages.map((m) => m.content);
    expect(after).toEqual(["You said: My parcel 5521 is late.", "Any news?", "You said: Any news?"]);
  });

  it("mirrors nothing when asked not to", async () => {
    const thread = unique("thread");
    const graph = build(new MemlaneSaver(client, { userId: unique("u"), mirrorMessages: false }));
    await graph.invoke({ messages: [new HumanMessage({ content: "hello", id: unique("h") })] }, { configurable: { thread_id: thread } });
    expect((await client.listMessages({ sessionId: thread })).messages).toEqual([]);
  });
});
