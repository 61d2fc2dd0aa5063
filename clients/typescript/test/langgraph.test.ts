/** `MemlaneSaver` through LangGraph.js's own conformance suite (@langchain/langgraph-checkpoint-validation):
 * every capability of the default spec (put, putWrites, getTuple, list, deleteThread) plus the opt-in
 * getDeltaChannelHistory walk, against the real sidecar. Each checkpointer instance is a fresh user, and
 * that user is erased when the suite destroys it, so instances never see each other's threads. */
import type { CheckpointSaverTestInitializer } from "@langchain/langgraph-checkpoint-validation";
import { deltaChannelHistoryTests, validate } from "@langchain/langgraph-checkpoint-validation";

import { MemlaneSaver } from "../src/langgraph.js";
import { target, unique } from "./helpers.js";

const initializer: CheckpointSaverTestInitializer<MemlaneSaver> = {
  checkpointerName: "MemlaneSaver",
  createCheckpointer: () => new MemlaneSaver(target(), { userId: unique("lg") }),
  async destroyCheckpointer(saver) {
    await saver.client.forgetUser({ userId: saver.userId });
    saver.close();
  },
};

validate(initializer);
deltaChannelHistoryTests(initializer);
