'use strict';

// The core's vectors (clients/conformance/vectors/, written by the pure core) replayed
// against the rules this library writes again, without a server: the bucket's take
// (take.json; peek.json without a lock), takeAll (takeall.json without options), firstMsWhen
// and the denial cache's priming window. Each vector's stored state, limit, n and clock go
// in; the reply figures and the state written must come out exactly.
//
// And the argument rules (args.json), through the limiter's own calls on a server with the
// module: what the core refuses, the limiter refuses before sending (InvalidArgument, naming
// the same argument, and 2^53 when the value is above it); what the core accepts, the limiter
// sends and the server accepts. A Number cannot hold every text (9007199254740993 is 2^53 as a
// Number), so those vectors are replayed on lib/core.js aboveMaxExact, the rule on strings.

const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { after, before, describe, test } = require('node:test');
const { RateLimiter, InvalidArgument, createClient } = require('..');
const { aboveMaxExact } = require('../lib/core');
const { take, takeAll, firstMsWhen, primedDenialMs } = require('../lib/local');
const { startServer, stopAll } = require('./servers');

const DIR = path.join(__dirname, '..', '..', 'conformance', 'vectors');

function vectors(rule, keep = () => true) {
  const found = JSON.parse(fs.readFileSync(path.join(DIR, `${rule}.json`), 'utf8')).vectors.filter(keep);
  assert.ok(found.length > 0, `no vectors in ${rule}.json`);
  return found;
}

// A vector's stored bucket as the local limiter keeps one (undefined: a missing key).
function stored(state) {
  return state === null ? undefined : { tokens: state.tokens, last: state.last_refill_ms };
}

// What the local limiter stores of a vector's write: the tokens and last_refill.
function written(write) {
  return write === null ? null : { tokens: write.tokens, last: write.last_refill_ms };
}

function reply(allowed, outcome) {
  return {
    allowed, remaining: outcome.remaining, retry_after_ms: outcome.retryAfterMs, reset_after_ms: outcome.resetAfterMs,
  };
}

function takeOf(v) {
  return take(stored(v.state), v.config.capacity, v.config.rate, v.n, v.now_ms);
}

for (const v of vectors('take')) {
  test(`take.json: a local take replies and writes as the core: ${v.name}`, () => {
    const outcome = takeOf(v);
    assert.deepEqual(reply(outcome.allowed, outcome), v.expect.reply);
    assert.deepEqual(outcome.write, written(v.expect.write));
  });
}

for (const v of vectors('peek', (p) => p.state === null || p.state.lock === undefined)) {
  test(`peek.json: a local peek replies as the core: ${v.name}`, () => {
    const outcome = takeOf(v);
    assert.deepEqual(reply(outcome.allowed, outcome), v.expect.reply);
  });
}

for (const v of vectors('takeall', (t) => Object.keys(t.options).length === 0)) {
  test(`takeall.json: a local takeAll takes from every bucket or none as the core: ${v.name}`, () => {
    const all = takeAll(v.buckets.map((b) => ({
      stored: stored(b.state), capacity: b.config.capacity, rate: b.config.rate, n: b.n,
    })), v.now_ms);
    assert.deepEqual({ ...reply(all.allowed, all.outcomes[all.index]), index: all.index }, v.expect.reply);
    assert.deepEqual(all.outcomes.map((o) => o.write), v.expect.writes.map(written));
  });
}

for (const v of vectors('first_ms_when')) {
  test(`first_ms_when.json: firstMsWhen is the core's: ${v.name}`, () => {
    const state = { tokens: v.state.tokens, last: v.state.last_refill_ms };
    assert.equal(firstMsWhen(state, v.config.capacity, v.config.rate, v.now_ms, v.wanted), v.expect.ms);
  });
}

for (const v of vectors('denial_cache')) {
  test(`denial_cache.json: the denial cache primes the core's window: ${v.name}`, () => {
    const got = primedDenialMs(v.config.capacity, v.config.rate, v.n, v.reply.remaining, v.reply.reset_after_ms);
    assert.equal(got, v.expect.window_ms);
  });
}

// --- The argument rules (args.json) ---------------------------------------------------------

const DECIMAL = /^(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?$/;
const DIGITS = /^[0-9]+$/;
const SPECIAL = { nan: NaN, NaN, inf: Infinity, infinity: Infinity, '-inf': -Infinity };

// Thrown for a vector that says something only its text can: a sign on zero, a plus sign,
// hex, padding, 65 bytes, a whole number spelt 1.0 or 1e3, an option keyword unknown,
// repeated or without its value. A caller of this library passes Numbers and options.
class TextOnly extends Error {}

// The Number a caller passes for the argument `text`; `whole`: an argument the server takes
// as plain digits only (MAXWAIT, BLOCK, MAXBLOCK, limit, lease_ms).
function numberOf(text, whole = false) {
  if (Object.hasOwn(SPECIAL, text)) {
    return SPECIAL[text];
  }
  const negative = text.startsWith('-');
  const body = negative ? text.slice(1) : text;
  if (text.length > 64 || !DECIMAL.test(body)) {
    throw new TextOnly();
  }
  const value = Number(body);
  if ((whole && !DIGITS.test(body) && Number.isInteger(value)) || (negative && value === 0)) {
    throw new TextOnly();
  }
  return negative ? -value : value;
}

const TAKE_OPTIONS = { MAXWAIT: 'maxWaitMs', BLOCK: 'blockMs', MAXBLOCK: 'maxBlockMs' };

function takeOptions(words) {
  if (words.length % 2 !== 0) {
    throw new TextOnly();
  }
  const options = {};
  for (let i = 0; i < words.length; i += 2) {
    const name = TAKE_OPTIONS[words[i].toUpperCase()];
    if (name === undefined || Object.hasOwn(options, name)) {
      throw new TextOnly();
    }
    options[name] = numberOf(words[i + 1], true);
  }
  return options;
}

// The limiter call that sends the vector's command with its arguments, on the key 'k'.
function limiterCall(v) {
  const { command, args } = v;
  const [capacity, rate, n] = ['TB.TAKEALL', 'TB.ACQUIRE', 'TB.RENEW', 'TB.THROTTLE'].includes(command)
    ? [] : args.slice(0, 3).map((text) => numberOf(text));
  const words = args.slice(3);
  switch (command) {
    case 'TB.TAKE': {
      const options = takeOptions(words);
      return (limiter) => limiter.take('k', capacity, rate, n, options);
    }
    case 'TB.PEEK':
      return (limiter) => limiter.peek('k', capacity, rate, n ?? 1);
    case 'TB.REFUND':
      return (limiter) => limiter.refund('k', capacity, rate, n);
    case 'TB.CHARGE': {
      if (words.length > 0 && (words.length !== 2 || words[0].toUpperCase() !== 'MAXDEBT')) {
        throw new TextOnly();
      }
      const maxDebt = words.length > 0 ? numberOf(words[1]) : undefined;
      return (limiter) => limiter.charge({ key: 'k', capacity, rate }, n, { maxDebt });
    }
    case 'TB.BTAKE': {
      const timeoutMs = numberOf(args[3]);
      return (limiter) => limiter.waitTake('k', capacity, rate, n, { timeoutMs });
    }
    case 'TB.TAKEALL': {
      const options = takeOptions(args.slice(4 * v.groups));
      const { blockMs, maxBlockMs } = options;
      const limits = [];
      for (let i = 0; i < 4 * v.groups; i += 4) {
        const [c, r, cost] = args.slice(i + 1, i + 4).map((text) => numberOf(text));
        limits.push({ key: args[i], capacity: c, rate: r, n: cost, blockMs, maxBlockMs });
      }
      return (limiter) => limiter.takeAll(limits, { maxWaitMs: options.maxWaitMs });
    }
    case 'TB.ACQUIRE': {
      const [limit, leaseMs] = args.slice(0, 2).map((text) => numberOf(text, true));
      if (args.length === 3) {
        const timeoutMs = numberOf(args[2]);
        return (limiter) => limiter.waitAcquire('k', limit, leaseMs, { timeoutMs });
      }
      return (limiter) => limiter.acquire('k', limit, leaseMs);
    }
    case 'TB.RENEW': {
      const leaseMs = numberOf(args[1], true);
      return (limiter) => limiter.renew('k', args[0], leaseMs);
    }
    default:
      throw new TextOnly(); // TB.THROTTLE: no call of this library sends it
  }
}

// A vector this library's checks cover: a caller can say it with Numbers, and the core
// accepts it or refuses an argument (an unknown option and a repeated key are the server's).
function checkedHere(v) {
  try {
    limiterCall(v);
  } catch (err) {
    if (err instanceof TextOnly) {
      return false;
    }
    throw err;
  }
  return v.doubles_suffice && (v.expect.error === undefined || v.expect.argument !== null);
}

// The limiter's names of the arguments the server's errors name.
const NAMES = {
  timeout_ms: 'timeoutMs', lease_ms: 'leaseMs', MAXWAIT: 'maxWaitMs', BLOCK: 'blockMs', MAXBLOCK: 'maxBlockMs',
  MAXDEBT: 'maxDebt',
};

describe('args.json: the limiter refuses what the core refuses and sends what it accepts', () => {
  let server;
  let client;
  let limiter;
  before(async () => {
    server = await startServer({ module: true });
    // The test's own FLUSHALLs go through this client: not createClient()'s 200 ms command
    // timeout, which a busy machine can miss.
    client = createClient(server.url, { commandTimeout: 10_000 });
    await new Promise((resolve) => client.once('ready', resolve));
    limiter = new RateLimiter(client, { timeoutMs: 5000 });
  });
  after(async () => {
    client.disconnect();
    await stopAll();
  });

  for (const v of vectors('args', checkedHere)) {
    test(v.name, async () => {
      await client.flushall();
      const call = limiterCall(v);
      if (v.expect.error === undefined) {
        await call(limiter); // refused neither here nor by the server
        return;
      }
      const name = NAMES[v.expect.argument] ?? v.expect.argument;
      await assert.rejects(async () => call(limiter), (err) => {
        assert.ok(err instanceof InvalidArgument, `${err}`);
        assert.match(err.message, new RegExp(`^(?:\\S*\\.)?${name} (?:must|needs)\\b`));
        // Above the bound the server's error states: so must the limiter's.
        const above = v.args.some((text) => DECIMAL.test(text) && Number(text) > 2 ** 53);
        if (above && v.expect.error.includes('2^53')) {
          assert.match(err.message, /2\^53/);
        }
        return true;
      });
    });
  }
});

// Where the argument `name` (capacity, n, timeout_ms, MAXDEBT: the decimals bounded by 2^53)
// is in a vector's args: its positions (every group's, for TB.TAKEALL).
function boundedAt(v, name) {
  const layout = {
    'TB.TAKE': { capacity: [0], n: [2] },
    'TB.PEEK': { capacity: [0], n: [2] },
    'TB.REFUND': { capacity: [0], n: [2] },
    'TB.CHARGE': { capacity: [0], n: [2], MAXDEBT: [4] },
    'TB.BTAKE': { capacity: [0], n: [2], timeout_ms: [3] },
    'TB.ACQUIRE': { timeout_ms: [2] },
    'TB.TAKEALL': {
      capacity: Array.from({ length: v.groups }, (_, i) => 4 * i + 1),
      n: Array.from({ length: v.groups }, (_, i) => 4 * i + 3),
    },
  }[v.command] ?? {};
  return (layout[name] ?? []).filter((at) => at < v.args.length && (name !== 'MAXDEBT' || /^maxdebt$/i.test(v.args[3])));
}

// Every text in a bounded argument whose verdict the vector tells: accepted (so at most 2^53),
// or the one its error names, when the text is a number the grammar takes that reads as a
// finite double (1e400 is refused as no finite number first) and the error is the bound's
// (any such text of n, MAXDEBT or timeout_ms is refused only by the bound; a capacity also
// when it reads as 0, with another message).
function boundVerdicts() {
  const verdicts = [];
  for (const v of vectors('args')) {
    for (const name of ['capacity', 'n', 'timeout_ms', 'MAXDEBT']) {
      const error = v.expect.error;
      // Only an error on the argument's value (not "given twice"); a TB.TAKEALL error does
      // not say which group's argument it is.
      const onItsValue = v.expect.argument === name && / must be /.test(error) && v.command !== 'TB.TAKEALL';
      if (error !== undefined && !onItsValue) {
        continue;
      }
      for (const at of boundedAt(v, name)) {
        const text = v.args[at];
        if (!DECIMAL.test(text) || text.length > 64 || Number(text) === 0 || !Number.isFinite(Number(text))) {
          continue;
        }
        const above = error !== undefined && (name !== 'capacity' || error.includes('at most'));
        verdicts.push({ v, text, above });
      }
    }
  }
  return verdicts;
}

test('args.json: aboveMaxExact judges every bounded text as the core does', () => {
  const verdicts = boundVerdicts();
  assert.ok(verdicts.some(({ above }) => above) && verdicts.some(({ above }) => !above));
  for (const { v, text, above } of verdicts) {
    assert.equal(aboveMaxExact(text), above, `${v.name}: ${text}`);
  }
});
