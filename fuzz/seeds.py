#!/usr/bin/env python3
"""Writes the committed seed corpus (fuzz/corpus/<target>/). Run from anywhere.

A handful of readable or hand-encoded inputs per target: everyday requests,
the contract's examples, and the extremes (subnormals, 1e300, i64 edges).
The fuzzer grows its own corpus from these in a scratch directory
(.cache/fuzz/), so the committed one stays small.
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


# parse_args: first byte = separator, then capacity, rate [, n].
for name, text in {
    "take": "|20|2.5|1",
    "contract-examples": "|1e3|.5|5.",
    "tiny": "|1E-3|0.5|1e-400",
    "peek-default-n": "|5|1",
    "bad-capacity": "|0|1|1",
    "bad-all": "|nan|inf|-1",
    "long": "|" + "9" * 64 + "|1|" + "1" * 65,
    "binary": "\x00 5\x005 \x001_000\x00",
    # Just above 2^53, though each rounds to the double 2^53; and 2^53 itself.
    "just-above-2-pow-53": "|9007199254740993|1|9007199254740992.5",
    "at-2-pow-53": "|90071992547409920e-1|1|9007199254740992",
}.items():
    write("parse_args", name, text)

# decode_state: a stored field; with '|', a (tokens, last_refill) pair.
for name, data in {
    "signed": b"-3",
    "pair": b"2.5|1700000000000",
    "pair-future": b"0.10000000000000001|1e+15",
    "pair-negative": b"-7|-5",
    "pair-huge": b"1e308|0",
    "key": b"a\r\n\x00'\\" + b"x" * 70,
    "bits": struct.pack("<d", 5e-324),
}.items():
    write("decode_state", name, data)


# arithmetic: see fuzz_targets/arithmetic.rs and Reader in fuzz/src/lib.rs.
def u16(v):   # F tag 1: small integer
    return bytes([1]) + struct.pack("<H", v)


def raw(v):   # F tag 0: raw bits
    return bytes([0]) + struct.pack("<d", v)


def dec(m, e3):  # F tag 4: m * 10^(3*e3)
    return bytes([4]) + struct.pack("<Ib", m, e3)


def special(i):  # F tag 3: SPECIAL_F64[i]
    return bytes([3, i])


def now(delta=0):  # I tag 1: NOW_MS + delta
    return bytes([1]) + struct.pack("<i", delta)


def i_special(i):  # I tag 2: SPECIAL_I64[i]
    return bytes([2, i])


NONE = bytes([0])      # stored: missing key
SOME = bytes([1])      # stored: tokens, last_refill follow
LAST_NOW_MINUS_1S = dec(1699999999, 1)  # 1.699999999e12

write("arithmetic", "take-new", bytes([0]) + u16(10) + u16(1) + u16(1) + NONE + now())
write("arithmetic", "take-empty", bytes([0]) + u16(10) + u16(2) + u16(1)
      + SOME + u16(0) + LAST_NOW_MINUS_1S + now())
write("arithmetic", "take-astronomic", bytes([0]) + special(19) + special(5) + special(10)
      + SOME + special(0) + LAST_NOW_MINUS_1S + now())
write("arithmetic", "take-subnormal", bytes([0]) + special(2) + special(3) + special(2)
      + SOME + raw(5e-324) + special(0) + i_special(8))
write("arithmetic", "refund", bytes([1]) + u16(10) + u16(1) + u16(3)
      + SOME + u16(2) + LAST_NOW_MINUS_1S + now())
write("arithmetic", "takeall-2", bytes([2 | (1 << 2)])
      + u16(10) + u16(10) + u16(1) + SOME + u16(0) + LAST_NOW_MINUS_1S
      + u16(1000) + dec(11574, -2) + u16(1) + NONE + now())
write("arithmetic", "sequence", bytes([3]) + u16(5) + u16(2) + NONE + now()
      + b"".join(bytes([0x10 | (k & 1)]) + struct.pack("<H", 300 * k) + u16(k % 3)
                 for k in range(8))
      + bytes([0x00]) + struct.pack("<H", 5000) + u16(1))  # a clock step back
