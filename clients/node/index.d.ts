// Types of redis-tb (CommonJS: `const { RateLimiter } = require('redis-tb')`, or
// `import { RateLimiter } from 'redis-tb'` with esModuleInterop / Node ESM).
import type { Cluster, ClusterNode, ClusterOptions, Redis, RedisOptions } from 'ioredis';

// Only what is marked `export` is the package's: without this line a declaration file exports
// all it declares, LimiterErrorOfKind too (a class that lib/ does not export).
export {};

export type Backend = 'module' | 'function' | 'script';
export type Key = string | Buffer;
export type LogLevel = 'debug' | 'info' | 'warn' | 'error';
export type Logger =
  | false
  | ((level: LogLevel, message: string) => void)
  | { debug?(message: string): void; info?(message: string): void; warn?(message: string): void; error?(message: string): void; log?(message: string): void };

export interface RateLimiterOptions {
  /** 'auto' (default): the module if COMMAND INFO tb.take knows it, else FUNCTION LOAD of tb.lua, else EVALSHA. */
  backend?: 'auto' | Backend;
  /** Timeout of every command the limiter sends, in ms (0: none). Default 200. */
  timeoutMs?: number;
  /** How long waitTake waits for a connection of its own, and a call for the client's first connection in progress (at least timeoutMs), in ms. Default 1000. */
  connectTimeoutMs?: number;
  /** Added to a waitTake's timeoutMs for the client-side timer of TB.BTAKE, in ms. Default 1000. */
  blockingMarginMs?: number;
  /** Idle connections kept for waitTake (module backend). Default 4. */
  blockingPoolSize?: number;
  /** An idle waitTake connection is closed after this many ms. Default 5000. */
  blockingIdleMs?: number;
  /** On Lua after the module went away: how often (at most) to look for it again, in ms. Default 30000. */
  moduleRecheckMs?: number;
  /** 'raise' (default): an unreachable Redis throws LimiterUnavailable; 'local': take, takeLimit, takeAll and peek are answered by the local limiter (docs/clients.md). */
  onUnavailable?: 'raise' | 'local';
  /** How many processes share the limits: the local limiter runs at capacity / instances, rate / instances. Default 1. */
  instances?: number;
  /** Keys the local limiter and the denial cache hold (least recently used out first). Default 10000. */
  localMaxKeys?: number;
  /** During an outage, nothing is sent for this many ms, then one call tries Redis again. Default 1000. */
  localProbeMs?: number;
  /** Answer a denied key in process until the time its denial named (no round trip). Default false. */
  cacheDenials?: boolean;
  /** Where backend changes, outages and errors go. Default: stderr (debug with NODE_DEBUG=redis-tb); false: nowhere. */
  logger?: Logger;
  /** Where the metrics go (docs/clients.md#metrics): an OpenTelemetry MeterProvider. Default: @opentelemetry/api's global one, when the API is installed; without it nothing is recorded. */
  meterProvider?: MeterProviderLike;
}

/** An OpenTelemetry MeterProvider (@opentelemetry/api's or an SDK's), typed by the one method called, so that these types need no @opentelemetry/api (an optional peer dependency). */
export interface MeterProviderLike {
  getMeter(name: string, version?: string, options?: object): unknown;
}

export interface TopOptions {
  /** How many rows, the most denied first: 1 to 2^53. Default 10. */
  count?: number;
}

/** One row of top() (docs/clients.md#the-most-denied-keys). */
export declare class TopKey {
  constructor(keyBytes: Buffer, count: number, error: number, shadow: number, truncated: boolean);
  /** The key's name as text: bytes that are not UTF-8 are replaced by U+FFFD. */
  readonly key: string;
  /** The key's name exactly (its first 256 bytes when truncated). */
  readonly keyBytes: Buffer;
  /** Denials counted: never below the true number over the window, at most `error` above it. */
  readonly count: number;
  /** The bound on the overcount. */
  readonly error: number;
  /** How many of them were shadow-mode denials. */
  readonly shadow: number;
  /** The name was longer than 256 bytes and cut to its first 256. */
  readonly truncated: boolean;
}

export interface CallOptions {
  /** Policy name for the headers. Default "default". */
  name?: string;
}

export interface WaitOptions extends CallOptions {
  /** How long to wait at most, in ms; 0 = no limit (as TB.BTAKE). Required. */
  timeoutMs: number;
}

export interface Lockout {
  /** A denied take locks the key for this many ms (BLOCK; whole, 1 to 2^53). */
  blockMs?: number | null;
  /** A lock within the last one's probation doubles, up to this (MAXBLOCK; needs blockMs, at least it). */
  maxBlockMs?: number | null;
}

export interface LimitSpec extends Lockout {
  key: Key;
  capacity: number;
  rate: number;
  /** Tokens to take. Default 1. */
  n?: number;
  /** Policy name. Default "limit<index>". */
  name?: string | null;
}

export declare class Limit implements LimitSpec {
  /** Checked here (InvalidArgument): the key, capacity, rate, n, name and lockout (docs/clients.md). The lockout is sent as BLOCK / MAXBLOCK on this limit's takes. */
  constructor(key: Key, capacity: number, rate: number, n?: number, name?: string | null, lockout?: Lockout);
  key: Key;
  capacity: number;
  rate: number;
  n: number;
  name: string | null;
  blockMs: number | null;
  maxBlockMs: number | null;
}

export interface ReserveOptions {
  /** A reservation (MAXWAIT): allowed into debt when the tokens arrive within this many ms; act after decision.waitMs. */
  maxWaitMs?: number;
}

export interface TakeOptions extends CallOptions, ReserveOptions, Lockout {}

export interface ChargeOptions {
  /** How deep the debt may go: down to -maxDebt tokens (MAXDEBT; default the capacity). */
  maxDebt?: number;
}

export interface JudgedLimit {
  name: string;
  capacity: number;
  rate: number;
}

export interface RateLimitHeaders {
  'RateLimit-Policy': string;
  RateLimit: string;
  'Retry-After'?: string;
}

/** Where a Decision came from: Redis, the local limiter (Redis unreachable), the denial cache. */
export type Source = 'server' | 'local' | 'cache';

export declare class Decision {
  constructor(reply: number[], limits: JudgedLimit[], index: number | null, source?: Source);
  readonly source: Source;
  readonly allowed: boolean;
  /** Whole tokens left (when denied: available now). */
  readonly remaining: number;
  /** Denied: the wait until the same call would pass (a lock's end included); -1: never (n > capacity). Allowed: 0, or the wait before acting (waitMs). */
  readonly retryAfterMs: number;
  /** Allowed: the ms to wait before acting (a reservation, a charge into debt), 0 for a plain grant; 0 when denied. */
  readonly waitMs: number;
  /** Until the bucket is full again. */
  readonly resetAfterMs: number;
  /** takeAll: the 0-based position of the deciding limit; null for the other calls. */
  readonly index: number | null;
  /** The deciding limit's capacity, rate and policy name. */
  readonly capacity: number;
  readonly rate: number;
  readonly policy: string;
  /** Every limit of the call, in the call's order. */
  readonly limits: readonly JudgedLimit[];
  headers(): RateLimitHeaders;
}

export type ErrorKind = 'argument' | 'server' | 'unavailable' | 'bug' | 'lost';

/** Base class of everything the library throws. */
export declare class LimiterError extends Error {
  constructor(kind: ErrorKind, message: string, options?: { cause?: unknown });
  readonly kind: ErrorKind;
}
/** What the four kinds below share (lib/errors.js makes them with one function): a LimiterError of one kind, made like an Error. */
declare class LimiterErrorOfKind<K extends ErrorKind> extends LimiterError {
  constructor(message: string, options?: { cause?: unknown });
  readonly kind: K;
}
/** kind 'argument': refused before sending (NaN, Infinity, no key, bad policy name, ...). */
export declare class InvalidArgument extends LimiterErrorOfKind<'argument'> {}
/** kind 'server': the server's error reply, its text unchanged. */
export declare class LimiterReplyError extends LimiterErrorOfKind<'server'> {}
/** kind 'unavailable': no answer in time, connection refused or lost, LOADING, CLUSTERDOWN, ... */
export declare class LimiterUnavailable extends LimiterErrorOfKind<'unavailable'> {}
/** kind 'lost': a LeaseGuard's renewal found its lease no longer held (guard.check(), guard.signal.reason). */
export declare class LeaseLost extends LimiterErrorOfKind<'lost'> {}

/** limiter.lease() / withLease() got no lease (limit reached, or the wait timed out). Not a LimiterError. */
export declare class LeaseDenied extends Error {
  constructor(decision: Lease);
  readonly decision: Lease;
  readonly retryAfterMs: number;
}

export interface ConcurrencyHeaders {
  'RateLimit-Policy'?: string;
  'Retry-After'?: string;
}

/** The answer of acquire / waitAcquire (docs/leases.md). */
export declare class Lease {
  /** A lease was granted; or failedOpen: the limiter was unavailable and the call let through without one. */
  readonly acquired: boolean;
  /** Free slots left after this call (limit - live - waiting). */
  readonly available: number;
  /** 0 when acquired; else until the earliest live lease ends by itself (a release may free a slot sooner). */
  readonly retryAfterMs: number;
  /** The lease id for release/renew; null when not acquired and when failed open. */
  readonly lease: string | null;
  /** A failOpen call met an unavailable limiter: proceed, nothing limits you, nothing to release. */
  readonly failedOpen: boolean;
  readonly key: Key;
  readonly limit: number;
  readonly leaseMs: number;
  readonly policy: string;
  /** RateLimit-Policy: "<name>";q=<limit>;qu="concurrent-requests", and Retry-After on a denial; {} when failed open. */
  headers(): ConcurrencyHeaders;
}

export interface AcquireOptions extends CallOptions {
  /** true: an unavailable limiter answers a Lease with acquired true, lease null, failedOpen true. Default false (throws LimiterUnavailable). */
  failOpen?: boolean;
}

export interface WaitAcquireOptions extends AcquireOptions {
  /** How long to wait at most, in ms; 0 = no limit. Required. */
  timeoutMs: number;
  /** Lua fallback only: poll at least this often, in ms. Default 100. */
  pollMs?: number;
}

export interface LeaseOptions extends AcquireOptions {
  /** Wait up to this long for a slot (waitAcquire); absent: answer at once. */
  timeoutMs?: number;
  pollMs?: number;
  /** Renew every this many ms while held; default leaseMs / 3; 0: never. */
  renewEveryMs?: number;
}

/** One lease held, renewed in the background until released (`await using`, withLease, or release()). */
export declare class LeaseGuard implements AsyncDisposable {
  readonly limiter: RateLimiter;
  readonly key: Key;
  readonly decision: Lease;
  readonly leaseMs: number;
  readonly renewEveryMs: number;
  readonly renewals: number;
  /** The error that made the guard lost, if it was one (a bug such as WRONGTYPE). */
  readonly error: unknown;
  /** The lease id; null when failed open. */
  readonly lease: string | null;
  readonly failedOpen: boolean;
  /** A renewal found the lease no longer held. */
  readonly lost: boolean;
  /** Aborted (reason: a LeaseLost) when the lease is lost: pass it to fetch() and friends. */
  readonly signal: AbortSignal;
  /** Throws the LeaseLost once lost. */
  check(): void;
  /** Stops renewing and releases (once): true if the lease was held until now. */
  release(): Promise<boolean>;
  [Symbol.asyncDispose](): Promise<void>;
}

export declare class RateLimiter {
  constructor(client: Redis | Cluster, options?: RateLimiterOptions);
  readonly client: Redis | Cluster;
  /** The backend in use; null until the first call or connect(). */
  readonly backend: Backend | null;
  readonly isCluster: boolean;
  /** Calls that failed: LimiterUnavailable, and every other error. */
  readonly stats: { unavailable: number; errors: number };
  connect(): Promise<Backend>;
  /** options.maxWaitMs: a reservation (MAXWAIT); options.blockMs / maxBlockMs: lockout (BLOCK / MAXBLOCK). */
  take(key: Key, capacity: number, rate: number, n?: number, options?: TakeOptions): Promise<Decision>;
  /** take of one limit: its key, capacity, rate, n, name and lockout. */
  takeLimit(limit: LimitSpec, options?: ReserveOptions): Promise<Decision>;
  /** TB.CHARGE: a cost learned after the work, always taken, into debt (decision.waitMs: until it is repaid). */
  charge(limit: LimitSpec, n: number, options?: ChargeOptions): Promise<Decision>;
  /** Refund (actual < reserved) or charge (actual > reserved) the difference in one call; null without a call when equal. */
  settle(limit: LimitSpec, reserved: number, actual: number): Promise<Decision | null>;
  /** TB.UNBLOCK: ends the key's lock and forgets its strikes; true if there was one. */
  unblock(limitOrKey: LimitSpec | Key): Promise<boolean>;
  peek(key: Key, capacity: number, rate: number, n?: number, options?: CallOptions): Promise<Decision>;
  refund(key: Key, capacity: number, rate: number, n: number, options?: CallOptions): Promise<Decision>;
  /** The limits' lockouts (which must be the same) are sent as BLOCK / MAXBLOCK; options.maxWaitMs reserves on every bucket. */
  takeAll(limits: ReadonlyArray<LimitSpec>, options?: ReserveOptions): Promise<Decision>;
  /** Module: TB.BTAKE on the slot owner (FIFO in the server; timeoutMs 0 = no limit). Lua fallback: one reservation and one sleep, FIFO too. */
  waitTake(key: Key, capacity: number, rate: number, n: number | undefined, options: WaitOptions): Promise<Decision>;
  /** A lease on key if fewer than limit are live; it ends by itself after leaseMs unless released or renewed. */
  acquire(key: Key, limit: number, leaseMs: number, options?: AcquireOptions): Promise<Lease>;
  /** true if the lease was live and is now released; null (no lease) resolves false without a call. */
  release(key: Key, lease: Lease | string | null): Promise<boolean>;
  /** true if the live lease now ends leaseMs from now; false if it is not held. */
  renew(key: Key, lease: Lease | string | null, leaseMs: number): Promise<boolean>;
  /** Module: TB.ACQUIRE with timeout_ms on the slot owner (FIFO in the server; 0 = no limit). Lua fallback: polling, NOT FIFO. */
  waitAcquire(key: Key, limit: number, leaseMs: number, options: WaitAcquireOptions): Promise<Lease>;
  /** Acquires (waits with timeoutMs) and renews until released; rejects with LeaseDenied when denied. */
  lease(key: Key, limit: number, leaseMs: number, options?: LeaseOptions): Promise<LeaseGuard>;
  /** Runs fn holding a lease and releases it when fn settles, also when it throws. */
  withLease<T>(key: Key, limit: number, leaseMs: number, fn: (guard: LeaseGuard) => T | Promise<T>, options?: LeaseOptions): Promise<T>;
  /** The most-denied keys (TB.TOP COUNT count; in a cluster on every master, merged): the most denied first, ties by key bytes. Needs the module: otherwise LimiterReplyError; an unreachable master: LimiterUnavailable. */
  top(options?: TopOptions): Promise<TopKey[]>;
  /** Closes every connection the limiter opened (waitTake's, idle or waiting); the client passed in stays open. */
  close(): void;
}

export declare function rateLimitHeaders(decision: Decision): RateLimitHeaders;

/** `${prefix}{${escapeId(id)}}:${name}`: the key of a caller's bucket (docs/clients.md). */
export declare function bucketKey(prefix: string, id: string | number, name: string): string;
/** % -> %25, { -> %7B, } -> %7D, the empty id -> %: no brace, never empty. */
export declare function escapeId(id: string | number): string;
/** The one failure rule over any error a call met. */
export declare function classify(err: unknown): 'unavailable' | 'server_changed' | 'bug';

export interface PolicyOptions {
  name?: string;
  capacity: number;
  rate: number;
}

export interface MiddlewareBase<Req> {
  limiter: RateLimiter;
  /** Who is limited. Default: the client IP (req.ip; an IPv4-mapped IPv6 address as IPv4; "unknown" without one). */
  key?: (req: Req) => string | number | Promise<string | number>;
  /** Tokens a request takes. Default 1. */
  cost?: (req: Req) => number | Promise<number>;
  /** Bucket keys are bucketKey(prefix, key(req), policy name). Default "ratelimit:". */
  prefix?: string;
  /** The older name of prefix. */
  keyPrefix?: string;
  /** While the limiter is unavailable: 'open' (default) passes requests, 'closed' answers 503, 'local' lets the limiter's local limiter decide. */
  onUnavailable?: 'open' | 'closed' | 'local';
  /** The older spelling of onUnavailable: true is 'open', false is 'closed'. */
  failOpen?: boolean;
  /** In-flight limit: a lease per request from its start until its response finishes or its connection closes. */
  concurrency?: ConcurrencyOptions;
}

export interface ConcurrencyOptions {
  /** At most this many requests of one key at once. */
  limit: number;
  /** A request's lease lasts this long unless renewed (every leaseMs / 3 while it runs). Default 60000. */
  leaseMs?: number;
  /** Its policy name (header, key `${prefix}{id}:${name}`). Default "inflight". */
  name?: string;
  /** The denial's status: 429 (default) or 503. */
  status?: 429 | 503;
}

export type MiddlewareOptions<Req = any> = MiddlewareBase<Req> &
  ({ capacity: number; rate: number; name?: string; limits?: undefined }
    | { limits: PolicyOptions[]; capacity?: undefined; rate?: undefined; name?: undefined }
    | { concurrency: ConcurrencyOptions; limits?: undefined; capacity?: undefined; rate?: undefined; name?: undefined });

/** Express (connect-style) middleware. */
export declare function expressRateLimit<Req = any>(
  options: MiddlewareOptions<Req>,
): (req: Req, res: any, next: (err?: unknown) => void) => Promise<void>;

/** Fastify plugin: fastify.register(fastifyRateLimit, options). */
export declare function fastifyRateLimit(fastify: any, options: MiddlewareOptions<any>): Promise<void>;

/** An ioredis Redis that fails fast: no offline queue after the first connection attempt, no retries per request, 200 ms timeouts. Usable at once. */
export declare function createClient(url?: string, options?: RedisOptions): Redis;
/** The same for an ioredis Cluster. */
export declare function createClusterClient(nodes: ClusterNode[], options?: ClusterOptions): Cluster;

export interface LuaSource {
  file: string;
  library: string;
  script: string;
  sha: string;
}
export declare function luaSource(): LuaSource;
export declare const version: string;
