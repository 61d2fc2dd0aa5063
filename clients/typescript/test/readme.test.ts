/** The README's `quickstart` and `langgraph` blocks, run as a user would (their own Node process,
 * importing the built package by its name) against the real sidecar. */
import { execFileSync } from "node:child_process";
import { readFileSync, rmSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { describe, expect, it } from "vitest";

import { target } from "./helpers.js";

const ROOT = resolve(import.meta.dirname, "..");
const README = readFileSync(join(ROOT, "README.md"), "utf8");

function block(tag: string): string {
  const found = README.match(new RegExp("```js " + tag + "\\n([\\s\\S]*?)```"));
  if (!found?.[1]) throw new Error(`README has no \`\`\`js ${tag} block`);
  return found[1];
}

/** Runs `code` as an ES module inside the package (so `import "memlane"` resolves to it); its stdout. */
function runModule(code: string): string {
  const file = join(ROOT, "test", `.readme-${process.pid}.mjs`);
  writeFileSync(file, code);
  try {
    return execFileSync(process.execPath, [file], {
      env: { ...process.env, MEMLANE_TARGET: target() },
      encoding: "utf8",
      timeout: 60_000,
    });
  } finally {
    rmSync(file, { force: true });
  }
}

describe("README", () => {
  it("quick start", () => {
    const out = runModule(block("quickstart"));
    expect(out).toContain("Prefers email over phone calls.");
    expect(out).toContain("My order 4417 arrived damaged.");
    expect(out.trimEnd().split("\n").at(-1)).toContain("what happened to my order?"); // the question, last
  });

  it("LangGraph.js", () => {
    // A thread id of its own, so a rerun against the same Redis never meets the previous run's thread.
    const code = block("langgraph").replace('"thread-1"', `"thread-${Date.now()}"`);
    expect(runModule(code)).toContain("[ 'start', 'greeted' ]");
  });
});
