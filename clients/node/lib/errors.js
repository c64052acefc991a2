'use strict';

// One base class for everything the library throws, LimiterError, with the names of
// docs/clients.md ("The same names everywhere"); `kind` names the family too:
//   InvalidArgument    'argument'    a bad value caught before anything was sent (NaN,
//                                    a capacity above 2^53, no key, a policy name that is
//                                    not printable ASCII, waitTake without timeoutMs, ...)
//   LimiterReplyError  'server'      the server refused the call: its error reply, text
//                                    unchanged (WRONGTYPE, CROSSSLOT, ERR corrupt bucket, ...)
//   LimiterUnavailable 'unavailable' the server cannot answer now: connection refused or
//                                    lost, a timeout, LOADING, BUSY, CLUSTERDOWN, READONLY, ...
//   LimiterError       'bug'         anything else (a reply of the wrong shape)
// lib/core.js classify() sorts errors into these (the one failure rule). The plain API
// always throws; the middleware fails open (or 503) on LimiterUnavailable only, and answers
// 500 for everything else.
class LimiterError extends Error {
  constructor(kind, message, options) {
    super(message, options);
    this.name = 'LimiterError';
    this.kind = kind;
  }
}

class InvalidArgument extends LimiterError {
  constructor(message, options) {
    super('argument', message, options);
    this.name = 'InvalidArgument';
  }
}

class LimiterReplyError extends LimiterError {
  constructor(message, options) {
    super('server', message, options);
    this.name = 'LimiterReplyError';
  }
}

class LimiterUnavailable extends LimiterError {
  constructor(message, options) {
    super('unavailable', message, options);
    this.name = 'LimiterUnavailable';
  }
}

// A lease guard found its lease no longer held (a renewal answered 0): guard.check() throws it.
class LeaseLost extends LimiterError {
  constructor(message, options) {
    super('lost', message, options);
    this.name = 'LeaseLost';
  }
}

// limiter.lease() / withLease() could not get a lease (the limit is reached, or the wait
// timed out). Not a LimiterError: the limiter worked, the answer is no. `decision` is the
// Lease denial (retryAfterMs, available).
class LeaseDenied extends Error {
  constructor(decision) {
    super(`no lease on ${String(decision.key)}: ${decision.limit} in use; retry in ${decision.retryAfterMs} ms`);
    this.name = 'LeaseDenied';
    this.decision = decision;
    this.retryAfterMs = decision.retryAfterMs;
  }
}

function isReplyError(err) {
  // ioredis's ReplyError (from redis-errors) without importing it: another copy of
  // ioredis may have made it.
  return Boolean(err) && err.name === 'ReplyError';
}

module.exports = { LimiterError, InvalidArgument, LimiterReplyError, LimiterUnavailable, LeaseLost, LeaseDenied, isReplyError };
