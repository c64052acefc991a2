'use strict';
// Where the Node middleware's time goes, without HTTP: run by bench/middleware_bench.py
// against the same Redis.   node breakdown.js PORT N ROUNDS   -> one JSON object on stdout
// Per call, in µs (median over ROUNDS of the mean of N sequential calls): redis.get,
// limiter.take, the middleware's decision (limiterCore: key, take, headers; what the
// Express middleware and the Fastify hook both run), and Decision.headers() alone.
const { RateLimiter, createClient } = require('redis-tb');
const { limiterCore } = require('redis-tb/lib/middleware');

const [port, n, rounds] = process.argv.slice(2).map(Number);

async function timed(fn) {
  const means = [];
  for (let r = 0; r < rounds; r++) {
    const t0 = process.hrtime.bigint();
    for (let i = 0; i < n; i++) {
      await fn();
    }
    means.push(Number(process.hrtime.bigint() - t0) / 1000 / n);
  }
  means.sort((a, b) => a - b);
  return means[Math.floor(means.length / 2)];
}

async function main() {
  const redis = createClient(`redis://127.0.0.1:${port}`);
  const limiter = new RateLimiter(redis);
  const decide = limiterCore({ limiter, capacity: 1e9, rate: 1e9 });
  const req = { ip: '127.0.0.1' };
  await limiter.connect(); // waits for the connection (createClient: no offline queue)
  await redis.get('bench:get');
  const d = await limiter.take('ratelimit:{127.0.0.1}:default', 1e9, 1e9);
  if (limiter.backend !== 'module') {
    throw new Error(`backend ${limiter.backend}`);
  }
  const out = {
    get: await timed(() => redis.get('bench:get')),
    take: await timed(() => limiter.take('ratelimit:{127.0.0.1}:default', 1e9, 1e9)),
    middleware: await timed(() => decide(req)),
    cpu_headers: await timed(() => d.headers()),
  };
  console.log(JSON.stringify(out));
  redis.disconnect();
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
