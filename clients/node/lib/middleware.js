'use strict';

const { RateLimiterError } = require('./errors');
const { Limit } = require('./limiter');
const { sfString } = require('./headers');

const QUOTA_EXCEEDED = 'https://iana.org/assignments/http-problem-types#quota-exceeded';

function positive(value, what) {
  if (typeof value !== 'number' || !Number.isFinite(value) || !(value > 0)) {
    throw new RateLimiterError('argument', `${what} must be a positive finite number, got ${String(value)}`);
  }
}

function defaultKey(req) {
  return req.ip ?? (req.socket && req.socket.remoteAddress) ?? 'unknown';
}

// The shared part of the Express middleware and the Fastify plugin. Options:
//   limiter    a RateLimiter (required)
//   capacity, rate, name           one limit (name: the policy name, default "default"), or
//   limits: [{ capacity, rate, name }, ...]   several, all or nothing (takeAll); names
//                                  default to "limit<index>" and must differ
//   key(req)   who is limited: default the client IP (req.ip); e.g. req => req.user.id
//   cost(req)  tokens this request takes (weighted n), default 1
//   keyPrefix  bucket keys are `${keyPrefix}{${key(req)}}:${name}`; default "rl:"
//              (the hash tag keeps one caller's buckets in one cluster slot)
//   failOpen   true (default): when the limiter fails the request passes without headers;
//              false: 503
function limiterCore(options) {
  const { limiter } = options;
  if (!limiter || typeof limiter.take !== 'function') {
    throw new RateLimiterError('argument', 'the middleware needs options.limiter, a RateLimiter');
  }
  let limits;
  if (options.limits !== undefined) {
    if (!Array.isArray(options.limits) || options.limits.length === 0) {
      throw new RateLimiterError('argument', 'options.limits must be a non-empty array');
    }
    limits = options.limits.map((limit, i) => ({
      name: limit.name ?? `limit${i}`, capacity: limit.capacity, rate: limit.rate,
    }));
  } else {
    limits = [{ name: options.name ?? 'default', capacity: options.capacity, rate: options.rate }];
  }
  const names = new Set();
  limits.forEach((limit, i) => {
    positive(limit.capacity, `limits[${i}].capacity`);
    positive(limit.rate, `limits[${i}].rate`);
    if (names.has(limit.name)) {
      throw new RateLimiterError('argument', `two limits are named ${limit.name}`);
    }
    names.add(limit.name);
  });
  const key = options.key ?? defaultKey;
  const cost = options.cost ?? (() => 1);
  const keyPrefix = options.keyPrefix ?? 'rl:';
  const failOpen = options.failOpen ?? true;
  const several = options.limits !== undefined;

  // -> { status: 0 | 429 | 503, headers, body }
  return async function decide(req) {
    // The key and cost functions are the application's: their errors are its own, and
    // propagate (Express: next(err); Fastify: the error handler).
    const who = String(await key(req));
    const n = await cost(req);
    let decision;
    try {
      if (several) {
        decision = await limiter.takeAll(limits.map((l) => new Limit(`${keyPrefix}{${who}}:${l.name}`, l.capacity, l.rate, n, l.name)));
      } else {
        const [l] = limits;
        decision = await limiter.take(`${keyPrefix}{${who}}:${l.name}`, l.capacity, l.rate, n, { name: l.name });
      }
    } catch (err) {
      limiter._failed(err);
      if (failOpen) {
        return { status: 0, headers: {}, body: null };
      }
      return {
        status: 503,
        headers: {},
        body: {
          type: 'about:blank',
          title: 'Service Unavailable',
          status: 503,
          detail: 'the rate limiter is unavailable',
        },
      };
    }
    limiter._succeeded();
    const headers = decision.headers();
    if (decision.allowed) {
      return { status: 0, headers, body: null };
    }
    const detail = decision.retryAfterMs < 0
      ? `the request costs more than the capacity of ${sfString(decision.policy)} (${decision.capacity}); waiting will not help`
      : `quota ${sfString(decision.policy)} exceeded; retry after ${headers['Retry-After']} s`;
    return {
      status: 429,
      headers,
      body: {
        type: QUOTA_EXCEEDED,
        title: 'Too Many Requests',
        status: 429,
        detail,
        'violated-policies': [decision.policy],
      },
    };
  };
}

// Express (or any connect-style framework, or plain node:http): app.use(expressRateLimit({...})).
function expressRateLimit(options) {
  const decide = limiterCore(options);
  return async function redisTbRateLimit(req, res, next) {
    let outcome;
    try {
      outcome = await decide(req);
    } catch (err) {
      return next(err);
    }
    for (const [name, value] of Object.entries(outcome.headers)) {
      res.setHeader(name, value);
    }
    if (outcome.status === 0) {
      return next();
    }
    res.statusCode = outcome.status;
    res.setHeader('Content-Type', 'application/problem+json');
    res.end(JSON.stringify(outcome.body));
    return undefined;
  };
}

// Fastify: fastify.register(fastifyRateLimit, {...}). Applies to the context it is registered
// in (like fastify-plugin: no encapsulation of its own), as an onRequest hook.
async function fastifyRateLimit(fastify, options) {
  const decide = limiterCore(options);
  fastify.addHook('onRequest', async (request, reply) => {
    const outcome = await decide(request);
    reply.headers(outcome.headers);
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

module.exports = { expressRateLimit, fastifyRateLimit, limiterCore, QUOTA_EXCEEDED };
