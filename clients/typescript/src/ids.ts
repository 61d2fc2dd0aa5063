/**
 * Time-sortable ids (ULID layout, Crockford base32), as the Python client makes them. The client gives
 * them to messages and sessions that have none, so every write it sends can be retried without creating
 * a duplicate.
 */
import { randomBytes } from "node:crypto";

const ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";
let lastMs = 0n;
let counter = 0n;

function b32(value: bigint, length: number): string {
  let out = "";
  for (let i = 0; i < length; i++) {
    out = ALPHABET[Number(value & 31n)] + out;
    value >>= 5n;
  }
  return out;
}

/** A 26-character id that sorts after every id this process made before. */
export function newId(): string {
  const now = BigInt(Date.now());
  if (now <= lastMs) {
    counter += 1n; // same millisecond (or a clock step back): keep the order within the process
  } else {
    lastMs = now;
    counter = BigInt(`0x${randomBytes(10).toString("hex")}`) >> 1n; // leaves room to increment
  }
  return b32(lastMs, 10) + b32(counter & ((1n << 80n) - 1n), 16);
}
