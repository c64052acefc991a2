// A throwaway redis-server with the redis-tb module on a free loopback port.
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));

export function modulePath() {
  const p = path.resolve(process.env.TB_MODULE ?? path.join(here, '../../../target/release/libredis_tb.so'));
  if (!existsSync(p)) {
    throw new Error(`module not found at ${p} (run \`cargo build --release\` in the repository root, or set TB_MODULE)`);
  }
  return p;
}

function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

function ping(port) {
  return new Promise((resolve) => {
    const sock = net.connect({ port, host: '127.0.0.1' });
    let data = '';
    const done = (ok) => { sock.destroy(); resolve(ok); };
    sock.setTimeout(500, () => done(false));
    sock.on('error', () => done(false));
    sock.on('connect', () => sock.write('PING\r\n'));
    sock.on('data', (d) => { data += d; if (data.includes('\r\n')) done(data.startsWith('+PONG')); });
  });
}

export async function startRedisServer() {
  const module = modulePath();
  const bin = process.env.REDIS_SERVER ?? 'redis-server';
  // A port free when picked may be taken before the server binds it: retry.
  for (let attempt = 0; attempt < 5; attempt++) {
    const port = await freePort();
    const dir = mkdtempSync(path.join(tmpdir(), 'tb-node-'));
    const child = spawn(bin, [
      '--port', String(port), '--bind', '127.0.0.1', '--loadmodule', module,
      '--save', '', '--appendonly', 'no', '--dir', dir,
    ], { stdio: 'ignore' });
    const exited = new Promise((resolve) => child.once('exit', resolve));
    let running = true;
    exited.then(() => { running = false; });
    const server = {
      port,
      url: `redis://127.0.0.1:${port}`,
      get running() { return running; },
      // SIGSTOP / SIGCONT: a server that accepts connections but never answers.
      pause() { child.kill('SIGSTOP'); },
      resume() { child.kill('SIGCONT'); },
      async stop() {
        if (running) {
          child.kill('SIGTERM');
          child.kill('SIGCONT'); // in case it was paused
          await Promise.race([exited, sleep(5000, undefined, { ref: false })]);
          if (running) { child.kill('SIGKILL'); await exited; }
        }
        rmSync(dir, { recursive: true, force: true });
      },
    };
    const deadline = Date.now() + 10_000;
    while (running && Date.now() < deadline) {
      if (await ping(port)) return server;
      await sleep(20);
    }
    await server.stop();
  }
  throw new Error(`redis-server with ${module} did not start`);
}
