/** The whole lifecycle on the high-level class (issue 47, item 3), against the real sidecar: mem0's
 * `Memory` operations (remember with a slot, get, getAll, update, delete, history) and a conversation's
 * (context on a conversation not created yet, closeSession), each with an unknown id answered
 * `NotFoundError`, and the same method names as Python's `Memlane` (in camelCase). Before, the class had
 * add, search, remember, context and forgetUser only, and context() on a new conversation was NOT_FOUND. */
import { execFileSync } from "node:child_process";
import { afterAll, describe, expect, it } from "vitest";

import {
  FailedPreconditionError,
  InvalidArgumentError,
  Memlane,
  MemoryChangeReason as R,
  MemoryKind,
  NotFoundError,
  SessionStatus,
} from "../src/index.js";
import { target, unique } from "./helpers.js";
import { python } from "./sidecar.js";

const UNKNOWN = "mem_never_stored";
const m = new Memlane(target(), { agentId: "support-bot", channel: "web" });
const viewer = new Memlane(target()); // names no agent: the whole-user view (auth off)
afterAll(() => {
  m.close();
  viewer.close();
});

describe("Memlane lifecycle", () => {
  it("has the Python Memlane's methods, in camelCase", () => {
    const code = [
      "import memlane",
      "print(' '.join(sorted(n for n in vars(memlane.Memlane) if not n.startswith('_'))))",
    ].join("\n");
    const py = execFileSync(python(), ["-c", code], { encoding: "utf8", env: process.env }).trim().split(" ");
    const camel = py.map((n) => n.replace(/_([a-z])/g, (_, c: string) => c.toUpperCase()));
    const ours = Object.getOwnPropertyNames(Memlane.prototype).filter((n) => n !== "constructor");
    expect(ours.sort()).toEqual(camel.sort());
    expect(camel).toEqual(expect.arrayContaining(["get", "getAll", "update", "delete", "history", "closeSession"]));
  });

  it("a memory from remember to delete", async () => {
    const user = unique("u");
    const porto = await m.remember(user, "Lives in Porto, Portugal.", { slot: "location" });
    const berlin = await m.remember(user, "Moved to Berlin last week.", { slot: "location" });
    const units = await m.remember(user, "Wants metric units.", { kind: MemoryKind.PREFERENCE });

    const got = await m.get(user, berlin);
    expect([got.content, got.slot, got.kind]).toEqual(["Moved to Berlin last week.", "location", MemoryKind.FACT]);
    // The newer value of the slot is the one served; the older stays, retired, in its history.
    expect((await m.getAll(user)).map((x) => x.memoryId)).toEqual([units, berlin]);
    expect((await m.getAll(user, { kinds: [MemoryKind.PREFERENCE] })).map((x) => x.memoryId)).toEqual([units]);
    expect((await m.getAll(user, { limit: 1 })).map((x) => x.memoryId)).toEqual([units]);
    const retired = await m.history(user, porto);
    expect(retired.map((v) => v.reason)).toEqual([R.CREATE, R.SUPERSEDE]);
    expect(retired.at(-1)?.memory?.supersededBy).toBe(berlin);

    const edited = await m.update(user, berlin, "Moved to Berlin-Mitte last week.", { importance: 0.9 });
    expect([edited.content, edited.slot]).toEqual(["Moved to Berlin-Mitte last week.", "location"]);
    expect(edited.importance).toBeCloseTo(0.9);
    expect((await m.update(user, units, undefined, { slot: "units" })).slot).toBe("units"); // only what is given
    expect((await m.get(user, units)).content).toBe("Wants metric units.");
    const versions = await m.history(user, berlin);
    expect(versions.map((v) => v.reason)).toEqual([R.CREATE, R.EDIT]);
    expect(versions.map((v) => v.changedBy)).toEqual(["support-bot", "support-bot"]);
    expect(versions[0]?.memory?.content).toBe("Moved to Berlin last week.");
    expect(await m.history(user, berlin, { limit: 1 })).toHaveLength(1);

    await m.delete(user, berlin);
    await expect(m.get(user, berlin)).rejects.toBeInstanceOf(NotFoundError);
    expect((await m.getAll(user)).map((x) => x.memoryId)).toEqual([units]);
    const last = (await viewer.history(user, berlin)).at(-1);
    expect([last?.reason, last?.deleted]).toEqual([R.DELETE, true]);
    expect(await viewer.history(user, UNKNOWN)).toEqual([]);

    for (const call of [
      () => m.get(user, UNKNOWN),
      () => m.update(user, UNKNOWN, "anything"),
      () => m.delete(user, UNKNOWN),
      () => m.history(user, UNKNOWN),
      () => m.delete(user, berlin), // deleted already
    ]) {
      await expect(call()).rejects.toBeInstanceOf(NotFoundError);
    }
    await expect(m.update(user, units)).rejects.toBeInstanceOf(InvalidArgumentError); // nothing to change
    await expect(m.getAll(user, { limit: 0 })).rejects.toBeInstanceOf(RangeError);
    expect(await m.getAll(unique("nobody"))).toEqual([]);
  });

  it("context on a conversation not created yet", async () => {
    const user = unique("u");
    const sid = unique("chat");
    await m.remember(user, "Prefers email over phone calls.", { kind: MemoryKind.PREFERENCE });

    const chat = await m.context(sid, "how should we reach me?", { userId: user });
    expect(chat.at(-1)).toEqual({ role: "user", content: "how should we reach me?" });
    expect(chat.some((c) => c.role === "system" && String(c.content).includes("Prefers email"))).toBe(true);
    const session = (await m.client.getSession({ sessionId: sid })).session!;
    expect([session.userId, session.agentId, session.channel]).toEqual([user, "support-bot", "web"]);
    expect((await m.add(user, sid, [{ role: "user", content: "By email, please." }])).map((r) => r.seq)).toEqual([1n]);

    const other = unique("chat");
    const refused = m.context(other, "hello");
    await expect(refused).rejects.toBeInstanceOf(NotFoundError);
    await expect(refused).rejects.toThrow(/pass \{ userId \} to context\(\)/);
    await expect(m.client.getSession({ sessionId: other })).rejects.toBeInstanceOf(NotFoundError); // none made

    // Erased behind this client's back (it remembers the session as created): created again, once.
    await viewer.forgetUser(user);
    expect((await m.context(sid, "still there?", { userId: user })).at(-1)).toEqual({
      role: "user",
      content: "still there?",
    });
    expect((await m.client.getSession({ sessionId: sid })).session?.messageCount).toBe(0n);
  });

  it("closeSession ends the conversation", async () => {
    const user = unique("u");
    const sid = unique("chat");
    await m.add(user, sid, [{ role: "user", content: "That is all, thanks." }]);
    const closed = await m.closeSession(sid);
    expect([closed.sessionId, closed.status]).toEqual([sid, SessionStatus.CLOSED]);
    expect((await m.closeSession(sid)).status).toBe(SessionStatus.CLOSED); // idempotent
    await expect(m.add(user, sid, [{ role: "user", content: "One more thing." }])).rejects.toBeInstanceOf(
      FailedPreconditionError,
    );
    await expect(m.closeSession(unique("chat"))).rejects.toBeInstanceOf(NotFoundError);
  });
});
