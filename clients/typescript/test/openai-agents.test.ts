/** `MemlaneSession` against the OpenAI Agents JS SDK's own `MemorySession` and its real `Runner`: the same
 * operations give the same answers, the same scripted conversation (a tool call included) sends the
 * model the same history through both, and items round-trip exactly. The model is scripted (the SDK's
 * own tests do the same); the sidecar is real. */
import {
  Agent,
  type AgentInputItem,
  MemorySession,
  type Model,
  type ModelRequest,
  type ModelResponse,
  run,
  type Session,
  setTracingDisabled,
  tool,
  Usage,
} from "@openai/agents";
import { afterAll, describe, expect, it } from "vitest";
import { z } from "zod";

import { Client, Memlane } from "../src/index.js";
import { ITEM_FORMAT, MemlaneSession } from "../src/openai-agents.js";
import { target, unique } from "./helpers.js";

setTracingDisabled(true); // tracing would try to export to OpenAI's servers

const client = new Client(target());
afterAll(() => client.close());

const ITEMS = [
  { role: "user", content: 'Hi, I\'m Dana. Ünïcode 🚀 and "quotes" \\ too' },
  { role: "user", content: [{ type: "input_text", text: "part one" }, { type: "input_text", text: "two" }] },
  { type: "function_call", id: "fc_1", callId: "c1", name: "lookup", arguments: '{"q": "x"}', status: "completed" },
  { type: "function_call_result", callId: "c1", name: "lookup", status: "completed", output: { type: "text", text: "result 1" } },
  { type: "reasoning", id: "rs_1", content: [{ type: "input_text", text: "thinking" }] },
  { type: "message", id: "msg_1", role: "assistant", status: "completed", content: [{ type: "output_text", text: "Done." }] },
  { role: "system", content: "be brief" },
  { role: "user", content: "the same text twice" },
  { role: "user", content: "the same text twice" },
] as AgentInputItem[];

function memlane(userId = unique("u")): MemlaneSession {
  return new MemlaneSession(unique("chat"), client, { userId, agentId: "helper" });
}

async function sameAnswers(a: Session, b: Session, step: (s: Session) => Promise<unknown>): Promise<unknown> {
  const [x, y] = [await step(a), await step(b)];
  expect(y).toEqual(x);
  return x;
}

describe("MemlaneSession as the SDK's MemorySession", () => {
  it("add, get with and without a limit, pop, clear", async () => {
    const ref = new MemorySession();
    const ours = memlane();
    const both = (step: (s: Session) => Promise<unknown>) => sameAnswers(ref, ours, step);
    await both((s) => s.getItems()); // a session never written: empty, not an error
    await both((s) => s.popItem());
    await both((s) => s.clearSession());
    await both((s) => s.addItems(ITEMS.slice(0, 4)));
    await both((s) => s.addItems([]));
    await both((s) => s.addItems(ITEMS.slice(4)));
    expect(await both((s) => s.getItems())).toEqual(ITEMS); // exactly what was added
    for (const limit of [0, -1, 1, 3, ITEMS.length, 100]) await both((s) => s.getItems(limit));
    expect(await both((s) => s.popItem())).toEqual(ITEMS.at(-1));
    await both((s) => s.popItem());
    await both((s) => s.getItems());
    await both((s) => s.clearSession());
    await both((s) => s.getItems());
    await both((s) => s.popItem());
    await both((s) => s.addItems([ITEMS[0]!]));
    await both((s) => s.getItems());
  });

  it("keeps each item as one memlane message the sidecar can read", async () => {
    const ours = memlane();
    await ours.addItems(ITEMS.slice(0, 6));
    const stored = (await client.listMessages({ sessionId: ours.sessionId })).messages;
    expect(stored.map((m) => m.native?.format)).toEqual(Array(6).fill(ITEM_FORMAT));
    expect(stored.map((m) => m.content).slice(0, 4)).toEqual([
      (ITEMS[0] as { content: string }).content,
      "part one\ntwo",
      'lookup({"q": "x"})',
      "result 1",
    ]);
    expect(stored[2]!.toolCallIds).toEqual(["c1"]);
    expect(stored[5]!.sourceAgentId).toBe("helper");
    const session = (await client.getSession({ sessionId: ours.sessionId })).session!;
    expect([session.userId, session.channel]).toEqual([ours.userId, "openai-agents"]);
  });

  it("reads plain chat turns another client wrote, and skips their tool traffic", async () => {
    const ours = memlane();
    const m = new Memlane(client, { agentId: "helper" });
    await m.add(ours.userId, ours.sessionId, [
      { role: "user", content: "hello from the chat API" },
      { role: "assistant", content: null, tool_calls: [{ id: "t1", type: "function", function: { name: "f", arguments: "{}" } }] },
      { role: "tool", tool_call_id: "t1", content: "tool says" },
      { role: "assistant", content: "answer" },
    ]);
    expect(await ours.getItems()).toEqual([
      { role: "user", content: "hello from the chat API" },
      { role: "assistant", status: "completed", content: [{ type: "output_text", text: "answer" }] },
    ]);
  });
});

/** Returns the scripted outputs in order and records the input of every call. */
class ScriptedModel implements Model {
  readonly inputs: unknown[] = [];
  constructor(private readonly script: ModelResponse["output"][]) {}

  async getResponse(request: ModelRequest): Promise<ModelResponse> {
    this.inputs.push(structuredClone(request.input));
    const output = this.script.shift();
    if (output === undefined) throw new Error("the script ran out");
    return { usage: new Usage(), output };
  }

  getStreamedResponse(): AsyncIterable<never> {
    throw new Error("not scripted");
  }
}

function script(): ModelResponse["output"][] {
  return [
    [{ type: "function_call", id: "fc_w", callId: "call_w", name: "weather", arguments: '{"city":"Lisbon"}', status: "completed" }],
    [{ type: "message", id: "msg_a", role: "assistant", status: "completed", content: [{ type: "output_text", text: "Sunny in Lisbon." }] }],
    [{ type: "message", id: "msg_b", role: "assistant", status: "completed", content: [{ type: "output_text", text: "You asked about Lisbon." }] }],
  ];
}

const weather = tool({
  name: "weather",
  description: "The weather in a city.",
  parameters: z.object({ city: z.string() }),
  execute: async ({ city }) => `sunny in ${city}`,
});

async function converse(session: Session): Promise<{ inputs: unknown[]; outputs: unknown[] }> {
  const model = new ScriptedModel(script());
  const agent = new Agent({ name: "helper", instructions: "Be brief.", model, tools: [weather] });
  const first = await run(agent, "What's the weather in Lisbon?", { session });
  const second = await run(agent, "What did I ask about?", { session });
  return { inputs: model.inputs, outputs: [first.finalOutput, second.finalOutput] };
}

describe("MemlaneSession with the SDK's Runner", () => {
  it("sends the model the same history as MemorySession, and stores the same items", async () => {
    const ref = new MemorySession();
    const ours = memlane();
    const [expected, actual] = [await converse(ref), await converse(ours)];
    expect(actual.outputs).toEqual(["Sunny in Lisbon.", "You asked about Lisbon."]);
    expect(actual).toEqual(expected);
    // The second turn saw the whole first turn (the tool call and its result) from memlane.
    expect(JSON.stringify(actual.inputs[2])).toContain("sunny in Lisbon");
    expect(await ours.getItems()).toEqual(await ref.getItems());
    expect((await client.getSession({ sessionId: ours.sessionId })).session?.messageCount).toBe(
      BigInt((await ref.getItems()).length),
    );
  });
});
