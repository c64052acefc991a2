'use strict';

// redis-tb: token-bucket rate limiting over ioredis. The module's TB.* commands when the
// server has them, the Lua fallback (lua/tb.lua) otherwise; same replies either way.
const { RateLimiter, Decision, Limit, createClient, createClusterClient, lua } = require('./lib/limiter');
const { LimiterError, InvalidArgument, LimiterReplyError, LimiterUnavailable } = require('./lib/errors');
const { rateLimitHeaders } = require('./lib/headers');
const { expressRateLimit, fastifyRateLimit } = require('./lib/middleware');

module.exports = {
  RateLimiter,
  Decision,
  Limit,
  LimiterError,
  InvalidArgument,
  LimiterReplyError,
  LimiterUnavailable,
  rateLimitHeaders,
  expressRateLimit,
  fastifyRateLimit,
  createClient,
  createClusterClient,
  // The Lua text the fallback loads: { file, library, script, sha }.
  luaSource: lua,
  version: require('./package.json').version,
};
