'use strict';

// The lease guard (docs/leases.md): what RateLimiter#lease and withLease hand the work, as
// Python's _lease.py and Rust's lease.rs. The limiter does the calls (renew, release); the
// guard decides when to make them and what a failed one means.

const { LimiterUnavailable, LeaseLost } = require('./errors');

// Holds one lease: renews it in the background (a timer that does not keep the process
// alive) until released. `lost` (and `signal`, an AbortSignal aborted with a LeaseLost)
// tell the work that a renewal found the lease no longer held; `check()` throws it.
class LeaseGuard {
  constructor(limiter, key, decision, leaseMs, renewEveryMs) {
    this.limiter = limiter;
    this.key = key;
    this.decision = decision;
    this.leaseMs = leaseMs;
    this.renewEveryMs = renewEveryMs;
    this.renewals = 0;
    // The error that made the guard lost, if it was one (a bug such as WRONGTYPE).
    this.error = null;
    this._lost = false;
    this._released = false;
    this._warned = false;
    this._controller = new AbortController();
    this._timer = null;
    this._renewing = null;
    // The lease's deadline as last known to be moved (performance.now() ms).
    this._heldUntil = performance.now() + leaseMs;
    if (decision.lease !== null && renewEveryMs > 0) {
      this._schedule();
    }
  }

  get lease() {
    return this.decision.lease;
  }

  get failedOpen() {
    return this.decision.failedOpen;
  }

  get lost() {
    return this._lost;
  }

  get signal() {
    return this._controller.signal;
  }

  check() {
    if (this._lost) {
      throw this._controller.signal.reason;
    }
  }

  _schedule() {
    this._timer = setTimeout(() => {
      this._renewing = this._renewOnce().finally(() => {
        this._renewing = null;
      });
    }, this.renewEveryMs);
    this._timer.unref();
  }

  async _renewOnce() {
    let ok;
    try {
      ok = await this.limiter.renew(this.key, this.lease, this.leaseMs);
    } catch (err) {
      if (this._released) {
        return;
      }
      if (err instanceof LimiterUnavailable && performance.now() < this._heldUntil) {
        // The lease may still be live: go on trying until its deadline; past it, it has
        // ended by itself (lost, below).
        if (!this._warned) {
          this._warned = true;
          this.limiter.log('warn', `redis-tb: cannot renew lease ${this.lease} (will retry): ${err.message}`);
        }
        this._schedule();
        return;
      }
      this.error = err;
      this.limiter.log(err instanceof LimiterUnavailable ? 'warn' : 'error',
        `redis-tb: renewing lease ${this.lease} failed; counting it lost: ${err.message}`);
      this._lose();
      return;
    }
    if (this._released) {
      return;
    }
    if (ok) {
      this.renewals += 1;
      this._heldUntil = performance.now() + this.leaseMs;
      this._warned = false;
      this._schedule();
    } else {
      this.limiter.log('warn', `redis-tb: lease ${this.lease} is no longer held (renewal answered 0)`);
      this._lose();
    }
  }

  // tb.leases counts the loss: the server said so ('server': a renewal answered 0, or an error
  // reply), or Redis stayed unreachable past the lease's deadline.
  _lose() {
    this._lost = true;
    const source = this.error instanceof LimiterUnavailable ? 'unavailable_denied' : 'server';
    this.limiter._metrics.lease(this.decision.policy, 'lost', source);
    this._controller.abort(new LeaseLost(`the lease ${this.lease} on ${String(this.key)} is no longer held`,
      this.error ? { cause: this.error } : undefined));
  }

  // Stops renewing and releases (once): true if the lease was held until now.
  async release() {
    clearTimeout(this._timer);
    const first = !this._released;
    this._released = true;
    if (this._renewing) {
      await this._renewing;
    }
    if (!first || this.lease === null) {
      return false;
    }
    return this.limiter.release(this.key, this.lease);
  }

  // The end of a block: an unavailable limiter is logged, not thrown (the lease ends at its
  // deadline by itself); any other error throws, unless the block already failed.
  async _dispose(failed) {
    try {
      await this.release();
    } catch (err) {
      if (err instanceof LimiterUnavailable) {
        this.limiter.log('warn', `redis-tb: could not release lease ${this.lease}; it ends at its deadline: ${err.message}`);
      } else if (failed) {
        this.limiter.log('error', `redis-tb: releasing lease ${this.lease} failed: ${err.message}`);
      } else {
        throw err;
      }
    }
  }

  [Symbol.asyncDispose]() {
    return this._dispose(false);
  }
}

module.exports = { LeaseGuard };
