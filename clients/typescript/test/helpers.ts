import { randomUUID } from "node:crypto";
import { createServer, connect, type Server } from "node:net";
import { inject } from "vitest";

export const target = (): string => inject("target");

export const unique = (prefix: string): string => `${prefix}-${randomUUID().slice(0, 8)}`;

/** A real TCP relay to the sidecar that starts listening on `port` only after `delayMs`: calls made
 * before then meet a closed port (UNAVAILABLE), as during a sidecar restart. */
export function lateRelay(port: number, delayMs: number): { ready: Promise<void>; close: () => Promise<void> } {
  const [host, upstream] = target().split(":");
  let server: Server | undefined;
  const ready = new Promise<void>((ok) => {
    setTimeout(() => {
      server = createServer((down) => {
        const up = connect(Number(upstream), host);
        down.pipe(up).pipe(down);
        const end = () => {
          up.destroy();
          down.destroy();
        };
        up.on("error", end);
        down.on("error", end);
      });
      server.listen(port, "127.0.0.1", () => ok());
    }, delayMs);
  });
  return {
    ready,
    close: () => new Promise<void>((ok) => (server ? server.close(() => ok()) : ok())),
  };
}

export function freePort(): Promise<number> {
  return new Promise((ok, fail) => {
    const srv = createServer();
    srv.once("error", fail);
    srv.listen(0, "127.0.0.1", () => {
      const addr = srv.address();
      srv.close(() => (addr && typeof addr === "object" ? ok(addr.port) : fail(new Error("no port"))));
    });
  });
}
