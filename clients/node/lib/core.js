'use strict';

// The sans-IO core: everything the limiter decides, as plain functions over values,
// errors and replies. lib/limiter.js only sends what these return and feeds back what
// the server answered; nothing here touches a socket, a timer or a logger.
// The rules are docs/clients.md's (the one failure rule, keys, names), shared with the
// Python and Rust libraries.

const util = require('node:util');
const { LimiterError, InvalidArgument, LimiterReplyError, LimiterUnavailable, isReplyError } = require('./errors');
const { rateLimitHeaders, concurrencyItem } = require('./headers');

// ---------------------------------------------------------------------------------------
// Arguments: refused before anything is sent (docs/clients.md, "Invalid settings never
// reach the server").
// ---------------------------------------------------------------------------------------

// The largest capacity and n the module accepts (core/src/bucket.rs MAX_TOKENS).
const MAX_TOKENS = 2 ** 53;

function isNumber(value) {
  return typeof value === 'number' && Number.isFinite(value);
}

// Whether `value` is above 2^53 by its exact value: the module's one bound, which it judges
// on the exact decimal text (core/src/number.rs above_max_exact_integer), so that
// '9007199254740993' and '9007199254740992.5' are refused though Number() of either is 2^53.
// A Number is its own exact value (the literal 9007199254740993 already is 2^53); a BigInt is
// compared exactly; a string is judged on its digits. Anything else, or a string outside the
// module's number grammar (no sign, at most 64 bytes), is no number: null.
const MAX_EXACT_INTEGER_DIGITS = '9007199254740992';
const DECIMAL = /^([0-9]*)(?:\.([0-9]*))?(?:[eE]([+-]?[0-9]+))?$/;

function aboveMaxExact(value) {
  if (typeof value === 'number') {
    return value > MAX_TOKENS;
  }
  if (typeof value === 'bigint') {
    return value > BigInt(MAX_TOKENS);
  }
  const match = typeof value === 'string' && value.length <= 64 ? DECIMAL.exec(value) : null;
  if (match === null || (match[1] === '' && !match[2])) {
    return null;
  }
  const [, int, frac = '', exponent = '0'] = match;
  const digits = int + frac;
  const first = digits.search(/[1-9]/);
  if (first < 0) {
    return false; // zero
  }
  // The value is 0.d1d2... x 10^magnitude, d1 its first digit that is not 0; 2^53 is
  // 0.9007199254740992 x 10^16.
  const magnitude = int.length - first + Number(exponent);
  if (magnitude !== 16) {
    return magnitude > 16;
  }
  const significant = digits.slice(first).replace(/0+$/, '');
  const head = significant.slice(0, 16).padEnd(16, '0');
  if (head !== MAX_EXACT_INTEGER_DIGITS) {
    return head > MAX_EXACT_INTEGER_DIGITS;
  }
  return significant.length > 16;
}

// A number as the command's text: String(x) is the shortest decimal that reads back as x
// ("0.001", "1e-7", "1e+21"), which the module and the script both accept.
function capacityText(value, what = 'capacity') {
  if (!isNumber(value) || !(value > 0) || aboveMaxExact(value)) {
    throw new InvalidArgument(`${what} must be a positive finite number at most 2^53, got ${util.inspect(value)}`);
  }
  return String(value);
}

function rateText(value, what = 'rate') {
  if (!isNumber(value) || !(value > 0)) {
    throw new InvalidArgument(`${what} must be a positive finite number, got ${util.inspect(value)}`);
  }
  return String(value);
}

function costText(value, what = 'n') {
  if (!isNumber(value) || !(value >= 0) || aboveMaxExact(value)) {
    throw new InvalidArgument(`${what} must be a non-negative finite number at most 2^53, got ${util.inspect(value)}`);
  }
  return String(value);
}

function timeoutText(value) {
  if (!isNumber(value) || !(value >= 0) || aboveMaxExact(value)) {
    throw new InvalidArgument(`timeoutMs must be a finite number of ms from 0 (no limit) to 2^53, got ${util.inspect(value)}`);
  }
  return String(Math.ceil(value));
}

// A lease argument (limit, leaseMs): a positive whole number at most 2^53, sent as plain
// digits (the module accepts nothing else: docs/leases.md).
function wholeText(value, what) {
  if (!Number.isInteger(value) || !(value > 0) || value > MAX_TOKENS) {
    throw new InvalidArgument(`${what} must be a positive integer, at most 2^53, got ${util.inspect(value)}`);
  }
  return String(value);
}

// A whole number of ms in [least, 2^53] (maxWaitMs: least 0; blockMs, maxBlockMs: least 1),
// sent as plain digits (the server takes nothing else).
function msText(value, what, least) {
  if (!Number.isInteger(value) || value < least || value > MAX_TOKENS) {
    throw new InvalidArgument(`${what} must be a whole number of ms from ${least} to 2^53, got ${util.inspect(value)}`);
  }
  return String(value);
}

// BLOCK ms [MAXBLOCK ms] of a take (docs/clients.md, "Reservations, charges and lockout"):
// none without blockMs; maxBlockMs needs blockMs and is at least it.
function lockoutOptions(blockMs, maxBlockMs) {
  if (blockMs === undefined || blockMs === null) {
    if (maxBlockMs !== undefined && maxBlockMs !== null) {
      throw new InvalidArgument('maxBlockMs needs blockMs');
    }
    return [];
  }
  const block = msText(blockMs, 'blockMs', 1);
  if (maxBlockMs === undefined || maxBlockMs === null) {
    return ['BLOCK', block];
  }
  const most = msText(maxBlockMs, 'maxBlockMs', 1);
  if (maxBlockMs < blockMs) {
    throw new InvalidArgument(`maxBlockMs must be at least blockMs (${block}), got ${most}`);
  }
  return ['BLOCK', block, 'MAXBLOCK', most];
}

// The options of TB.TAKE / TB.TAKEALL: MAXWAIT ms (a reservation; 0 or none: no option) and
// the lockout's BLOCK / MAXBLOCK.
function takeOptions(maxWaitMs, blockMs, maxBlockMs) {
  const options = [];
  if (maxWaitMs !== undefined && maxWaitMs !== null) {
    const wait = msText(maxWaitMs, 'maxWaitMs', 0);
    if (wait !== '0') {
      options.push('MAXWAIT', wait);
    }
  }
  return [...options, ...lockoutOptions(blockMs, maxBlockMs)];
}

// The id of a lease: a Lease, an id string, or null/undefined (no lease: nothing to send).
function leaseId(lease) {
  if (lease === null || lease === undefined) {
    return null;
  }
  if (lease instanceof Lease) {
    return lease.lease;
  }
  if ((typeof lease === 'string' || Buffer.isBuffer(lease)) && lease.length > 0) {
    return lease;
  }
  throw new InvalidArgument(`a lease must be a Lease, a non-empty id string or null, not ${util.inspect(lease)}`);
}

// A policy name goes into the headers as an sf-string: non-empty printable ASCII only.
function checkName(name) {
  if (typeof name !== 'string' || !/^[\x20-\x7e]+$/.test(name)) {
    throw new InvalidArgument(`a policy name must be non-empty printable ASCII, not ${util.inspect(name)}`);
  }
  return name;
}

function checkKey(key) {
  if (!(typeof key === 'string' || Buffer.isBuffer(key)) || key.length === 0) {
    throw new InvalidArgument('key must be a non-empty string or Buffer');
  }
  return key;
}

// A policy { name, capacity, rate } as the middleware and takeAll hold it: checked once.
function checkPolicy(policy, what = 'policy') {
  capacityText(policy.capacity, `${what}.capacity`);
  rateText(policy.rate, `${what}.rate`);
  checkName(policy.name);
  return policy;
}

// ---------------------------------------------------------------------------------------
// Keys no id can break (docs/clients.md, "Keys no id can break")
// ---------------------------------------------------------------------------------------

// `%` -> %25, `{` -> %7B, `}` -> %7D, and the empty id -> `%` (which escaping never
// produces): the result has no brace and is never empty, so the hash tag is exactly it.
function escapeId(id) {
  const text = String(id);
  if (text === '') {
    return '%';
  }
  return text.replace(/[%{}]/g, (c) => ({ '%': '%25', '{': '%7B', '}': '%7D' })[c]);
}

function bucketKey(prefix, id, name) {
  return `${prefix}{${escapeId(id)}}:${name}`;
}

// The server's hash slot of a key (cluster.c keyHashSlot): the part between the first `{`
// and the first `}` after it, if that part is non-empty, else the whole key. Computed here
// rather than with ioredis's slot function, which disagrees with the server for keys such
// as `a{}x}` (issue 18, item 5).
const CRC16_TABLE = (() => {
  const table = new Uint16Array(256);
  for (let i = 0; i < 256; i++) {
    let crc = i << 8;
    for (let bit = 0; bit < 8; bit++) {
      crc = crc & 0x8000 ? (crc << 1) ^ 0x1021 : crc << 1;
    }
    table[i] = crc & 0xffff;
  }
  return table;
})();

function crc16(bytes) {
  let crc = 0;
  for (const byte of bytes) {
    crc = ((crc << 8) ^ CRC16_TABLE[((crc >> 8) ^ byte) & 0xff]) & 0xffff;
  }
  return crc;
}

function keySlot(key) {
  let bytes = Buffer.isBuffer(key) ? key : Buffer.from(String(key));
  const open = bytes.indexOf(0x7b);
  if (open >= 0) {
    const close = bytes.indexOf(0x7d, open + 1);
    if (close > open + 1) {
      bytes = bytes.subarray(open + 1, close);
    }
  }
  return crc16(bytes) & 16383;
}

// ---------------------------------------------------------------------------------------
// The one failure rule (docs/clients.md, "The failure rule")
// ---------------------------------------------------------------------------------------

// Error replies that describe the server's state, not the request.
const UNAVAILABLE_REPLIES = new Set([
  'LOADING', 'BUSY', 'MASTERDOWN', 'TRYAGAIN', 'CLUSTERDOWN', 'READONLY', 'UNBLOCKED', 'NOREPLICAS', 'OOM',
]);

// Error replies that say the server no longer has what the backend uses.
const SERVER_CHANGED_REPLIES = /^(?:NOSCRIPT\b|ERR unknown command\b|ERR Function not found\b|ERR No matching library\b)/i;

// The class of one error reply's text: 'unavailable' | 'server_changed' | 'bug'.
function classifyReply(message) {
  const word = String(message).split(' ', 1)[0];
  if (UNAVAILABLE_REPLIES.has(word)) {
    return 'unavailable';
  }
  if (SERVER_CHANGED_REPLIES.test(message)) {
    return 'server_changed';
  }
  return 'bug';
}

// The class of anything a call can throw. Errors that are not replies come from the
// connection (refused, reset, closed, ioredis's timers, a cluster with no slot map): the
// server is unavailable. Our own errors keep theirs, and errors of the language itself
// (a TypeError) are bugs.
function classify(err) {
  if (err instanceof LimiterUnavailable) {
    return 'unavailable';
  }
  if (err instanceof LimiterReplyError) {
    return classifyReply(err.message);
  }
  if (err instanceof LimiterError) {
    return 'bug';
  }
  if (isReplyError(err)) {
    return classifyReply(err.message);
  }
  if (err instanceof TypeError || err instanceof RangeError || err instanceof ReferenceError || err instanceof SyntaxError) {
    return 'bug';
  }
  return 'unavailable';
}

// The LimiterError a caller sees for `err`. A server-changed reply that survived the
// retry is reported as the reply it is (the backend cannot serve the call: a bug).
function limiterError(err) {
  if (err instanceof LimiterError) {
    return err;
  }
  const message = err && err.message ? err.message : String(err);
  if (classify(err) === 'unavailable') {
    return new LimiterUnavailable(message, { cause: err });
  }
  if (isReplyError(err)) {
    return new LimiterReplyError(message, { cause: err });
  }
  return new LimiterError('bug', message, { cause: err });
}

// MOVED / ASK replies (cluster redirections): { kind, slot, host, port }, or null.
function parseRedirect(message) {
  const m = /^(MOVED|ASK) (\d+) (.*):(\d+)$/.exec(String(message));
  return m ? { kind: m[1], slot: Number(m[2]), host: m[3], port: Number(m[4]) } : null;
}

// ---------------------------------------------------------------------------------------
// Commands per backend, and decisions from replies
// ---------------------------------------------------------------------------------------

const MODULE_COMMANDS = {
  take: 'TB.TAKE', peek: 'TB.PEEK', refund: 'TB.REFUND', takeall: 'TB.TAKEALL',
  acquire: 'TB.ACQUIRE', release: 'TB.RELEASE', renew: 'TB.RENEW',
  charge: 'TB.CHARGE', unblock: 'TB.UNBLOCK',
};
const FUNCTIONS = {
  take: 'tb_take', peek: 'tb_peek', refund: 'tb_refund', takeall: 'tb_takeall',
  acquire: 'tb_acquire', release: 'tb_release', renew: 'tb_renew',
  charge: 'tb_charge', unblock: 'tb_unblock',
};

// The command that runs `op` on `backend`: { name, args }. `keys` are final (prefixed);
// `numbers` are the texts capacity rate n, once per key (acquire: limit leaseMs; release:
// the id; renew: the id and leaseMs).
function commandFor(backend, op, keys, numbers, sha) {
  switch (backend) {
    case 'module': {
      if (op === 'takeall') {
        // After the groups of three: the options (MAXWAIT, BLOCK, MAXBLOCK), once.
        const args = [];
        keys.forEach((key, i) => args.push(key, ...numbers.slice(3 * i, 3 * i + 3)));
        args.push(...numbers.slice(3 * keys.length));
        return { name: MODULE_COMMANDS[op], args };
      }
      return { name: MODULE_COMMANDS[op], args: [...keys, ...numbers] };
    }
    case 'function':
      // FCALL_RO for peek: it writes nothing, so it may run on a replica.
      return { name: op === 'peek' ? 'fcall_ro' : 'fcall', args: [FUNCTIONS[op], keys.length, ...keys, ...numbers] };
    case 'script':
      return { name: 'evalsha', args: [sha, keys.length, ...keys, op, ...numbers] };
    default:
      throw new LimiterError('bug', `no backend chosen (${backend})`);
  }
}

// One limit of a takeAll call (and the shape the middleware's `limits` option takes).
// lockout: { blockMs, maxBlockMs } (docs/clients.md, "Reservations, charges and lockout"):
// a denied take locks the key for blockMs, doubling within a probation up to maxBlockMs;
// checked here, sent as BLOCK / MAXBLOCK on its takes (takeLimit, takeAll).
// Checked when it is made (docs/clients.md, "A Limit is validated when it is made"), not
// when first used.
class Limit {
  constructor(key, capacity, rate, n = 1, name = null, lockout = {}) {
    checkKey(key);
    capacityText(capacity);
    rateText(rate);
    costText(n);
    if (name !== null && name !== undefined) {
      checkName(name);
    }
    this.key = key;
    this.capacity = capacity;
    this.rate = rate;
    this.n = n;
    this.name = name;
    const { blockMs = null, maxBlockMs = null } = lockout ?? {};
    lockoutOptions(blockMs, maxBlockMs);
    this.blockMs = blockMs;
    this.maxBlockMs = maxBlockMs;
  }
}

// The answer of every call. `limits` lists what the call was judged with (one entry, or one
// per takeAll limit in the call's order); `index` is the deciding limit of a takeAll (null
// otherwise); `capacity`, `rate` and `policy` are that limit's.
class Decision {
  // source: where the answer came from: 'server' (Redis), 'local' (the local limiter, while
  // Redis is unreachable), 'cache' (the denial cache).
  constructor(reply, limits, index, source = 'server') {
    this.allowed = reply[0] === 1;
    this.remaining = reply[1];
    this.retryAfterMs = reply[2];
    this.resetAfterMs = reply[3];
    this.index = index;
    const deciding = limits[index ?? 0];
    this.capacity = deciding.capacity;
    this.rate = deciding.rate;
    this.policy = deciding.name;
    this.source = source;
    Object.defineProperty(this, 'limits', { value: limits, enumerable: false });
  }

  // On an allowed decision, the ms to wait before acting: > 0 for a reservation (take with
  // maxWaitMs) or a charge that left debt (until it is repaid), 0 for a plain grant; 0 on a
  // denial (see retryAfterMs).
  get waitMs() {
    return this.allowed && this.retryAfterMs > 0 ? this.retryAfterMs : 0;
  }

  headers() {
    return rateLimitHeaders(this);
  }
}

// A reply of the wrong shape is a bug (the key is not a bucket's, a proxy in the way).
function decisionFrom(reply, limits, withIndex) {
  const count = withIndex ? 5 : 4;
  const valid = Array.isArray(reply) && reply.length === count && reply.every((x) => typeof x === 'number')
    && (!withIndex || (Number.isInteger(reply[4]) && reply[4] >= 0 && reply[4] < limits.length));
  if (!valid) {
    throw new LimiterError('bug', `unexpected reply: ${util.inspect(reply)}`);
  }
  return new Decision(reply, limits, withIndex ? reply[4] : null);
}

// The answer of acquire / waitAcquire (docs/leases.md): `acquired`, `available` (free slots
// left after the call), `retryAfterMs` (0 when acquired; else until the earliest live lease
// ends by itself), `lease` (the id, or null when not acquired and when failed open),
// `failedOpen` (a failOpen call met an unavailable limiter: acquired without a lease), and
// what the call asked for: key, limit, leaseMs, policy.
class Lease {
  constructor(acquired, available, retryAfterMs, lease, asked, failedOpen = false) {
    this.acquired = acquired;
    this.available = available;
    this.retryAfterMs = retryAfterMs;
    this.lease = lease;
    this.failedOpen = failedOpen;
    this.key = asked.key;
    this.limit = asked.limit;
    this.leaseMs = asked.leaseMs;
    this.policy = asked.name;
  }

  // RateLimit-Policy: "<name>";q=<limit>;qu="concurrent-requests", and on a denial
  // Retry-After: ceil(retryAfterMs / 1000), at least 1. A failed-open Lease has none.
  headers() {
    if (this.failedOpen) {
      return {};
    }
    const headers = { 'RateLimit-Policy': concurrencyItem(this.policy, this.limit) };
    if (!this.acquired) {
      headers['Retry-After'] = String(Math.max(1, Math.ceil(this.retryAfterMs / 1000)));
    }
    return headers;
  }
}

// [acquired, available, retry_after_ms, id or nil]; another shape is a bug.
function leaseFrom(reply, asked) {
  const valid = Array.isArray(reply) && reply.length === 4 && reply.slice(0, 3).every(Number.isInteger)
    && (reply[0] === 1 ? (typeof reply[3] === 'string' || Buffer.isBuffer(reply[3])) && reply[3].length > 0
      : reply[0] === 0 && reply[3] === null);
  if (!valid) {
    throw new LimiterError('bug', `unexpected reply: ${util.inspect(reply)}`);
  }
  const id = Buffer.isBuffer(reply[3]) ? reply[3].toString() : reply[3];
  return new Lease(reply[0] === 1, reply[1], reply[2], id, asked);
}

// One row of top() (docs/clients.md, "The most-denied keys"): the key as text (bytes that are
// not UTF-8 replaced by U+FFFD) and as its exact bytes, its denials (at most `error` above the
// true number), how many were shadow-mode denials, and whether the name was cut at 256 bytes.
class TopKey {
  constructor(keyBytes, count, error, shadow, truncated) {
    this.key = keyBytes.toString('utf8');
    this.keyBytes = keyBytes;
    this.count = count;
    this.error = error;
    this.shadow = shadow;
    this.truncated = truncated;
  }
}

// TB.TOP's reply, read with Buffers for bulk strings: rows of [key, count, error, shadow,
// truncated]; another shape is a bug.
function topFrom(reply) {
  if (!Array.isArray(reply)) {
    throw new LimiterError('bug', `unexpected TB.TOP reply: ${util.inspect(reply)}`);
  }
  return reply.map((row) => {
    const valid = Array.isArray(row) && row.length === 5 && (Buffer.isBuffer(row[0]) || typeof row[0] === 'string')
      && row.slice(1, 4).every((x) => Number.isSafeInteger(x) && x >= 0) && (row[4] === 0 || row[4] === 1);
    if (!valid) {
      throw new LimiterError('bug', `unexpected TB.TOP row: ${util.inspect(row)}`);
    }
    return new TopKey(Buffer.from(row[0]), row[1], row[2], row[3], row[4] === 1);
  });
}

// The masters' rows as one answer: the most denied first, ties by the key's bytes, the first
// `count` kept. Each master counts only the keys it owns, so no key is in two lists.
function mergeTop(lists, count) {
  // The server's own order (core/src/top.rs), so the cut keeps what each server kept.
  return lists.flat()
    .sort((a, b) => b.count - a.count || a.error - b.error || Buffer.compare(a.keyBytes, b.keyBytes))
    .slice(0, count);
}

function boolFrom(reply) {
  if (reply !== 0 && reply !== 1) {
    throw new LimiterError('bug', `unexpected reply: ${util.inspect(reply)}`);
  }
  return reply === 1;
}

module.exports = {
  MAX_TOKENS,
  aboveMaxExact,
  capacityText,
  rateText,
  costText,
  timeoutText,
  wholeText,
  msText,
  lockoutOptions,
  takeOptions,
  leaseId,
  checkName,
  checkKey,
  checkPolicy,
  escapeId,
  bucketKey,
  keySlot,
  classify,
  classifyReply,
  limiterError,
  parseRedirect,
  commandFor,
  Limit,
  Decision,
  decisionFrom,
  Lease,
  leaseFrom,
  TopKey,
  topFrom,
  mergeTop,
  boolFrom,
  concurrencyItem,
};
