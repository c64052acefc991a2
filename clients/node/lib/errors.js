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

// A family: a LimiterError of one kind, made like an Error (message, options). One function
// makes the four, so that they stay alike; the computed key names each class as a
// declaration would (stack traces, console.log, InvalidArgument.name).
function family(name, kind) {
  return {
    [name]: class extends LimiterError {
      constructor(message, options) {
        super(kind, message, options);
        this.name = name;
      }
    },
  }[name];
}

const InvalidArgument = family('InvalidArgument', 'argument');
const LimiterReplyError = family('LimiterReplyError', 'server');
const LimiterUnavailable = family('LimiterUnavailable', 'unavailable');
// A lease guard found its lease no longer held (a renewal answered 0): guard.check() throws it.
const LeaseLost = family('LeaseLost', 'lost');

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
