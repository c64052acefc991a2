'use strict';

// `make bench`'s Node micro-benchmark (issue 26): against a running server WITH the module on
// 127.0.0.1:<--port>, in one run:
//   get_round_trip_us  one plain GET through ioredis (the median of many)
//   local_take_us      a take answered by the local limiter (its client points at a closed
//                      port, so the limiter is in an outage and sends nothing)
//   cached_denial_us   a denied take answered from the denial cache (the bucket emptied first)
// Prints one line of JSON on stdout and nothing else.
//   node clients/node/bench/local_bench.js --port P

const net = require('node:net');
const path = require('node:path');
const { once } = require('node:events');

const PKG = path.join(__dirname, '..');
const { RateLimiter, createClient } = require(PKG);

function portArgument() {
  const at = process.argv.indexOf('--port');
  const port = at >= 0 ? Number(process.argv[at + 1]) : NaN;
  if (!Number.isInteger(port) || port <= 0) {
    process.stderr.write('usage: node local_bench.js --port P\n');
    process.exit(2);
  }
  return port;
}

// A port nothing listens on: bound, then closed.
function closedPort() {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.on('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

function median(values) {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)];
}

// The median over `rounds` of the mean µs per call of `batch` calls of `fn` (awaited one at a
// time); a batch keeps the timer's own cost out of calls that take about a microsecond.
async function measure(fn, { rounds = 31, batch = 1 } = {}) {
  for (let i = 0; i < 200; i++) {
    await fn(); // warm up (JIT)
  }
  const samples = [];
  for (let r = 0; r < rounds; r++) {
    const started = process.hrtime.bigint();
    for (let i = 0; i < batch; i++) {
      await fn();
    }
    samples.push(Number(process.hrtime.bigint() - started) / 1000 / batch);
  }
  return median(samples);
}

async function main() {
  const port = portArgument();
  const quiet = { logger: false };

  const redis = createClient(`redis://127.0.0.1:${port}`);
  await once(redis, 'ready');
  await redis.set('bench:get', 'x');
  const getRoundTrip = await measure(() => redis.get('bench:get'), { rounds: 2001 });

  // The local limiter: the first take meets the refused connection and starts the outage;
  // for localProbeMs nothing is sent, every take is local.
  const down = createClient(`redis://127.0.0.1:${await closedPort()}`);
  const local = new RateLimiter(down, { ...quiet, onUnavailable: 'local', localProbeMs: 3_600_000 });
  await local.take('bench:local', 1e9, 1e9);
  const localTake = await measure(() => local.take('bench:local', 1e9, 1e9), { batch: 1000 });

  // The denial cache: a bucket emptied, denied once by the server, then held in process.
  const cached = new RateLimiter(redis, { ...quiet, cacheDenials: true });
  const key = `bench:cache:${process.pid}`;
  while ((await cached.take(key, 2, 0.001)).allowed) {
    // empty it
  }
  const cachedDenial = await measure(() => cached.take(key, 2, 0.001), { batch: 1000 });

  process.stdout.write(`${JSON.stringify({
    library: 'node', get_round_trip_us: getRoundTrip, local_take_us: localTake, cached_denial_us: cachedDenial,
  })}\n`);
  await redis.del(key, 'bench:get');
  redis.disconnect();
  down.disconnect();
}

main().catch((err) => {
  process.stderr.write(`local_bench: ${err.stack}\n`);
  process.exit(1);
});
