'use strict';
// The Express and Fastify apps of bench/middleware_bench.py:
//   node node_app.js express|fastify
// The same four routes as the Python apps, each in a router (Express) or context (Fastify)
// of its own, so that they differ only by the GET or the middleware:
//   GET /bare/x    "ok", no middleware
//   GET /get/x     one plain GET of bench:get on the same Redis (same ioredis client), then "ok"
//   GET /module/x  "ok" behind the redis-tb middleware (Express) or plugin (Fastify), module backend
//   GET /lua/x     the same on the Lua backend (FUNCTION library)
// The policy never denies (capacity and rate 1e9). Env: REDIS_URL, PORT.
const { RateLimiter, createClient, expressRateLimit, fastifyRateLimit } = require('redis-tb');

const framework = process.argv[2];
const port = Number(process.env.PORT);
const redis = createClient(process.env.REDIS_URL);
const limiters = {
  module: new RateLimiter(redis, { backend: 'module' }),
  lua: new RateLimiter(redis, { backend: 'function' }),
};
const policy = { capacity: 1e9, rate: 1e9 };

async function main() {
  await Promise.all(Object.values(limiters).map((l) => l.connect()));
  await redis.get('bench:get');
  if (framework === 'express') {
    const express = require('express');
    const app = express();
    const ok = (req, res) => res.send('ok');
    const sub = (...handlers) => express.Router().get('/x', ...handlers);
    app.use('/bare', sub(ok));
    app.use('/get', sub(async (req, res) => {
      await redis.get('bench:get');
      res.send('ok');
    }));
    for (const [name, limiter] of Object.entries(limiters)) {
      app.use(`/${name}`, sub(expressRateLimit({ limiter, ...policy }), ok));
    }
    app.listen(port, '127.0.0.1', () => console.log(`listening on ${port}`));
  } else if (framework === 'fastify') {
    const app = require('fastify')();
    app.register(async (scope) => {
      scope.get('/x', async () => 'ok');
    }, { prefix: '/bare' });
    app.register(async (scope) => {
      scope.get('/x', async () => {
        await redis.get('bench:get');
        return 'ok';
      });
    }, { prefix: '/get' });
    for (const [name, limiter] of Object.entries(limiters)) {
      // A context of its own: the plugin's hook applies only to the routes in it.
      app.register(async (scope) => {
        scope.register(fastifyRateLimit, { limiter, ...policy });
        scope.get('/x', async () => 'ok');
      }, { prefix: `/${name}` });
    }
    await app.listen({ port, host: '127.0.0.1' });
    console.log(`listening on ${port}`);
  } else {
    throw new Error(`usage: node node_app.js express|fastify (not ${framework})`);
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
