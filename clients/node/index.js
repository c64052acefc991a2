'use strict';

// redis-tb: token-bucket rate limiting over ioredis. The module's TB.* commands when the
// server has them, the Lua fallback (lua/tb.lua) otherwise; same replies either way.
const { RateLimiter, createClient, createClusterClient, lua } = require('./lib/limiter');
const { LeaseGuard } = require('./lib/lease');
const { Decision, Lease, Limit, TopKey, bucketKey, escapeId, classify } = require('./lib/core');
const { LimiterError, InvalidArgument, LimiterReplyError, LimiterUnavailable, LeaseDenied, LeaseLost } = require('./lib/errors');
const { rateLimitHeaders } = require('./lib/headers');
const { expressRateLimit } = require('./lib/express');
const { fastifyRateLimit } = require('./lib/fastify');

module.exports = {
  RateLimiter,
  Decision,
  Lease,
  LeaseGuard,
  LeaseDenied,
  LeaseLost,
  Limit,
  TopKey,
  LimiterError,
  InvalidArgument,
  LimiterReplyError,
  LimiterUnavailable,
  rateLimitHeaders,
  expressRateLimit,
  fastifyRateLimit,
  createClient,
  createClusterClient,
  // The key of a caller's bucket, `${prefix}{${escapeId(id)}}:${policy}` (docs/clients.md).
  bucketKey,
  escapeId,
  // The failure rule: 'unavailable' | 'server_changed' | 'bug' for any error a call met.
  classify,
  // The Lua text the fallback loads: { file, library, script, sha }.
  luaSource: lua,
  version: require('./package.json').version,
};
