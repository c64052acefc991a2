'use strict';

// The Fastify plugin: lib/middleware.js's limiterCore decides, this file answers in
// Fastify's terms (as Python's asgi.py and wsgi.py over _middleware.py).

const { limiterCore, releaseWhenDone } = require('./middleware');

// Fastify: fastify.register(fastifyRateLimit, {...}). Applies to the context it is registered
// in (like fastify-plugin: no encapsulation of its own), as an onRequest hook.
async function fastifyRateLimit(fastify, options) {
  const decide = limiterCore(options);
  fastify.addHook('onRequest', async (request, reply) => {
    const outcome = await decide(request);
    reply.headers(outcome.headers);
    releaseWhenDone(options.limiter, outcome.guard, reply.raw);
    if (outcome.status !== 0) {
      reply.code(outcome.status).header('content-type', 'application/problem+json').send(Buffer.from(JSON.stringify(outcome.body)));
      return reply;
    }
    return undefined;
  });
}
fastifyRateLimit[Symbol.for('skip-override')] = true;
fastifyRateLimit[Symbol.for('fastify.display-name')] = 'redis-tb';
fastifyRateLimit[Symbol.for('plugin-meta')] = { name: 'redis-tb', fastify: '>=4' };

module.exports = { fastifyRateLimit };
