/**
 * `MemlaneSaver`: a LangGraph.js checkpointer whose threads are memlane sessions.
 *
 *     import { MemlaneSaver } from "memlane/langgraph";
 *     const graph = builder.compile({ checkpointer: new MemlaneSaver("127.0.0.1:50051", { userId: "alice" }) });
 *     await graph.invoke(inputs, { configurable: { thread_id: sessionId } });
 *
 * The first put (or put of writes) to an unknown thread creates the session, for `configurable.user_id`
 * or the saver's `userId`. Channel values are stored once per (namespace, channel, version), like
 * LangGraph's own savers and the Python `MemlaneSaver`: a put sends only the channels in `newVersions`,
 * a read gets back the values at the checkpoint's versions. Metadata travels as JSON, so the sidecar
 * filters on it. `list` without a thread lists the threads of this saver's user and channel.
 */
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { RunnableConfig } from "@langchain/core/runnables";
import {
  BaseCheckpointSaver,
  type ChannelVersions,
  type Checkpoint,
  type CheckpointListOptions,
  type CheckpointMetadata,
  type CheckpointPendingWrite,
  type CheckpointTuple,
  compareWritesSortKeys,
  maxChannelVersion,
  type PendingWrite,
  type SerializerProtocol,
  TASKS,
  WRITES_IDX_MAP,
  writesSortKey,
} from "@langchain/langgraph-checkpoint";

import { Client, type ClientOptions, DEFAULT_TARGET } from "./client.js";
import * as mirror from "./langgraph-mirror.js";
import { NotFoundError } from "./errors.js";
import type {
  CheckpointRecord,
  ListCheckpointsRequestSchema,
  TypedValue,
  TypedValueSchema,
} from "./gen/memlane/v1/checkpoint_pb.js";

const EMPTY = "empty"; // the type of a channel that has a version but no value (LangGraph's convention)
const PAGE = 100;

export interface MemlaneSaverOptions extends ClientOptions {
  /** User of the sessions this saver creates, unless the config names one (`configurable.user_id`). */
  userId?: string;
  /** Channel of the sessions it creates (and of the threads `list` without a thread goes through). */
  channel?: string;
  /** Mirror the `messages` channel into the session's messages (default true). */
  mirrorMessages?: boolean;
  serde?: SerializerProtocol;
}

interface Thread {
  threadId: string;
  ns: string;
}

function threadOf(config: RunnableConfig): Thread {
  const conf = config.configurable;
  const threadId = conf?.thread_id;
  if (threadId === undefined || threadId === null || threadId === "") {
    throw new Error("config.configurable.thread_id is required (it is the memlane session id)");
  }
  return { threadId: String(threadId), ns: String(conf?.checkpoint_ns ?? "") };
}

function checkpointIdOf(config: RunnableConfig | undefined): string {
  const conf = config?.configurable;
  return String(conf?.checkpoint_id ?? conf?.thread_ts ?? "");
}

function configOf(threadId: string, ns: string, checkpointId: string): RunnableConfig {
  return { configurable: { thread_id: threadId, checkpoint_ns: ns, checkpoint_id: checkpointId } };
}

// Numeric channel versions, as LangGraph.js's own savers (and what `compile({ checkpointer })` expects);
// they travel as their decimal text.
export class MemlaneSaver extends BaseCheckpointSaver {
  readonly client: Client;
  readonly userId: string;
  readonly agentId: string;
  readonly channel: string;
  readonly mirrorMessages: boolean;
  readonly #owns: boolean;
  readonly #mirrored = new Map<string, Set<string>>(); // thread -> message ids mirrored into the session

  constructor(target: string | Client = DEFAULT_TARGET, options: MemlaneSaverOptions = {}) {
    super(options.serde);
    this.#owns = !(target instanceof Client);
    this.client = target instanceof Client ? target : new Client(target, options);
    this.userId = options.userId ?? "langgraph";
    this.agentId = options.agentId ?? "";
    this.channel = options.channel ?? "langgraph";
    this.mirrorMessages = options.mirrorMessages ?? true;
  }

  /** Closes the client this saver made (not one it was given). */
  close(): void {
    if (this.#owns) this.client.close();
  }

  async #typed(value: unknown): Promise<MessageInitShape<typeof TypedValueSchema>> {
    const [type, data] = await this.serde.dumpsTyped(value);
    return { type, data };
  }

  async #untyped(value: TypedValue | undefined): Promise<unknown> {
    return this.serde.loadsTyped(value?.type ?? "json", value?.data ?? new Uint8Array());
  }

  async #ensureSession(config: RunnableConfig, sessionId: string): Promise<void> {
    const userId = String(config.configurable?.user_id ?? this.userId);
    await this.client.createSession({ sessionId, userId, agentId: this.agentId, channel: this.channel });
  }

  /** Runs a write, creating the thread's session first when it does not exist yet. */
  async #withSession<T>(config: RunnableConfig, sessionId: string, write: () => Promise<T>): Promise<T> {
    try {
      return await write();
    } catch (err) {
      if (!(err instanceof NotFoundError)) throw err;
      await this.#ensureSession(config, sessionId);
      return await write();
    }
  }

  async #tuple(r: CheckpointRecord): Promise<CheckpointTuple> {
    const checkpoint = (await this.#untyped(r.checkpoint)) as Checkpoint;
    const values: Record<string, unknown> = {};
    for (const v of r.channelValues) {
      if (v.value?.type !== EMPTY) values[v.channel] = await this.#untyped(v.value);
    }
    checkpoint.channel_values = values;
    const writes = [...r.pendingWrites].sort((a, b) =>
      compareWritesSortKeys(writesSortKey(a.taskPath, a.taskId, a.index), writesSortKey(b.taskPath, b.taskId, b.index)),
    );
    const pendingWrites: CheckpointPendingWrite[] = [];
    for (const w of writes) pendingWrites.push([w.taskId, w.channel, await this.#untyped(w.value)]);
    if (checkpoint.v < 4 && r.parentCheckpointId) await this.#migratePendingSends(checkpoint, r);
    const tuple: CheckpointTuple = {
      config: configOf(r.sessionId, r.namespace, r.checkpointId),
      checkpoint,
      metadata: (r.metadataJson ? JSON.parse(r.metadataJson) : {}) as CheckpointMetadata,
      pendingWrites,
    };
    if (r.parentCheckpointId) tuple.parentConfig = configOf(r.sessionId, r.namespace, r.parentCheckpointId);
    return tuple;
  }

  /** Checkpoints of format < 4 kept pending sends as the parent's TASKS writes: fold them in, as
   * LangGraph's own savers do. */
  async #migratePendingSends(checkpoint: Checkpoint, r: CheckpointRecord): Promise<void> {
    const parent = await this.client.getCheckpoint({
      sessionId: r.sessionId,
      namespace: r.namespace,
      checkpointId: r.parentCheckpointId,
    });
    const sends: unknown[] = [];
    const writes = parent.found ? [...(parent.checkpoint?.pendingWrites ?? [])] : [];
    writes.sort((a, b) =>
      compareWritesSortKeys(writesSortKey(a.taskPath, a.taskId, a.index), writesSortKey(b.taskPath, b.taskId, b.index)),
    );
    for (const w of writes) if (w.channel === TASKS) sends.push(await this.#untyped(w.value));
    checkpoint.channel_values ??= {};
    checkpoint.channel_values[TASKS] = sends;
    checkpoint.channel_versions ??= {};
    const versions = Object.values(checkpoint.channel_versions);
    checkpoint.channel_versions[TASKS] =
      versions.length > 0 ? maxChannelVersion(...versions) : this.getNextVersion(undefined);
  }

  async getTuple(config: RunnableConfig): Promise<CheckpointTuple | undefined> {
    if (!config.configurable?.thread_id) return undefined; // no thread, no checkpoint (as MemorySaver)
    const { threadId, ns } = threadOf(config);
    const reply = await this.client.getCheckpoint({ sessionId: threadId, namespace: ns, checkpointId: checkpointIdOf(config) });
    return reply.found && reply.checkpoint ? this.#tuple(reply.checkpoint) : undefined;
  }

  async *list(config: RunnableConfig, options: CheckpointListOptions = {}): AsyncGenerator<CheckpointTuple> {
    const { before, filter } = options;
    let left = options.limit;
    const conf = config.configurable ?? {};
    const only = checkpointIdOf(config);
    const threads = conf.thread_id ? [String(conf.thread_id)] : this.#threads();
    for await (const sessionId of threads) {
      const req: MessageInitShape<typeof ListCheckpointsRequestSchema> = {
        sessionId,
        beforeCheckpointId: before ? checkpointIdOf(before) : "",
        metadataFilterJson: filter && Object.keys(filter).length > 0 ? JSON.stringify(filter) : "",
        pageSize: Math.min(left ?? PAGE, PAGE) || 1,
      };
      if (conf.checkpoint_ns !== undefined) req.namespace = String(conf.checkpoint_ns);
      for (;;) {
        if (left !== undefined && left <= 0) return;
        let page;
        try {
          page = await this.client.listCheckpoints(req);
        } catch (err) {
          if (err instanceof NotFoundError) break; // no such thread: nothing to list
          throw err;
        }
        for (const r of page.checkpoints) {
          if (only && r.checkpointId !== only) continue;
          if (left !== undefined) {
            if (left <= 0) return;
            left -= 1;
          }
          yield await this.#tuple(r);
        }
        if (!page.nextPageToken) break;
        req.pageToken = page.nextPageToken;
      }
    }
  }

  /** The sessions of this saver's user and channel (the threads `list` goes through without a thread). */
  async *#threads(): AsyncGenerator<string> {
    let pageToken = "";
    for (;;) {
      const page = await this.client.listSessions({ userId: this.userId, channel: this.channel, pageSize: 100, pageToken });
      for (const s of page.sessions) yield s.sessionId;
      pageToken = page.nextPageToken;
      if (!pageToken) return;
    }
  }

  async put(
    config: RunnableConfig,
    checkpoint: Checkpoint,
    metadata: CheckpointMetadata,
    newVersions: ChannelVersions,
  ): Promise<RunnableConfig> {
    const { threadId, ns } = threadOf(config);
    const { channel_values: values = {}, ...rest } = checkpoint;
    const newValues = [];
    for (const [ch, version] of Object.entries(newVersions)) {
      newValues.push({
        channel: ch,
        version: String(version),
        value: ch in values ? await this.#typed((values as Record<string, unknown>)[ch]) : { type: EMPTY },
      });
    }
    const request = {
      sessionId: threadId,
      namespace: ns,
      checkpointId: checkpoint.id,
      parentCheckpointId: checkpointIdOf(config),
      checkpoint: await this.#typed(rest),
      // Values JSON cannot hold are kept as their text: metadata is for filtering, not for state.
      metadataJson: JSON.stringify(metadata ?? {}, (_k, v: unknown) => (typeof v === "bigint" ? String(v) : v)),
      channelVersions: Object.fromEntries(Object.entries(checkpoint.channel_versions).map(([k, v]) => [k, String(v)])),
      newValues,
    };
    await this.#withSession(config, threadId, () => this.client.putCheckpoint(request));
    if (this.mirrorMessages && !ns && mirror.CHANNEL in newVersions) {
      await this.#mirror(threadId, (values as Record<string, unknown>)[mirror.CHANNEL]);
    }
    return configOf(threadId, ns, checkpoint.id);
  }

  async #mirror(sessionId: string, messages: unknown): Promise<void> {
    let known = this.#mirrored.get(sessionId);
    if (known === undefined) {
      known = new Set();
      let pageToken = "";
      do {
        const page = await this.client.listMessages({ sessionId, pageSize: 1000, pageToken });
        for (const id of mirror.mirroredIds(page)) known.add(id);
        pageToken = page.nextPageToken;
      } while (pageToken);
    }
    const p = mirror.plan(known, messages);
    if (p.append.length > 0) await this.client.appendMessages({ sessionId, messages: p.append });
    if (p.remove.length > 0) await this.client.removeMessages({ sessionId, messageIds: p.remove });
    this.#mirrored.set(sessionId, p.ids);
  }

  async putWrites(config: RunnableConfig, writes: PendingWrite[], taskId: string, taskPath = ""): Promise<void> {
    const { threadId, ns } = threadOf(config);
    const checkpointId = checkpointIdOf(config);
    if (!checkpointId) throw new Error("putWrites needs config.configurable.checkpoint_id");
    const encoded = [];
    for (const [i, [channel, value]] of writes.entries()) {
      encoded.push({ taskId, index: WRITES_IDX_MAP[channel] ?? i, channel, value: await this.#typed(value), taskPath });
    }
    const request = { sessionId: threadId, namespace: ns, checkpointId, writes: encoded };
    // Writes may reach a new thread before its first checkpoint.
    await this.#withSession(config, threadId, () => this.client.putCheckpointWrites(request));
  }

  /** Drops the thread's framework state (checkpoints and writes); the session's messages stay. */
  async deleteThread(threadId: string): Promise<void> {
    this.#mirrored.delete(String(threadId));
    try {
      await this.client.deleteCheckpoints({ sessionId: String(threadId) });
    } catch (err) {
      if (!(err instanceof NotFoundError)) throw err;
    }
  }
}
