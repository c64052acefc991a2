'use strict';

// One error type for everything the library throws. `kind` says what went wrong:
//   'argument'    a bad value caught before anything was sent (NaN, Infinity, no key, ...)
//   'server'      the server answered an error (ERR capacity must be ..., WRONGTYPE, ...)
//   'unavailable' no answer in time: connection refused or lost, command timeout,
//                 client not ready, cluster down, server loading
// The middleware treats every kind the same way (fail open, or 503 when failOpen is false);
// the plain API (take, peek, ...) always throws.
class RateLimiterError extends Error {
  constructor(kind, message, options) {
    super(message, options);
    this.name = 'RateLimiterError';
    this.kind = kind;
  }
}

// Server replies that mean "not now" rather than "wrong request".
const UNAVAILABLE_REPLIES = /^(LOADING|BUSY|CLUSTERDOWN|MASTERDOWN|TRYAGAIN|MOVED|ASK|READONLY|NOREPLICAS|UNBLOCKED)\b/;

function isReplyError(err) {
  // ioredis's ReplyError (from redis-errors) without importing it: another copy of
  // ioredis may have made it.
  return Boolean(err) && err.name === 'ReplyError';
}

function wrap(err) {
  if (err instanceof RateLimiterError) {
    return err;
  }
  const message = err && err.message ? err.message : String(err);
  const kind = isReplyError(err) && !UNAVAILABLE_REPLIES.test(message) ? 'server' : 'unavailable';
  return new RateLimiterError(kind, message, { cause: err });
}

module.exports = { RateLimiterError, wrap, isReplyError };
