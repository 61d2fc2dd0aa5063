/** The full client against the real sidecar: typed errors with the server's details, retries with the
 * idempotency rules, deadlines, the server-streamed context. */
import { afterAll, describe, expect, it } from "vitest";

import {
  AlreadyExistsError,
  Client,
  ClientError,
  DeadlineExceededError,
  InvalidArgumentError,
  MemlaneError,
  MemoryKind,
  NO_RETRY,
  NotFoundError,
  Provenance,
  iterPages,
  ResourceExhaustedError,
  RetryableError,
  Role,
  UnavailableError,
} from "../src/index.js";
import { freePort, lateRelay, target, unique } from "./helpers.js";

const client = new Client(target(), { timeoutMs: 20_000 });
afterAll(() => client.close());

describe("typed errors", () => {
  it("carry the status, reason and field the server sent", async () => {
    const err = await client.createSession({ sessionId: "a/b", userId: "u" }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(InvalidArgumentError);
    expect(err).toBeInstanceOf(ClientError);
    expect(err).toBeInstanceOf(MemlaneError);
    const e = err as InvalidArgumentError;
    expect([e.status, e.reason, e.field, e.retryable]).toEqual(["INVALID_ARGUMENT", "INVALID_ID", "session_id", false]);
    expect(e.message).toContain("session_id");
  });

  it("are one class per code", async () => {
    await expect(client.getSession({ sessionId: unique("missing") })).rejects.toBeInstanceOf(NotFoundError);
    const sid = unique("s");
    await client.createSession({ sessionId: sid, userId: unique("alice") });
    await expect(client.createSession({ sessionId: sid, userId: unique("bob") })).rejects.toBeInstanceOf(
      AlreadyExistsError,
    );
    const big = await client
      .appendMessages({ sessionId: sid, messages: [{ role: Role.USER, content: "x".repeat(300 * 1024) }] })
      .catch((e: unknown) => e);
    expect(big).toBeInstanceOf(ResourceExhaustedError);
    expect([(big as ResourceExhaustedError).reason, (big as ResourceExhaustedError).retryable]).toEqual([
      "MESSAGE_TOO_LARGE",
      false,
    ]);
    expect((big as ResourceExhaustedError).field).toMatch(/^messages\[0\]/);
  });

  it("include the deadline", async () => {
    const slow = client.assembleContext({ sessionId: unique("s") }, { timeoutMs: 1 });
    const err = await (async () => {
      for await (const _ of slow) void _;
    })().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(DeadlineExceededError);
    expect((err as DeadlineExceededError).retryable).toBe(true);
  });
});

describe("retries", () => {
  it("an unreachable sidecar is UNAVAILABLE, retryable", async () => {
    const dead = new Client(`127.0.0.1:${await freePort()}`, { retry: NO_RETRY });
    try {
      const err = await dead.listSessions({ userId: "u" }).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(UnavailableError);
      expect(err).toBeInstanceOf(RetryableError);
    } finally {
      dead.close();
    }
  });

  it("idempotent writes are retried until the sidecar is back, and land once", async () => {
    const port = await freePort();
    const relay = lateRelay(port, 300);
    const retrying = new Client(`127.0.0.1:${port}`, {
      retry: { ...NO_RETRY, maxAttempts: 30, initialBackoff: 0.05, maxBackoff: 0.1 },
    });
    try {
      const sid = unique("s");
      // No ids given: the client fills them before the first attempt, so every attempt is the same write.
      const created = await retrying.createSession({ userId: unique("u") });
      expect(created.session?.sessionId).toMatch(/^[0-9A-HJKMNP-TV-Z]{26}$/);
      await retrying.createSession({ sessionId: sid, userId: created.session!.userId });
      const msg = { role: Role.USER, content: "hello" };
      const first = await retrying.appendMessages({ sessionId: sid, messages: [msg] });
      const id = first.results[0]!.messageId;
      expect(id).toHaveLength(26);
      const again = await retrying.appendMessages({ sessionId: sid, messages: [{ ...msg, messageId: id }] });
      expect(again.results[0]!.duplicate).toBe(true);
      expect((await client.listMessages({ sessionId: sid })).messages.map((m) => m.content)).toEqual(["hello"]);
    } finally {
      retrying.close();
      await relay.close();
    }
  });

  it("a write that cannot be made idempotent is sent once; with its id it is retried", async () => {
    const user = unique("u");
    const port = await freePort();
    const relay = lateRelay(port, 300);
    const retrying = new Client(`127.0.0.1:${port}`, {
      retry: { ...NO_RETRY, maxAttempts: 30, initialBackoff: 0.05, maxBackoff: 0.1 },
    });
    try {
      const caller = { userId: user };
      const once = retrying.createMemory({ caller, kind: MemoryKind.FACT, content: "Plays the oboe." });
      await expect(once).rejects.toBeInstanceOf(UnavailableError); // no memoryId: never retried
      const retried = await retrying.createMemory({
        caller,
        memoryId: unique("m"),
        kind: MemoryKind.FACT,
        content: "Plays the oboe.",
      });
      expect(retried.memory?.content).toBe("Plays the oboe.");
      await relay.ready;
      expect((await client.listMemories({ caller })).memories).toHaveLength(1);
    } finally {
      retrying.close();
      await relay.close();
    }
  });
});

describe("streamed context", () => {
  it("arrives block by block, the stats last", async () => {
    const sid = unique("s");
    await client.createSession({ sessionId: sid, userId: unique("u") });
    await client.appendMessages({ sessionId: sid, messages: [{ role: Role.USER, content: "I live in Porto." }] });
    const responses = [];
    for await (const r of client.assembleContext({ sessionId: sid, userInput: "where?", systemPrompt: "Be brief." })) {
      responses.push(r);
    }
    const blocks = responses.flatMap((r) => r.blocks);
    expect(blocks[0]?.provenance).toBe(Provenance.SYSTEM);
    expect(blocks.flatMap((b) => b.messages.map((m) => m.content))).toContain("I live in Porto.");
    expect(responses.at(-1)?.stats?.totalTokens).toBeGreaterThan(0);
    expect(responses.slice(0, -1).every((r) => r.stats === undefined)).toBe(true);
  });
});

describe("pagination", () => {
  it("iterPages walks every page", async () => {
    const sid = unique("s");
    await client.createSession({ sessionId: sid, userId: unique("u") });
    const texts = ["one", "two", "three", "four", "five"];
    await client.appendMessages({ sessionId: sid, messages: texts.map((content) => ({ role: Role.USER, content })) });
    const seen: string[] = [];
    for await (const msg of iterPages(
      (pageToken) => client.listMessages({ sessionId: sid, pageSize: 2, pageToken }),
      (page) => page.messages,
    )) {
      seen.push(msg.content);
    }
    expect(seen).toEqual(texts);
  });
});
