// Compiled with `tsc --noEmit` (test/package.test.js): index.d.ts describes the API as used.
import Redis, { Cluster } from 'ioredis';
import {
  Decision, Limit, RateLimiter, LimiterError, LimiterUnavailable, createClient, createClusterClient,
  expressRateLimit, fastifyRateLimit, rateLimitHeaders, luaSource, version, bucketKey, escapeId, classify,
  Lease, LeaseGuard, LeaseDenied, LeaseLost, TopKey,
} from 'redis-tb';
import { MeterProvider } from '@opentelemetry/sdk-metrics';
import { metrics } from '@opentelemetry/api';

async function main(): Promise<void> {
  const redis: Redis = createClient('redis://127.0.0.1:6379', { keyPrefix: 'app:' });
  const cluster: Cluster = createClusterClient([{ host: '127.0.0.1', port: 7000 }]);
  const limiter = new RateLimiter(redis, { backend: 'auto', timeoutMs: 200, logger: console });
  const onCluster = new RateLimiter(cluster, { logger: (level, message) => console.log(level, message) });
  const backend: 'module' | 'function' | 'script' = await limiter.connect();
  const d: Decision = await limiter.take('user:42', 10, 0.5);
  const source: 'server' | 'local' | 'cache' = d.source;
  void source;
  const allowed: boolean = d.allowed;
  const retry: number = d.retryAfterMs;
  const index: number | null = d.index;
  const h = d.headers();
  const policy: string = h['RateLimit-Policy'];
  const retryAfter: string | undefined = h['Retry-After'];
  await limiter.peek('user:42', 10, 0.5, 2, { name: 'api' });
  await limiter.refund(Buffer.from('user:42'), 10, 0.5, 1);
  const all = await onCluster.takeAll([new Limit('{u}:sec', 10, 2, 1, 'sec'), { key: '{u}:day', capacity: 5000, rate: 0.05787 }]);
  const waited = await limiter.waitTake('user:42', 10, 0.5, 1, { timeoutMs: 1000 });
  const reserved = await limiter.take('user:42', 10, 0.5, 1, { maxWaitMs: 500, blockMs: 1000, maxBlockMs: 8000 });
  const waitMs: number = reserved.waitMs;
  const job = new Limit('{u}:jobs', 100, 10, 1, 'jobs', { blockMs: 1000 });
  await limiter.takeLimit(job, { maxWaitMs: 100 });
  await limiter.takeAll([job], { maxWaitMs: 100 });
  await limiter.charge(job, 30, { maxDebt: 50 });
  const settled: Decision | null = await limiter.settle({ key: 'k', capacity: 1, rate: 1 }, 5, 3);
  const unblocked: boolean = await limiter.unblock(job) || await limiter.unblock('k');
  void [waitMs, settled, unblocked];
  rateLimitHeaders(waited);
  const key: string = bucketKey('ratelimit:', '}x', 'sec');
  const failure: 'unavailable' | 'server_changed' | 'bug' = classify(new Error('x'));
  const failed: number = limiter.stats.unavailable + limiter.stats.errors;
  void [key, failure, failed, escapeId(''), new RateLimiter(redis, { logger: false, moduleRecheckMs: 1000, onUnavailable: 'local', instances: 2, localMaxKeys: 100, localProbeMs: 500, cacheDenials: true })];
  try {
    await limiter.take('k', NaN, 1);
  } catch (err) {
    if (err instanceof LimiterUnavailable) {
      const unavailable: 'unavailable' = err.kind;
      console.log(unavailable);
    } else if (err instanceof LimiterError) {
      const kind: 'argument' | 'server' | 'unavailable' | 'bug' | 'lost' = err.kind;
      console.log(kind);
    }
  }
  const mw = expressRateLimit<{ ip: string; headers: Record<string, string> }>({
    limiter, capacity: 20, rate: 5, key: (req) => req.headers['x-user'] ?? req.ip, cost: () => 2,
  });
  const several = expressRateLimit({ limiter, limits: [{ name: 'sec', capacity: 10, rate: 2 }, { capacity: 5000, rate: 0.05787 }], failOpen: false });
  void fastifyRateLimit;
  void [backend, allowed, retry, index, policy, retryAfter, all, mw, several, luaSource().sha, version];
  const metered = new RateLimiter(redis, { meterProvider: new MeterProvider() });
  void new RateLimiter(redis, { meterProvider: metrics.getMeterProvider() });
  const top: TopKey[] = await metered.top({ count: 5 });
  const row = (await onCluster.top())[0];
  const text: string = row.key;
  const bytes: Buffer = row.keyBytes;
  const counts: number = row.count + row.error + row.shadow;
  const cut: boolean = row.truncated;
  void [top, text, bytes, counts, cut];
  limiter.close();
}

// Concurrency limits: leases, the guard, the middleware option.
async function leases(limiter: RateLimiter): Promise<void> {
  const d: Lease = await limiter.acquire('jobs:{partner}', 4, 30_000, { failOpen: true });
  const id: string | null = d.lease;
  const flags: [boolean, boolean, number, number] = [d.acquired, d.failedOpen, d.available, d.retryAfterMs];
  const released: boolean = await limiter.release('jobs:{partner}', d);
  const renewed: boolean = await limiter.renew('jobs:{partner}', id, 30_000);
  const waited = await limiter.waitAcquire('jobs:{partner}', 4, 30_000, { timeoutMs: 5000, pollMs: 50 });
  const guard: LeaseGuard = await limiter.lease('jobs:{partner}', 4, 30_000, { timeoutMs: 0, renewEveryMs: 5000 });
  const signal: AbortSignal = guard.signal;
  guard.check();
  await guard[Symbol.asyncDispose]();
  const n: number = await limiter.withLease('jobs:{partner}', 4, 30_000, async (g) => (g.lost ? 0 : 1));
  try {
    await limiter.lease('jobs:{partner}', 1, 1000);
  } catch (err) {
    if (err instanceof LeaseDenied) {
      const wait: number = err.retryAfterMs;
      void wait;
    } else if (err instanceof LeaseLost) {
      const lost: 'lost' = err.kind;
      void lost;
    }
  }
  const inflight = expressRateLimit({ limiter, concurrency: { limit: 10, leaseMs: 60_000, status: 503 } });
  const both = expressRateLimit({ limiter, capacity: 10, rate: 1, prefix: 'app:', onUnavailable: 'local', concurrency: { limit: 10 } });
  void [flags, released, renewed, waited.headers()['Retry-After'], signal, n, inflight, both];
}

// Mistakes the types catch.
async function mistakes(limiter: RateLimiter): Promise<void> {
  // @ts-expect-error capacity must be a number
  await limiter.take('k', '10', 1);
  // @ts-expect-error waitTake needs timeoutMs
  await limiter.waitTake('k', 1, 1, 1, {});
  // @ts-expect-error waitAcquire needs timeoutMs
  await limiter.waitAcquire('k', 1, 1000, {});
  // @ts-expect-error a denial status is 429 or 503
  expressRateLimit({ limiter, concurrency: { limit: 1, status: 500 } });
  // @ts-expect-error no such backend
  new RateLimiter(createClient(), { backend: 'lua' });
  // @ts-expect-error one limit or several, not both
  expressRateLimit({ limiter, capacity: 1, rate: 1, limits: [{ capacity: 1, rate: 1 }] });
}

void main;
void leases;
void mistakes;
