/**
 * Typed errors, grouped as the Python client groups them: `ClientError` (the request is wrong: fix it,
 * do not retry), `RetryableError` (try again, after `retryAfter` when the server said) and
 * `ServerError` (a fault on the server's side). `ResourceExhaustedError` is overload or a size limit,
 * so `err.retryable` tells. A Connect/gRPC error never escapes the client.
 *
 * Each error carries the server's structured details when it sent them (google.rpc `ErrorInfo`,
 * `BadRequest`, `RetryInfo`): `field` (the request field at fault), `reason` (a stable word such as
 * `INVALID_ID` or `OVERLOADED`), `info` and `retryAfter` (seconds). Match on those, not on the text.
 */
import { Code, ConnectError } from "@connectrpc/connect";
import { BadRequestSchema, ErrorInfoSchema, RetryInfoSchema } from "./gen/google/rpc/error_details_pb.js";

/** gRPC status names, as the server and the Python client spell them. */
export type StatusName =
  | "CANCELLED"
  | "UNKNOWN"
  | "INVALID_ARGUMENT"
  | "DEADLINE_EXCEEDED"
  | "NOT_FOUND"
  | "ALREADY_EXISTS"
  | "PERMISSION_DENIED"
  | "RESOURCE_EXHAUSTED"
  | "FAILED_PRECONDITION"
  | "ABORTED"
  | "OUT_OF_RANGE"
  | "UNIMPLEMENTED"
  | "INTERNAL"
  | "UNAVAILABLE"
  | "DATA_LOSS"
  | "UNAUTHENTICATED";

const NAMES: Record<number, StatusName> = {
  [Code.Canceled]: "CANCELLED",
  [Code.Unknown]: "UNKNOWN",
  [Code.InvalidArgument]: "INVALID_ARGUMENT",
  [Code.DeadlineExceeded]: "DEADLINE_EXCEEDED",
  [Code.NotFound]: "NOT_FOUND",
  [Code.AlreadyExists]: "ALREADY_EXISTS",
  [Code.PermissionDenied]: "PERMISSION_DENIED",
  [Code.ResourceExhausted]: "RESOURCE_EXHAUSTED",
  [Code.FailedPrecondition]: "FAILED_PRECONDITION",
  [Code.Aborted]: "ABORTED",
  [Code.OutOfRange]: "OUT_OF_RANGE",
  [Code.Unimplemented]: "UNIMPLEMENTED",
  [Code.Internal]: "INTERNAL",
  [Code.Unavailable]: "UNAVAILABLE",
  [Code.DataLoss]: "DATA_LOSS",
  [Code.Unauthenticated]: "UNAUTHENTICATED",
};

export interface FieldViolation {
  readonly field: string;
  readonly description: string;
}

export interface ErrorDetails {
  reason?: string;
  fieldViolations?: readonly FieldViolation[];
  info?: Readonly<Record<string, string>>;
  /** Seconds the server asked the caller to wait. */
  retryAfter?: number;
  cause?: unknown;
}

/** Root of every error the memlane client raises. */
export class MemlaneError extends Error {
  /** The gRPC status code (Connect's `Code`, the same numbers). */
  readonly code: Code;
  readonly reason: string;
  readonly fieldViolations: readonly FieldViolation[];
  readonly info: Readonly<Record<string, string>>;
  readonly retryAfter: number | undefined;

  constructor(message: string, code: Code = Code.Unknown, details: ErrorDetails = {}) {
    super(message, details.cause === undefined ? undefined : { cause: details.cause });
    this.name = new.target.name;
    this.code = code;
    this.reason = details.reason ?? "";
    this.fieldViolations = details.fieldViolations ?? [];
    this.info = details.info ?? {};
    this.retryAfter = details.retryAfter;
  }

  /** The status name (`"INVALID_ARGUMENT"`, ...). */
  get status(): StatusName {
    return NAMES[this.code] ?? "UNKNOWN";
  }

  /** The first request field at fault, or "" when the error names none. */
  get field(): string {
    return this.fieldViolations[0]?.field ?? "";
  }

  /** Whether the same request may succeed later: a transient condition, or the server said when. */
  get retryable(): boolean {
    return this instanceof RetryableError || this.retryAfter !== undefined;
  }
}

/** The request was wrong (malformed, unknown target, not allowed, wrong state): do not retry it as is. */
export class ClientError extends MemlaneError {}
/** A transient condition (unavailable, deadline, aborted): the same request may succeed later. */
export class RetryableError extends MemlaneError {}
/** A fault on the server's side (internal error, data loss, unimplemented). */
export class ServerError extends MemlaneError {}

export class CancelledError extends MemlaneError {}
export class UnknownError extends ServerError {}
export class InvalidArgumentError extends ClientError {}
export class DeadlineExceededError extends RetryableError {}
export class NotFoundError extends ClientError {}
export class AlreadyExistsError extends ClientError {}
export class PermissionDeniedError extends ClientError {}
/** Overload (`reason` OVERLOADED, `retryAfter` set, `retryable`) or a size/count limit that no retry
 * passes (e.g. MESSAGE_TOO_LARGE with `field`): gRPC uses one code for both, so no grouping base. */
export class ResourceExhaustedError extends MemlaneError {}
export class FailedPreconditionError extends ClientError {}
export class AbortedError extends RetryableError {}
export class OutOfRangeError extends ClientError {}
export class UnimplementedError extends ServerError {}
export class InternalError extends ServerError {}
export class UnavailableError extends RetryableError {}
export class DataLossError extends ServerError {}
export class UnauthenticatedError extends ClientError {}

type ErrorClass = new (message: string, code?: Code, details?: ErrorDetails) => MemlaneError;

const BY_CODE: Record<number, ErrorClass> = {
  [Code.Canceled]: CancelledError,
  [Code.Unknown]: UnknownError,
  [Code.InvalidArgument]: InvalidArgumentError,
  [Code.DeadlineExceeded]: DeadlineExceededError,
  [Code.NotFound]: NotFoundError,
  [Code.AlreadyExists]: AlreadyExistsError,
  [Code.PermissionDenied]: PermissionDeniedError,
  [Code.ResourceExhausted]: ResourceExhaustedError,
  [Code.FailedPrecondition]: FailedPreconditionError,
  [Code.Aborted]: AbortedError,
  [Code.OutOfRange]: OutOfRangeError,
  [Code.Unimplemented]: UnimplementedError,
  [Code.Internal]: InternalError,
  [Code.Unavailable]: UnavailableError,
  [Code.DataLoss]: DataLossError,
  [Code.Unauthenticated]: UnauthenticatedError,
};

export const RETRY_AFTER_KEY = "retry-after-ms";

/** Seconds the server asked us to wait (the `retry-after-ms` trailer), 0 when it gave no hint. */
export function retryHint(err: ConnectError): number {
  const raw = err.metadata.get(RETRY_AFTER_KEY);
  const ms = raw === null ? NaN : Number.parseInt(raw, 10);
  return Number.isFinite(ms) && ms > 0 ? ms / 1000 : 0;
}

/** The typed error for a failed call (anything thrown by a Connect client). */
export function fromConnectError(thrown: unknown): MemlaneError {
  if (thrown instanceof MemlaneError) return thrown;
  const err = ConnectError.from(thrown);
  const details: ErrorDetails = { cause: thrown };
  try {
    for (const info of err.findDetails(ErrorInfoSchema)) {
      details.reason = info.reason;
      details.info = { ...info.metadata };
    }
    for (const bad of err.findDetails(BadRequestSchema)) {
      details.fieldViolations = bad.fieldViolations.map((v) => ({ field: v.field, description: v.description }));
    }
    for (const retry of err.findDetails(RetryInfoSchema)) {
      const d = retry.retryDelay;
      if (d) details.retryAfter = Number(d.seconds) + d.nanos / 1e9;
    }
  } catch {
    // A server's garbage is no reason to fail differently: the code and message still stand.
  }
  const cls = BY_CODE[err.code] ?? UnknownError;
  return new cls(err.rawMessage || NAMES[err.code] || "UNKNOWN", err.code, details);
}
