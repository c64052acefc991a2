// Compiled with `tsc --noEmit` (test/types.test.js): index.d.ts describes the API as used.
import Redis, { Cluster } from 'ioredis';
import {
  Decision, Limit, RateLimiter, LimiterError, LimiterUnavailable, createClient, createClusterClient,
  expressRateLimit, fastifyRateLimit, rateLimitHeaders, luaSource, version, bucketKey, escapeId, classify,
} from 'redis-tb';

async function main(): Promise<void> {
  const redis: Redis = createClient('redis://127.0.0.1:6379', { keyPrefix: 'app:' });
  const cluster: Cluster = createClusterClient([{ host: '127.0.0.1', port: 7000 }]);
  const limiter = new RateLimiter(redis, { backend: 'auto', timeoutMs: 200, logger: console });
  const onCluster = new RateLimiter(cluster, { logger: (level, message) => console.log(level, message) });
  const backend: 'module' | 'function' | 'script' = await limiter.connect();
  const d: Decision = await limiter.take('user:42', 10, 0.5);
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
  rateLimitHeaders(waited);
  const key: string = bucketKey('ratelimit:', '}x', 'sec');
  const failure: 'unavailable' | 'server_changed' | 'bug' = classify(new Error('x'));
  const failed: number = limiter.stats.unavailable + limiter.stats.errors;
  void [key, failure, failed, escapeId(''), new RateLimiter(redis, { logger: false, moduleRecheckMs: 1000 })];
  try {
    await limiter.take('k', NaN, 1);
  } catch (err) {
    if (err instanceof LimiterUnavailable) {
      const unavailable: 'unavailable' = err.kind;
      console.log(unavailable);
    } else if (err instanceof LimiterError) {
      const kind: 'argument' | 'server' | 'unavailable' | 'bug' = err.kind;
      console.log(kind);
    }
  }
  const mw = expressRateLimit<{ ip: string; headers: Record<string, string> }>({
    limiter, capacity: 20, rate: 5, key: (req) => req.headers['x-user'] ?? req.ip, cost: () => 2,
  });
  const several = expressRateLimit({ limiter, limits: [{ name: 'sec', capacity: 10, rate: 2 }, { capacity: 5000, rate: 0.05787 }], failOpen: false });
  void fastifyRateLimit;
  void [backend, allowed, retry, index, policy, retryAfter, all, mw, several, luaSource().sha, version];
  limiter.close();
}

// Mistakes the types catch.
async function mistakes(limiter: RateLimiter): Promise<void> {
  // @ts-expect-error capacity must be a number
  await limiter.take('k', '10', 1);
  // @ts-expect-error waitTake needs timeoutMs
  await limiter.waitTake('k', 1, 1, 1, {});
  // @ts-expect-error no such backend
  new RateLimiter(createClient(), { backend: 'lua' });
  // @ts-expect-error one limit or several, not both
  expressRateLimit({ limiter, capacity: 1, rate: 1, limits: [{ capacity: 1, rate: 1 }] });
}

void main;
void mistakes;
