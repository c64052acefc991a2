'use strict';
// Where the Node middleware's time goes, without HTTP: run by bench/middleware_bench.py
// against the same Redis.   node breakdown.js PORT N ROUNDS   -> one JSON object on stdout
// Per call, in µs (median over ROUNDS of the mean of N sequential calls): redis.get,
// limiter.take, the middleware's decision (limiterCore: key, take, headers; what the
// Express middleware and the Fastify hook both run), and Decision.headers() alone.
const { RateLimiter, createClient } = require('redis-tb');
const { limiterCore } = require('redis-tb/lib/middleware');

const [port, n, rounds] = process.argv.slice(2).map(Number);

// µs per call of each function; they take turns, n calls each, `rounds` times.
async function timed(fns) {
  const means = Object.fromEntries(Object.keys(fns).map((name) => [name, []]));
  for (let r = 0; r < rounds; r++) {
    for (const [name, fn] of Object.entries(fns)) {
      const t0 = process.hrtime.bigint();
      for (let i = 0; i < n; i++) {
        await fn();
      }
      means[name].push(Number(process.hrtime.bigint() - t0) / 1000 / n);
    }
  }
  const median = (xs) => xs.sort((a, b) => a - b)[Math.floor(xs.length / 2)];
  return Object.fromEntries(Object.entries(means).map(([name, xs]) => [name, median(xs)]));
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
  const out = await timed({
    get: () => redis.get('bench:get'),
    take: () => limiter.take('ratelimit:{127.0.0.1}:default', 1e9, 1e9),
    middleware: () => decide(req),
  });
  out.cpu_headers = (await timed({ headers: () => d.headers() })).headers;
  console.log(JSON.stringify(out));
  redis.disconnect();
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
