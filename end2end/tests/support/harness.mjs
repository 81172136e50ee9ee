// Test harness: a dedup-console server with a fresh database, and Debian's Chromium.
//
// DEDUP_BIN (set by scripts/test) is the server binary; DEDUP_SITE_ROOT the built site.
import { spawn, execFileSync } from 'node:child_process';
import { mkdtempSync, mkdirSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const here = dirname(fileURLToPath(import.meta.url));
export const ARTIFACTS = join(here, '..', '..', 'artifacts');
const ADMIN_URL = process.env.DEDUP_TEST_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';

function freePort() {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.unref();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

function psql(sql) {
  execFileSync('psql', [ADMIN_URL, '-v', 'ON_ERROR_STOP=1', '-q', '-c', sql], { stdio: 'pipe' });
}

/** Starts the server on a free port with a fresh database; `env` adds configuration. */
export async function startServer(env = {}) {
  const bin = process.env.DEDUP_BIN;
  if (!bin) throw new Error('DEDUP_BIN is not set: run the browser tests through scripts/test');
  const port = await freePort();
  const database = `dce2e_${Math.random().toString(16).slice(2, 14)}`;
  const url = new URL(ADMIN_URL);
  url.pathname = `/${database}`;
  const serverEnv = {
    ...process.env,
    DATABASE_URL: url.toString(),
    DEDUP_LISTEN: `127.0.0.1:${port}`,
    ...env,
  };
  const child = spawn(bin, ['serve'], {
    env: serverEnv,
    stdio: ['ignore', 'inherit', 'pipe'],
  });
  let log = '';
  child.stderr.on('data', (chunk) => { log += chunk; });
  const base = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + 60_000;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`server exited (${child.exitCode}):\n${log}`);
    try {
      const res = await fetch(`${base}/healthz`);
      if (res.ok) break;
    } catch { /* not listening yet */ }
    if (Date.now() > deadline) throw new Error(`server did not start within 60 s:\n${log}`);
    await new Promise((r) => setTimeout(r, 200));
  }
  const server = {
    base,
    database,
    log: () => log,
    /** Runs another `dedup-console` command with the server's configuration; returns stdout. */
    cli(args) {
      return execFileSync(bin, args, { env: serverEnv, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
    },
    /** Runs SQL on the server's database (the engine's schema `dedup` and the order example's
     * `shop` on the search path); returns psql's unaligned output. */
    sql(statement) {
      return execFileSync('psql', [url.toString(), '-v', 'ON_ERROR_STOP=1', '-qAt', '-c', statement], {
        encoding: 'utf8',
        env: { ...process.env, PGOPTIONS: '-c search_path=dedup,shop,public' },
      }).trim();
    },
    /** Adds a user with `role` (`viewer`, `operator`, `admin`) through the CLI; returns its password. */
    addUser(name, role) {
      const password = `${name} password ${Math.random().toString(16).slice(2, 10)}`;
      execFileSync(bin, ['user', 'add', name, '--role', role], {
        env: { ...serverEnv, DEDUP_USER_PASSWORD: password },
        stdio: 'pipe',
      });
      return password;
    },
    async stop() {
      child.kill('SIGTERM');
      await new Promise((r) => (child.exitCode !== null ? r() : child.once('exit', r)));
      psql(`DROP DATABASE IF EXISTS ${database} WITH (FORCE)`);
    },
  };
  server.users = Object.fromEntries(
    ['viewer', 'operator', 'admin'].map((role) => [role, { name: role, password: server.addUser(role, role) }]),
  );
  return server;
}

/** Signs `user` ({ name, password }) in through the sign-in page of `server` in `context`. */
export async function login(context, server, user) {
  const page = await context.newPage();
  await page.goto(`${server.base}/login`);
  await page.fill('input[name="username"]', user.name);
  await page.fill('input[name="password"]', user.password);
  await Promise.all([page.waitForURL((url) => !url.pathname.startsWith('/login')), page.click('button[type="submit"]')]);
  await page.close();
}

/** Launches headless Chromium with a fresh profile; returns the persistent context. */
export async function launchBrowser() {
  const profile = mkdtempSync(join(tmpdir(), 'dc-chromium-'));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
    headless: true,
    args: [
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
  });
  const close = context.close.bind(context);
  context.close = async () => {
    await close();
    rmSync(profile, { recursive: true, force: true });
  };
  return context;
}

/** Saves a full-page screenshot under end2end/artifacts/. */
export async function screenshot(page, name) {
  mkdirSync(ARTIFACTS, { recursive: true });
  await page.screenshot({ path: join(ARTIFACTS, `${name}.png`), fullPage: true });
}

/** Waits until the wasm bundle has hydrated the page. */
export async function waitForHydration(page) {
  await page.waitForSelector('body[data-hydrated="true"]', { timeout: 30_000 });
}

/**
 * Opens `path` of `server` in a new page of `browser` and waits for hydration. `errors` collects
 * the page's script errors and its browser dialogs (dismissed): the console shows its own, so
 * one (an `alert` from a payload, say) is an error.
 */
export async function openPage(browser, server, path) {
  const page = await browser.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(e.message));
  page.on('dialog', (d) => { errors.push(`dialog: ${d.message()}`); d.dismiss(); });
  await page.goto(server.base + path);
  await waitForHydration(page);
  return { page, errors };
}

/**
 * The billing example (examples/billing) with a fresh database: its mail stand-in and its
 * service, which mounts the console at /ops/dedup behind its own staff sign-in. `staff` is the
 * BILLING_STAFF list. BILLING_BIN (set by scripts/test) is the example's binary.
 */
export async function startBilling(staff) {
  const bin = process.env.BILLING_BIN;
  if (!bin) throw new Error('BILLING_BIN is not set: run the browser tests through scripts/test');
  const [port, mailPort] = [await freePort(), await freePort()];
  const tag = Math.random().toString(16).slice(2, 14);
  const database = `dce2e_billing_${tag}`;
  const url = new URL(ADMIN_URL);
  url.pathname = `/${database}`;
  const exchange = `e2e.billing.${tag}`;
  const env = {
    ...process.env,
    DATABASE_URL: url.toString(),
    BILLING_LISTEN: `127.0.0.1:${port}`,
    BILLING_EXCHANGE: exchange,
    BILLING_QUEUE: `e2e.billing.${tag}`,
    BILLING_REDIS_PREFIX: `e2e-billing-${tag}`,
    BILLING_STAFF: staff,
    MAIL_LISTEN: `127.0.0.1:${mailPort}`,
    MAIL_URL: `http://127.0.0.1:${mailPort}`,
  };
  const logs = { mail: '', service: '' };
  const spawnLogged = (args, key) => {
    const child = spawn(bin, args, { env, stdio: ['ignore', 'inherit', 'pipe'] });
    child.stderr.on('data', (chunk) => { logs[key] += chunk; });
    return child;
  };
  // The stand-in first: it creates the database and the billing tables the service migrates too.
  const mail = spawnLogged(['mail-stand-in'], 'mail');
  await waitFor(`http://127.0.0.1:${mailPort}/send`, mail, () => logs.mail, 405);
  const service = spawnLogged(['serve'], 'service');
  const base = `http://127.0.0.1:${port}`;
  await waitFor(`${base}/`, service, () => logs.service, 200);
  return {
    base,
    exchange,
    log: () => logs.service,
    /** Runs `billing <args>` with the service's configuration; returns stdout. */
    cli(args) {
      return execFileSync(bin, args, { env, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
    },
    /** Runs SQL on the service's database (schemas dedup and billing on the search path). */
    sql(statement) {
      return execFileSync('psql', [url.toString(), '-v', 'ON_ERROR_STOP=1', '-qAt', '-c', statement], {
        encoding: 'utf8',
        env: { ...process.env, PGOPTIONS: '-c search_path=dedup,billing,public' },
      }).trim();
    },
    async stop() {
      for (const child of [service, mail]) {
        child.kill('SIGTERM');
        await new Promise((r) => (child.exitCode !== null ? r() : child.once('exit', r)));
      }
      psql(`DROP DATABASE IF EXISTS ${database} WITH (FORCE)`);
    },
  };
}

/** Polls `url` until it answers `status`; fails when `child` exits or after 60 s. */
async function waitFor(url, child, log, status) {
  const deadline = Date.now() + 60_000;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`${url}: process exited (${child.exitCode}):\n${log()}`);
    try {
      if ((await fetch(url)).status === status) return;
    } catch {
      // not listening yet
    }
    if (Date.now() > deadline) throw new Error(`${url} did not answer within 60 s:\n${log()}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}
