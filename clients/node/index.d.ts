// Types of redis-tb (CommonJS: `const { RateLimiter } = require('redis-tb')`, or
// `import { RateLimiter } from 'redis-tb'` with esModuleInterop / Node ESM).
import type { Cluster, ClusterNode, ClusterOptions, Redis, RedisOptions } from 'ioredis';

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
  /** How long waitTake waits for a connection of its own, in ms. Default 1000. */
  connectTimeoutMs?: number;
  /** Added to a waitTake's timeoutMs for the client-side timer of TB.BTAKE, in ms. Default 1000. */
  blockingMarginMs?: number;
  /** Idle connections kept for waitTake (module backend). Default 4. */
  blockingPoolSize?: number;
  /** An idle waitTake connection is closed after this many ms. Default 5000. */
  blockingIdleMs?: number;
  /** On Lua after the module went away: how often (at most) to look for it again, in ms. Default 30000. */
  moduleRecheckMs?: number;
  /** Where backend changes, outages and errors go. Default: stderr (debug with NODE_DEBUG=redis-tb); false: nowhere. */
  logger?: Logger;
}

export interface CallOptions {
  /** Policy name for the headers. Default "default". */
  name?: string;
}

export interface WaitOptions extends CallOptions {
  /** How long to wait at most, in ms; 0 = no limit (as TB.BTAKE). Required. */
  timeoutMs: number;
}

export interface LimitSpec {
  key: Key;
  capacity: number;
  rate: number;
  /** Tokens to take. Default 1. */
  n?: number;
  /** Policy name. Default "limit<index>". */
  name?: string | null;
}

export declare class Limit implements LimitSpec {
  constructor(key: Key, capacity: number, rate: number, n?: number, name?: string | null);
  key: Key;
  capacity: number;
  rate: number;
  n: number;
  name: string | null;
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

export declare class Decision {
  constructor(reply: number[], limits: JudgedLimit[], index: number | null);
  readonly allowed: boolean;
  /** Whole tokens left (when denied: available now). */
  readonly remaining: number;
  /** 0 when allowed; the wait until the same call would pass; -1: never (n > capacity). */
  readonly retryAfterMs: number;
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

export type ErrorKind = 'argument' | 'server' | 'unavailable' | 'bug';

/** Base class of everything the library throws. */
export declare class LimiterError extends Error {
  constructor(kind: ErrorKind, message: string, options?: { cause?: unknown });
  readonly kind: ErrorKind;
}
/** kind 'argument': refused before sending (NaN, Infinity, no key, bad policy name, ...). */
export declare class InvalidArgument extends LimiterError {
  constructor(message: string, options?: { cause?: unknown });
  readonly kind: 'argument';
}
/** kind 'server': the server's error reply, its text unchanged. */
export declare class LimiterReplyError extends LimiterError {
  constructor(message: string, options?: { cause?: unknown });
  readonly kind: 'server';
}
/** kind 'unavailable': no answer in time, connection refused or lost, LOADING, CLUSTERDOWN, ... */
export declare class LimiterUnavailable extends LimiterError {
  constructor(message: string, options?: { cause?: unknown });
  readonly kind: 'unavailable';
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
  take(key: Key, capacity: number, rate: number, n?: number, options?: CallOptions): Promise<Decision>;
  peek(key: Key, capacity: number, rate: number, n?: number, options?: CallOptions): Promise<Decision>;
  refund(key: Key, capacity: number, rate: number, n: number, options?: CallOptions): Promise<Decision>;
  takeAll(limits: ReadonlyArray<LimitSpec>): Promise<Decision>;
  /** Module: TB.BTAKE on the slot owner (FIFO in the server; timeoutMs 0 = no limit). Lua fallback: polling, NOT FIFO. */
  waitTake(key: Key, capacity: number, rate: number, n: number | undefined, options: WaitOptions): Promise<Decision>;
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

interface MiddlewareBase<Req> {
  limiter: RateLimiter;
  /** Who is limited. Default: the client IP (req.ip). */
  key?: (req: Req) => string | number | Promise<string | number>;
  /** Tokens a request takes. Default 1. */
  cost?: (req: Req) => number | Promise<number>;
  /** Bucket keys are bucketKey(keyPrefix, key(req), policy name). Default "ratelimit:". */
  keyPrefix?: string;
  /** true (default): pass requests through when the limiter fails; false: 503. */
  failOpen?: boolean;
}

export type MiddlewareOptions<Req = any> = MiddlewareBase<Req> &
  ({ capacity: number; rate: number; name?: string; limits?: undefined } | { limits: PolicyOptions[]; capacity?: undefined; rate?: undefined; name?: undefined });

/** Express (connect-style) middleware. */
export declare function expressRateLimit<Req = any>(
  options: MiddlewareOptions<Req>,
): (req: Req, res: any, next: (err?: unknown) => void) => Promise<void>;

/** Fastify plugin: fastify.register(fastifyRateLimit, options). */
export declare function fastifyRateLimit(fastify: any, options: MiddlewareOptions<any>): Promise<void>;

/** An ioredis Redis that fails fast: no offline queue, no retries per request, 200 ms timeouts. */
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
