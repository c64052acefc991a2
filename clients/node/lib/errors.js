'use strict';

// One base class for everything the library throws, LimiterError, with the same three
// families as the Python and Rust libraries; `kind` names the family too:
//   InvalidArgument    'argument'    a bad value caught before anything was sent (NaN,
//                                    Infinity, no key, a policy name that is not printable
//                                    ASCII, waitTake without timeoutMs, ...)
//   LimiterReplyError  'server'      the server answered an error reply, its text unchanged
//                                    (ERR capacity must be ..., WRONGTYPE, CROSSSLOT, ...)
//   LimiterUnavailable 'unavailable' no answer in time: connection refused or lost, command
//                                    timeout, client not ready, cluster down, server loading
// The middleware treats every kind the same way (fail open, or 503 when failOpen is false);
// the plain API (take, peek, ...) always throws.
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

// Server replies that mean "not now" rather than "wrong request".
const UNAVAILABLE_REPLIES = /^(LOADING|BUSY|CLUSTERDOWN|MASTERDOWN|TRYAGAIN|MOVED|ASK|READONLY|NOREPLICAS|UNBLOCKED)\b/;

function isReplyError(err) {
  // ioredis's ReplyError (from redis-errors) without importing it: another copy of
  // ioredis may have made it.
  return Boolean(err) && err.name === 'ReplyError';
}

function wrap(err) {
  if (err instanceof LimiterError) {
    return err;
  }
  const message = err && err.message ? err.message : String(err);
  if (isReplyError(err) && !UNAVAILABLE_REPLIES.test(message)) {
    return new LimiterReplyError(message, { cause: err });
  }
  return new LimiterUnavailable(message, { cause: err });
}

module.exports = { LimiterError, InvalidArgument, LimiterReplyError, LimiterUnavailable, wrap, isReplyError };
