/**
 * vitest global setup: a real memlane sidecar for the whole run, started from the repo's Python install
 * and stopped afterwards (its Redis keys deleted). Nothing is mocked: every test talks gRPC to it.
 *
 * Python: $MEMLANE_PYTHON, else the repo's .venv (what .ci/run installs), else python3 on PATH.
 * Redis: $MEMLANE_TEST_REDIS_URL ("embedded": the sidecar's own embedded Redis), else the Redis on
 * 127.0.0.1:6379 when it answers, else the embedded one. Each run owns a fresh key prefix.
 */
import { type ChildProcess, spawn, spawnSync } from "node:child_process";
import { closeSync, existsSync, mkdtempSync, openSync, readFileSync, rmSync } from "node:fs";
import { createConnection, createServer } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import type { TestProject } from "vitest/node";

import { Client } from "../src/index.js";

declare module "vitest" {
  export interface ProvidedContext {
    target: string;
    /** The sidecar's stdout and stderr, where its console span exporter writes (test/tracing.test.ts). */
    sidecarLog: string;
  }
}

const REPO = resolve(import.meta.dirname, "../../..");

export function python(): string {
  if (process.env.MEMLANE_PYTHON) return process.env.MEMLANE_PYTHON;
  const venv = join(REPO, ".venv", "bin", "python");
  return existsSync(venv) ? venv : "python3";
}

function freePort(): Promise<number> {
  return new Promise((ok, fail) => {
    const srv = createServer();
    srv.once("error", fail);
    srv.listen(0, "127.0.0.1", () => {
      const addr = srv.address();
      srv.close(() => (addr && typeof addr === "object" ? ok(addr.port) : fail(new Error("no port"))));
    });
  });
}

function redisAnswers(host: string, port: number): Promise<boolean> {
  return new Promise((ok) => {
    const sock = createConnection({ host, port });
    const done = (answer: boolean) => {
      sock.destroy();
      ok(answer);
    };
    sock.setTimeout(500, () => done(false));
    sock.once("error", () => done(false));
    sock.once("connect", () => sock.write("PING\r\n"));
    sock.once("data", (d) => done(d.toString().startsWith("+PONG")));
  });
}

async function redisUrl(): Promise<string> {
  const asked = process.env.MEMLANE_TEST_REDIS_URL;
  if (asked === "embedded") return "";
  if (asked) return asked;
  return (await redisAnswers("127.0.0.1", 6379)) ? "redis://127.0.0.1:6379/0" : "";
}

async function waitReady(target: string, proc: ChildProcess, log: string): Promise<void> {
  const client = new Client(target, { timeoutMs: 2000 });
  const deadline = Date.now() + 120_000;
  try {
    for (;;) {
      if (proc.exitCode !== null) throw new Error(`the sidecar exited (${proc.exitCode}):\n${readFileSync(log, "utf8")}`);
      try {
        await client.listSessions({ userId: "probe", pageSize: 1 });
        return;
      } catch (err) {
        if (Date.now() > deadline) throw new Error(`the sidecar did not answer: ${String(err)}\n${readFileSync(log, "utf8")}`);
        await new Promise((r) => setTimeout(r, 200));
      }
    }
  } finally {
    client.close();
  }
}

export default async function setup(project: TestProject): Promise<() => Promise<void>> {
  const dir = mkdtempSync(join(tmpdir(), "memlane-ts-"));
  const port = await freePort();
  const prefix = `ts${Math.random().toString(36).slice(2, 12)}`;
  const redis = await redisUrl();
  const log = join(dir, "sidecar.log");
  const out = openSync(log, "w");
  const args = [
    "-m", "memlane_server.cli", "serve",
    "--listen", `127.0.0.1:${port}`,
    "--admin-listen", "",
    "--data-dir", join(dir, "data"),
    "--key-prefix", prefix,
    "--shutdown-grace-seconds", "1",
    ...(redis ? ["--redis-url", redis] : []),
  ];
  // Tracing on, to the console (the log): the tracing tests find the sidecar's spans of their calls there.
  const env = { ...process.env, OTEL_TRACES_EXPORTER: "console", OTEL_BSP_SCHEDULE_DELAY: "100" };
  const proc = spawn(python(), args, { stdio: ["ignore", out, out], env });
  const target = `127.0.0.1:${port}`;
  await waitReady(target, proc, log);
  project.provide("target", target);
  project.provide("sidecarLog", log);

  return async () => {
    if (proc.exitCode === null && proc.signalCode === null) {
      await new Promise<void>((ok) => {
        // SIGTERM is a graceful stop (a few seconds); SIGKILL if it has not ended in 15 s.
        const kill = setTimeout(() => proc.kill("SIGKILL"), 15_000);
        proc.once("exit", () => {
          clearTimeout(kill);
          ok();
        });
        proc.kill("SIGTERM");
      });
    }
    closeSync(out);
    if (redis) {
      // The run's keys, through the same Python install (redis-py), so nothing is left behind.
      const code = [
        "import redis, sys",
        "r = redis.Redis.from_url(sys.argv[1])",
        "keys = list(r.scan_iter(match=sys.argv[2] + ':*', count=1000))",
        "[r.delete(*keys[i:i + 500]) for i in range(0, len(keys), 500)]",
      ].join("\n");
      spawnSync(python(), ["-c", code, redis, prefix], { stdio: "inherit" });
    }
    rmSync(dir, { recursive: true, force: true });
  };
}
