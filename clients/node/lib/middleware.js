'use strict';

const { InvalidArgument, LimiterUnavailable } = require('./errors');
const { Limit, bucketKey, checkPolicy } = require('./core');

const QUOTA_EXCEEDED = 'https://iana.org/assignments/http-problem-types#quota-exceeded';

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
//   keyPrefix  bucket keys are `${keyPrefix}{${escapeId(key(req))}}:${name}`; default
//              "ratelimit:" (the hash tag keeps one caller's buckets in one cluster slot;
//              escaping %, { and } keeps any id from changing it)
//   failOpen   true (default): while the limiter is unavailable the request passes without
//              headers; false: 503. Any other error (a bug: WRONGTYPE, a bad cost) is never
//              let through: it is logged and goes to the framework's error handling (500)
function limiterCore(options) {
  const { limiter } = options;
  if (!limiter || typeof limiter.take !== 'function') {
    throw new InvalidArgument('the middleware needs options.limiter, a RateLimiter');
  }
  const several = options.limits !== undefined;
  let limits;
  if (options.limits !== undefined) {
    if (!Array.isArray(options.limits) || options.limits.length === 0) {
      throw new InvalidArgument('options.limits must be a non-empty array');
    }
    limits = options.limits.map((limit, i) => ({
      name: limit.name ?? `limit${i}`, capacity: limit.capacity, rate: limit.rate,
    }));
  } else {
    limits = [{ name: options.name ?? 'default', capacity: options.capacity, rate: options.rate }];
  }
  const names = new Set();
  limits.forEach((limit, i) => {
    checkPolicy(limit, several ? `limits[${i}]` : 'options');
    if (names.has(limit.name)) {
      throw new InvalidArgument(`two limits are named ${limit.name}`);
    }
    names.add(limit.name);
  });
  const key = options.key ?? defaultKey;
  const cost = options.cost ?? (() => 1);
  const keyPrefix = options.keyPrefix ?? 'ratelimit:';
  const failOpen = options.failOpen ?? true;

  // -> { status: 0 | 429 | 503, headers, body }; throws (for a 500) on anything but an
  // outage: a bug never lets requests through (docs/clients.md, the failure rule).
  return async function decide(req) {
    // The key and cost functions are the application's: their errors are its own, and
    // propagate (Express: next(err); Fastify: the error handler).
    const id = await key(req);
    const who = id === undefined || id === null ? '' : String(id);
    const n = await cost(req);
    const keyOf = (name) => bucketKey(keyPrefix, who, name);
    let decision;
    try {
      if (several) {
        decision = await limiter.takeAll(limits.map((l) => new Limit(keyOf(l.name), l.capacity, l.rate, n, l.name)));
      } else {
        const [l] = limits;
        decision = await limiter.take(keyOf(l.name), l.capacity, l.rate, n, { name: l.name });
      }
    } catch (err) {
      if (!(err instanceof LimiterUnavailable)) {
        limiter.log('error', `redis-tb: rate limiter error, answering 500: ${err.name}: ${err.message}`);
        throw err;
      }
      limiter._outageFailed(err, failOpen);
      if (failOpen) {
        return { status: 0, headers: {}, body: null };
      }
      return {
        status: 503,
        headers: {},
        body: {
          title: 'Service Unavailable',
          status: 503,
          detail: 'The rate limiter is unavailable.',
        },
      };
    }
    limiter._outageOver();
    const headers = decision.headers();
    if (decision.allowed) {
      return { status: 0, headers, body: null };
    }
    const detail = decision.retryAfterMs < 0
      ? `This request costs more than policy "${decision.policy}" can ever allow.`
      : `Rate limit of policy "${decision.policy}" exceeded; retry in ${headers['Retry-After']} s.`;
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
