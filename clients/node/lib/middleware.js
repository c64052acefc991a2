'use strict';

// What the Express middleware (lib/express.js) and the Fastify plugin (lib/fastify.js)
// share, as Python's _middleware.py under asgi.py and wsgi.py: the options, the decision
// for one request (limiterCore), the in-flight lease's release, and the outage log.

const { InvalidArgument, LimiterUnavailable, LeaseDenied } = require('./errors');
const { Limit, bucketKey, checkPolicy, checkName, wholeText } = require('./core');
const { policyLine } = require('./headers');

const QUOTA_EXCEEDED = 'https://iana.org/assignments/http-problem-types#quota-exceeded';

// The id of the default key: the peer's address, an IPv4-mapped IPv6 address written as
// the IPv4 address, 'unknown' without one (docs/clients.md, "The same behaviour in all
// three": one client, one bucket, whichever language serves it).
const MAPPED_IPV4 = /^::ffff:(\d{1,3}(?:\.\d{1,3}){3})$/i;

function peerId(remote) {
  if (remote === undefined || remote === null || remote === '') {
    return 'unknown';
  }
  const mapped = MAPPED_IPV4.exec(remote);
  return mapped ? mapped[1] : remote;
}

function defaultKey(req) {
  return peerId(req.ip ?? (req.socket && req.socket.remoteAddress));
}

const ON_UNAVAILABLE = ['open', 'closed', 'local'];

// onUnavailable, or the older failOpen (true: 'open', false: 'closed'); default 'open'.
function unavailableMode(options) {
  const mode = options.onUnavailable ?? (options.failOpen === undefined ? 'open' : (options.failOpen ? 'open' : 'closed'));
  if (!ON_UNAVAILABLE.includes(mode)) {
    throw new InvalidArgument(`onUnavailable must be one of ${ON_UNAVAILABLE.join(', ')}, got ${String(mode)}`);
  }
  return mode;
}

const UNAVAILABLE_BODY = { title: 'Service Unavailable', status: 503, detail: 'The rate limiter is unavailable.' };
// A limiter bug: 500, no detail of the error (it is logged), never the framework's HTML page.
const BUG_BODY = { title: 'Internal Server Error', status: 500, detail: 'The rate limiter failed.' };

// ---------------------------------------------------------------------------------------
// Outages: one warning when calls start failing, one info line when they succeed again
// ---------------------------------------------------------------------------------------

class OutageLog {
  constructor() {
    this.since = null;
  }

  // -> the [level, message] to log, or null.
  failed(err, action, now) {
    if (this.since !== null) {
      return null;
    }
    this.since = now;
    return ['warn', `redis-tb: rate limiter unavailable, ${action}: ${err.message}`];
  }

  succeeded() {
    if (this.since === null) {
      return null;
    }
    this.since = null;
    return ['info', 'redis-tb: rate limiter available again'];
  }
}

// One OutageLog per limiter, shared by every middleware built on it (one line per outage,
// however many apps or routes use the limiter).
const outageLogs = new WeakMap();

function outageLogOf(limiter) {
  let log = outageLogs.get(limiter);
  if (log === undefined) {
    log = new OutageLog();
    outageLogs.set(limiter, log);
  }
  return log;
}

function outageFailed(limiter, err, failOpen) {
  const line = outageLogOf(limiter).failed(err, failOpen ? 'letting requests through' : 'answering 503', Date.now());
  if (line) {
    limiter.log(...line);
  }
}

function outageOver(limiter) {
  const line = outageLogOf(limiter).succeeded();
  if (line) {
    limiter.log(...line);
  }
}

// The shared part of the Express middleware and the Fastify plugin. Options:
//   limiter    a RateLimiter (required)
//   capacity, rate, name           one limit (name: the policy name, default "default"), or
//   limits: [{ capacity, rate, name }, ...]   several, all or nothing (takeAll); names
//                                  default to "limit<index>" and must differ
//   key(req)   who is limited: default the client IP (req.ip); e.g. req => req.user.id
//   cost(req)  tokens this request takes (weighted n), default 1
//   key(req)   default: the peer address (an IPv4-mapped IPv6 address as IPv4), 'unknown'
//   prefix     bucket keys are `${prefix}{${escapeId(key(req))}}:${name}`; default
//              "ratelimit:" (the hash tag keeps one caller's buckets in one cluster slot;
//              escaping %, { and } keeps any id from changing it); keyPrefix: the older name
//   onUnavailable  'open' (default): while the limiter is unavailable the request passes
//              without headers; 'closed': 503; 'local': the limiter's local limiter decides
//              (429 as usual; the in-flight limit counts it as 'open'). failOpen: the older
//              spelling (true: 'open', false: 'closed'). Any other error (a bug: WRONGTYPE, a
//              bad cost) is never let through: it is logged and answered 500
//              application/problem+json
//   concurrency: { limit, leaseMs = 60000, name = 'inflight', status = 429 }
//              at most `limit` requests of one key in flight: a lease (docs/leases.md) on
//              `${prefix}{${escapeId(key(req))}}:${name}`, acquired when the request
//              starts (before the rate limit: a request refused for concurrency spends no
//              token; a rate denial releases it), renewed every leaseMs/3
//              while it runs, released when the response finishes or the connection closes
//              (errors, aborts). Denied: `status` (429, or 503) with RateLimit-Policy:
//              "<name>";q=<limit>;qu="concurrent-requests" and Retry-After. With it, the
//              rate limit (capacity/rate or limits) is optional. failOpen applies: an
//              unavailable limiter lets the request through without a lease (or 503).
function checkConcurrency(spec, rateNames) {
  if (spec === undefined || spec === null) {
    return null;
  }
  const c = {
    limit: spec.limit, leaseMs: spec.leaseMs ?? 60_000, name: spec.name ?? 'inflight', status: spec.status ?? 429,
  };
  wholeText(c.limit, 'concurrency.limit');
  wholeText(c.leaseMs, 'concurrency.leaseMs');
  checkName(c.name);
  if (c.status !== 429 && c.status !== 503) {
    throw new InvalidArgument(`concurrency.status must be 429 or 503, got ${c.status}`);
  }
  if (rateNames.has(c.name)) {
    throw new InvalidArgument(`the concurrency limit and a rate limit are both named ${c.name}`);
  }
  return c;
}

function mergeHeaders(...sets) {
  const out = {};
  for (const headers of sets) {
    for (const [name, value] of Object.entries(headers)) {
      out[name] = name === 'RateLimit-Policy' && out[name] ? `${out[name]}, ${value}` : value;
    }
  }
  return out;
}

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
  } else if (options.capacity === undefined && options.rate === undefined && options.concurrency) {
    limits = [];
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
  const concurrency = checkConcurrency(options.concurrency, names);
  const key = options.key ?? defaultKey;
  const cost = options.cost ?? (() => 1);
  const prefix = options.prefix ?? options.keyPrefix ?? 'ratelimit:';
  const mode = unavailableMode(options);
  const local = mode === 'local';

  // The rate limits' decision (null without any), answered locally during an outage in
  // 'local' mode.
  function rateDecision(keyOf, n) {
    if (several) {
      return limiter._takeAll(limits.map((l) => new Limit(keyOf(l.name), l.capacity, l.rate, n, l.name)), {}, local);
    }
    if (limits.length === 1) {
      const [l] = limits;
      return limiter._take(keyOf(l.name), l.capacity, l.rate, n, { name: l.name }, local);
    }
    return null;
  }

  // The in-flight lease first: { guard } or { denied } (a LeaseDenied's Lease). An
  // unavailable limiter throws unless the mode lets the request through without one.
  async function inFlight(keyOf) {
    try {
      return { guard: await limiter.lease(keyOf(concurrency.name), concurrency.limit, concurrency.leaseMs, { name: concurrency.name }) };
    } catch (err) {
      if (err instanceof LeaseDenied) {
        return { denied: err.decision };
      }
      if (err instanceof LimiterUnavailable) {
        // The limiter raised, so it counted nothing: what the middleware does is counted here.
        const open = mode !== 'closed';
        limiter._metrics.lease(concurrency.name, open ? 'acquired' : 'denied', open ? 'unavailable_allowed' : 'unavailable_denied');
        if (open) {
          outageFailed(limiter, err, true);
          return { guard: null };
        }
      }
      throw err;
    }
  }

  // -> { status: 0 | 429 | 500 | 503, headers, body, guard }: a bug never lets requests
  // through (docs/clients.md, the failure rule).
  async function decide(req) {
    // The key and cost functions are the application's: their errors are its own, and
    // propagate (Express: next(err); Fastify: the error handler).
    const id = await key(req);
    const who = id === undefined || id === null ? '' : String(id);
    const n = await cost(req);
    const keyOf = (name) => bucketKey(prefix, who, name);
    let decision = null;
    let guard = null;
    // When the rate decision was asked for (null: not yet): a raised one is counted here.
    let rateStarted = null;
    try {
      if (concurrency) {
        const held = await inFlight(keyOf);
        if (held.denied) {
          return concurrencyDenial(held.denied);
        }
        guard = held.guard;
      }
      rateStarted = performance.now();
      decision = await rateDecision(keyOf, n);
    } catch (err) {
      if (guard) {
        releaseQuietly(limiter, guard);
      }
      if (!(err instanceof LimiterUnavailable)) {
        limiter.log('error', `redis-tb: rate limiter error, answering 500: ${err.name}: ${err.message}`);
        return { status: 500, headers: {}, body: BUG_BODY };
      }
      outageFailed(limiter, err, mode !== 'closed');
      if (rateStarted !== null && limits.length > 0) {
        // Several limits failed together: no limit decided, so the first one names the decision.
        limiter._metrics.decision(limits[0].name, mode !== 'closed',
          mode !== 'closed' ? 'unavailable_allowed' : 'unavailable_denied', rateStarted);
      }
      if (mode !== 'closed') {
        return { status: 0, headers: {}, body: null };
      }
      return { status: 503, headers: {}, body: UNAVAILABLE_BODY };
    }
    if (decision === null || decision.source === 'server') {
      outageOver(limiter);
    }
    const headers = mergeHeaders(decision ? decision.headers() : {}, guard ? guard.decision.headers() : {});
    if (decision === null || decision.allowed) {
      return { status: 0, headers, body: null, guard };
    }
    if (guard) {
      releaseQuietly(limiter, guard);
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
  }
  // What the middleware was configured with, defaults filled in (the behaviour tests').
  decide.settings = { prefix, onUnavailable: mode, limits, concurrency };
  return decide;

  function concurrencyDenial(denied) {
    outageOver(limiter);
    const headers = mergeHeaders(rateHeadersOnly(), denied.headers());
    return {
      status: concurrency.status,
      headers,
      body: {
        type: QUOTA_EXCEEDED,
        title: concurrency.status === 429 ? 'Too Many Requests' : 'Service Unavailable',
        status: concurrency.status,
        detail: `Concurrency limit of policy "${denied.policy}" reached (${denied.limit} at once); retry in ${headers['Retry-After']} s.`,
        'violated-policies': [denied.policy],
      },
    };
  }

  // The rate policies' RateLimit-Policy items, for a request refused before any token was
  // taken (rate first, then the in-flight policy: one line).
  function rateHeadersOnly() {
    return limits.length === 0 ? {} : { 'RateLimit-Policy': policyLine(limits, null) };
  }
}

// A lease the request will not use (a rate denial, a bug): released in the background; a
// failure is logged, never thrown (the lease ends at its deadline by itself).
function releaseQuietly(limiter, guard) {
  guard.release().catch((err) => {
    const level = err instanceof LimiterUnavailable ? 'warn' : 'error';
    limiter.log(level, `redis-tb: releasing a request's lease failed: ${err.message}`);
  });
}

// Releases a request's lease once, when its response finishes or its connection closes
// (an error, an abort). A failed release is logged, never thrown: the response is on its
// way, and the lease ends at its deadline by itself.
function releaseWhenDone(limiter, guard, res) {
  if (!guard) {
    return;
  }
  let done = false;
  const release = () => {
    if (done) {
      return;
    }
    done = true;
    guard.release().catch((err) => {
      const level = err instanceof LimiterUnavailable ? 'warn' : 'error';
      limiter.log(level, `redis-tb: releasing a request's lease failed: ${err.message}`);
    });
  };
  res.once('finish', release);
  res.once('close', release);
  if (res.writableFinished || res.destroyed) {
    release();
  }
}

module.exports = { limiterCore, releaseWhenDone, peerId, OutageLog, QUOTA_EXCEEDED };
