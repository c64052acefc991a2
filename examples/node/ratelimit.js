// Express rate limiting with redis-tb's TB.TAKE, over ioredis.
//
//   const redis = createRedis(process.env.REDIS_URL);
//   app.use(rateLimit({ redis, capacity: 20, rate: 5 }));   // burst 20, then 5/s per client IP
//
// TB.TAKE key capacity rate n replies [allowed, remaining, retry_after_ms, reset_after_ms].
// Every answered request carries RateLimit-Policy and RateLimit (shape of
// draft-ietf-httpapi-ratelimit-headers-07); a denied one is a 429 with Retry-After.
//
// The middleware FAILS OPEN: when Redis is unreachable, slow, or answers an
// error, the request goes through (next()) and a warning is logged. A rate
// limiter protects the API; it must not become the reason the API is down.
import Redis from 'ioredis';

// An ioredis client tuned for a rate limiter: while Redis is down a command
// fails at once (no offline queue, no per-request retries, short timeouts)
// instead of waiting; ioredis keeps reconnecting in the background.
export function createRedis(url = 'redis://127.0.0.1:6379', options = {}) {
  const redis = new Redis(url, {
    connectTimeout: 500,
    commandTimeout: 250,
    maxRetriesPerRequest: 0,
    enableOfflineQueue: false,
    retryStrategy: (times) => Math.min(times * 100, 2000),
    ...options,
  });
  // Without a listener ioredis prints every failed reconnect; the middleware
  // reports the outage itself (see `warn` below).
  redis.on('error', () => {});
  return redis;
}

// The reply of TB.TAKE as an object.
export async function take(redis, key, capacity, rate, n = 1) {
  const [allowed, remaining, retryAfterMs, resetAfterMs] = await redis.call(
    'TB.TAKE', key, capacity, rate, n,
  );
  return { allowed: allowed === 1, remaining, retryAfterMs, resetAfterMs };
}

const ceilSecs = (ms) => Math.ceil(ms / 1000);

// Response headers for a decision on a bucket of `capacity` refilled at `rate`/s:
//   RateLimit-Policy: <floor(capacity)>;w=<ceil(capacity / rate)>
//   RateLimit: limit=<floor(capacity)>, remaining=<remaining>, reset=<ceil(reset_after_ms / 1000)>
//   Retry-After: <ceil(retry_after_ms / 1000)>   only when denied and waiting can help:
//   retry_after_ms = -1 (cost > capacity) never succeeds, so no Retry-After is sent.
export function rateLimitHeaders(decision, capacity, rate) {
  const limit = Math.floor(capacity);
  const headers = {
    'RateLimit-Policy': `${limit};w=${Math.max(1, Math.ceil(capacity / rate))}`,
    RateLimit: `limit=${limit}, remaining=${decision.remaining}, reset=${ceilSecs(decision.resetAfterMs)}`,
  };
  if (!decision.allowed && decision.retryAfterMs > 0) {
    headers['Retry-After'] = String(Math.max(1, ceilSecs(decision.retryAfterMs)));
  }
  return headers;
}

export function rateLimit({
  redis,
  capacity,
  rate,
  cost = 1,
  // Behind a proxy, set Express's 'trust proxy' so req.ip is the client's.
  key = (req) => `ratelimit:${req.ip}`,
  logger = console,
  warnEveryMs = 10_000,
}) {
  let lastWarning = -Infinity;
  const warn = (err) => {
    // At most one line per warnEveryMs, however many requests fail open.
    const now = Date.now();
    if (now - lastWarning >= warnEveryMs) {
      lastWarning = now;
      logger.warn(`rate limiter unavailable, failing open: ${err.message}`);
    }
  };

  return async function rateLimitMiddleware(req, res, next) {
    let decision;
    try {
      decision = await take(redis, key(req), capacity, rate, cost);
    } catch (err) {
      warn(err);
      return next();
    }
    res.set(rateLimitHeaders(decision, capacity, rate));
    if (!decision.allowed) {
      return res.status(429).json({ error: 'rate limit exceeded' });
    }
    return next();
  };
}
