'use strict';

// The module's one bound, 2^53, judged on the exact value (core/src/number.rs
// above_max_exact_integer): the server used to accept '9007199254740993' and
// '9007199254740992.5' because the text became the double 2^53 before the check. Without a
// server: lib/core.js aboveMaxExact on strings and BigInts exactly, a Number as its own value,
// and the argument checks that use it.

const assert = require('node:assert/strict');
const { test } = require('node:test');
const core = require('../lib/core');
const { InvalidArgument } = require('../lib/errors');

test('a string or a BigInt just above 2^53 is above it, though Number() of it is 2^53', () => {
  for (const above of ['9007199254740993', '9007199254740992.5', '9007199254740992.000000000000000001',
    '9.007199254740993e15', '90071992547409921e-1', '1e16', '1e99999', 9007199254740993n, 2n ** 60n]) {
    assert.equal(core.aboveMaxExact(above), true, String(above));
  }
  assert.equal(Number('9007199254740993'), 2 ** 53);
});

test('2^53 however it is written, and what is below it, is not above it', () => {
  for (const atMost of ['9007199254740992', '90071992547409920e-1', '0.9007199254740992E+16',
    '9007199254740991.5', '00009007199254740992', '0', '.5', '5.', '1e-400', 9007199254740992n, 0n,
    2 ** 53, 1.5]) {
    assert.equal(core.aboveMaxExact(atMost), false, String(atMost));
  }
});

test('a Number is its own exact value: the literal 9007199254740993 is 2^53', () => {
  assert.equal(core.aboveMaxExact(9007199254740993), false);
  assert.equal(core.aboveMaxExact(2 ** 53 + 2), true);
  assert.equal(core.capacityText(9007199254740992), '9007199254740992');
  assert.throws(() => core.capacityText(2 ** 53 + 2), InvalidArgument);
  assert.throws(() => core.costText(2 ** 53 + 2), InvalidArgument);
  assert.throws(() => core.timeoutText(2 ** 53 + 2), InvalidArgument);
});

test('what is no number in the module grammar is null, not a judgement', () => {
  for (const bad of ['', '.', '-1', '+1', ' 5', '0x10', 'nan', 'inf', '1e', '1_000', '9'.repeat(65), null, {}, true]) {
    assert.equal(core.aboveMaxExact(bad), null, String(bad));
  }
});

test('the checks take Numbers only: a string or a BigInt is refused, whatever its value', () => {
  for (const value of ['5', 5n, '9007199254740993', 9007199254740993n]) {
    assert.throws(() => core.capacityText(value), InvalidArgument);
    assert.throws(() => core.costText(value), InvalidArgument);
    assert.throws(() => core.timeoutText(value), InvalidArgument);
  }
});
