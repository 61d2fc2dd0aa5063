/** The high-level class against the real sidecar: sessions created on first use, the context as OpenAI
 * chat messages (given back exactly as added, from this client or the Python one), remember / search,
 * forget a user. */
import { execFileSync } from "node:child_process";
import { afterAll, describe, expect, it } from "vitest";

import { CHAT_FORMAT, Memlane, MemoryKind, NotFoundError } from "../src/index.js";
import { target, unique } from "./helpers.js";
import { python } from "./sidecar.js";

const TOOL_CALL = {
  role: "assistant",
  content: null,
  tool_calls: [{ id: "call_1", type: "function", function: { name: "refund", arguments: "{}" } }],
};

const m = new Memlane(target(), { agentId: "support-bot", channel: "web" });
afterAll(() => m.close());

describe("Memlane", () => {
  it("search leaves out matches weaker than minScore (issue 31)", async () => {
    const user = unique("ms");
    const strong = await m.remember(user, "Prefers vim keybindings in every editor.", { kind: MemoryKind.PREFERENCE });
    const weak = await m.remember(user, "User's dog is named Rex.", { kind: MemoryKind.PREFERENCE });
    const every = await m.search(user, "keybindings");
    expect(new Set(every.map((h) => h.memory?.memoryId))).toEqual(new Set([strong, weak])); // the weak hit is there
    const kept = await m.search(user, "keybindings", { minScore: 0.5 });
    expect(kept.map((h) => h.memory?.memoryId)).toEqual([strong]); // positive control: the strong one stays
  });

  it("the common path", async () => {
    const user = unique("u");
    const sid = unique("chat");
    const first = await m.add(user, sid, [{ role: "user", content: "My order 4417 arrived damaged." }]);
    expect(first.map((r) => r.seq)).toEqual([1n]);
    expect(first[0]!.tokenCount).toBeGreaterThan(0);
    const session = (await m.client.getSession({ sessionId: sid })).session!;
    expect([session.userId, session.agentId, session.channel]).toEqual([user, "support-bot", "web"]);
    const more = await m.add(user, sid, [
      TOOL_CALL,
      { role: "tool", tool_call_id: "call_1", content: "refund queued" },
      { role: "assistant", content: [{ type: "text", text: "Refund on its way." }] },
    ]);
    expect(more.map((r) => r.seq)).toEqual([2n, 3n, 4n]);

    const memoryId = await m.remember(user, "Prefers email over phone calls.", { kind: MemoryKind.PREFERENCE });
    const hits = await m.search(user, "how should we contact the customer?");
    expect(hits.map((h) => h.memory?.memoryId).slice(0, 1)).toEqual([memoryId]);
    expect(hits[0]!.parts).toBeDefined();

    const question = "how should we contact them about order 4417?";
    const withQuestion = await m.context(sid, question, { systemPrompt: "Be brief." });
    expect(withQuestion.at(-1)).toEqual({ role: "user", content: question }); // as Python's context()
    const chat = await m.context(sid, question, { systemPrompt: "Be brief.", includeInput: false });
    expect(chat).toEqual(withQuestion.slice(0, -1));
    expect(chat[0]).toEqual({ role: "system", content: "Be brief." });
    const tail = chat.slice(-4);
    expect(tail[0]).toEqual({ role: "user", content: "My order 4417 arrived damaged." });
    expect(tail[1]).toEqual(TOOL_CALL);
    expect(tail[2]).toEqual({ role: "tool", tool_call_id: "call_1", content: "refund queued" });
    expect(tail[3]!.content).toEqual([{ type: "text", text: "Refund on its way." }]);
    expect(chat.slice(1, -4).some((c) => c.role === "system" && String(c.content).includes("Prefers email"))).toBe(true);

    // Stored in the format the Python client reads back (the same native object).
    const stored = (await m.client.listMessages({ sessionId: sid })).messages;
    expect(stored.every((s) => s.native?.format === CHAT_FORMAT)).toBe(true);

    const erased = await m.forgetUser(user);
    expect(Object.values(erased).reduce((a, b) => a + b, 0)).toBeGreaterThan(0);
    await expect(m.client.getSession({ sessionId: sid })).rejects.toBeInstanceOf(NotFoundError);
  });

  it("ends the context with the question once, also when it was added first", async () => {
    const user = unique("u");
    const sid = unique("chat");
    await m.add(user, sid, [{ role: "user", content: "Where is parcel 7781?" }]);
    const chat = await m.context(sid, "Where is parcel 7781?");
    expect(chat.filter((c) => c.content === "Where is parcel 7781?")).toHaveLength(1);
    expect(chat.at(-1)).toEqual({ role: "user", content: "Where is parcel 7781?" });
    // The same window as the Python client gives for the same call.
    const code = [
      "import json, sys, memlane",
      "with memlane.Memlane(sys.argv[1]) as m:",
      "    print(json.dumps([m.context(sys.argv[2], q, system_prompt='') for q in sys.argv[3:]]))",
    ].join("\n");
    const questions = ["Where is parcel 7781?", "And parcel 7782?"];
    const out = execFileSync(python(), ["-c", code, target(), sid, ...questions], { encoding: "utf8", env: process.env });
    const ours = await Promise.all(questions.map((q) => m.context(sid, q, { systemPrompt: "" })));
    expect(JSON.parse(out)).toEqual(ours);
    expect(ours[1]!.at(-1)).toEqual({ role: "user", content: "And parcel 7782?" });
  });

  it("creates the session again after it was erased", async () => {
    const user = unique("u");
    const sid = unique("chat");
    await m.add(user, sid, [{ role: "user", content: "one" }]);
    await m.forgetUser(user);
    const again = await m.add(user, sid, [{ role: "user", content: "two" }]);
    expect(again.map((r) => r.seq)).toEqual([1n]);
  });

  it("refuses a role it does not know, before any call", async () => {
    await expect(m.add(unique("u"), unique("chat"), [{ role: "wizard", content: "x" }])).rejects.toThrow(/role/);
  });
});

describe("the same storage format as the Python client", () => {
  it("the Python Memlane reads back what this one added, and the other way round", async () => {
    const user = unique("u");
    const sid = unique("chat");
    await m.add(user, sid, [{ role: "user", content: "Ünïcode 🚀 from TypeScript" }, TOOL_CALL]);
    const code = [
      "import json, sys, memlane",
      "with memlane.Memlane(sys.argv[1], agent_id='py-bot') as m:",
      "    m.add(sys.argv[2], sys.argv[3], [{'role': 'assistant', 'content': 'from Python'}])",
      "    print(json.dumps(m.context(sys.argv[3], system_prompt='')))",
    ].join("\n");
    const out = execFileSync(python(), ["-c", code, target(), user, sid], { encoding: "utf8", env: process.env });
    const fromPython = JSON.parse(out) as unknown[];
    expect(fromPython).toEqual(await m.context(sid, "", { systemPrompt: "" }));
    expect(fromPython.slice(-3)).toEqual([
      { role: "user", content: "Ünïcode 🚀 from TypeScript" },
      TOOL_CALL,
      { role: "assistant", content: "from Python" },
    ]);
  });
});
