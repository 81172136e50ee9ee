// Sign-in and roles in Chromium: signed-out visitors land on the sign-in page (generic error on
// a wrong password, back to the page they asked for after signing in); pages hydrate under the
// nonce CSP; an admin manages users through the Users page (server functions carrying the CSRF
// token); a viewer sees no admin controls, and a forged admin request from the viewer's session
// is refused with 403; sign-out ends the session.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, launchBrowser, login, screenshot, waitForHydration } from './support/harness.mjs';

let server;
let viewer;
let admin;
const cspErrors = [];

before(async () => {
  server = await startServer();
  viewer = await launchBrowser();
  admin = await launchBrowser();
});

after(async () => {
  await viewer?.close();
  await admin?.close();
  await server?.stop();
});

function watch(page) {
  page.on('console', (m) => {
    if (/Content[- ]Security[- ]Policy/i.test(m.text())) cspErrors.push(m.text());
  });
  page.on('pageerror', (e) => cspErrors.push(`pageerror: ${e.message}`));
  return page;
}

test('signed-out visitors sign in through the sign-in page and return where they were going', async () => {
  const page = watch(await viewer.newPage());
  await page.goto(`${server.base}/stuck`);
  assert.match(page.url(), /\/login\?next=%2Fstuck$/);
  await page.fill('input[name="username"]', 'viewer');
  await page.fill('input[name="password"]', 'not the password');
  await page.click('button[type="submit"]');
  await page.waitForSelector('[data-testid="login-error"]');
  assert.equal(await page.textContent('[data-testid="login-error"]'), 'Invalid user name or password.');
  await screenshot(page, 'login-error');
  await page.fill('input[name="username"]', 'viewer');
  await page.fill('input[name="password"]', server.users.viewer.password);
  await Promise.all([page.waitForURL(`${server.base}/stuck`), page.click('button[type="submit"]')]);
  await waitForHydration(page);
  assert.equal(await page.getAttribute('[data-testid="userbox"]', 'data-role'), 'viewer');
  await page.close();
});

test('a viewer sees no admin controls and a forged admin request from its session is refused', async () => {
  const page = watch(await viewer.newPage());
  await page.goto(`${server.base}/`);
  await waitForHydration(page);
  const nav = await page.locator('nav[aria-label="Console pages"] a').allTextContents();
  assert.ok(nav.includes('Records') && !nav.includes('Users'), nav.join(', '));
  const forged = await page.evaluate(async () => {
    const token = document.querySelector('meta[name="csrf-token"]').content;
    const post = (path, body) =>
      fetch(path, {
        method: 'POST',
        headers: { 'content-type': 'application/x-www-form-urlencoded', 'x-csrf-token': token },
        body,
      }).then((r) => r.status);
    return {
      token: token.length,
      setRole: await post('/api/fn/set_user_role', 'id=1&role=admin'),
      addUser: await post('/api/fn/add_user', 'name=eve&role=admin&password=eve+password+1'),
      ownToken: await post('/api/fn/create_token', 'name=mine'),
    };
  });
  assert.deepEqual(forged, { token: 32, setRole: 403, addUser: 403, ownToken: 200 });
  const users = await page.goto(`${server.base}/users`);
  assert.equal(users.status(), 403);
  assert.equal(await page.locator('[data-testid="add-user"]').count(), 0);
  assert.equal(server.sql("SELECT count(*) FROM users WHERE name = 'eve'"), '0');
  await page.close();
});

test('a viewer sees no operator buttons on a record and a forged operator request is refused', async () => {
  const id = server.sql(`INSERT INTO dedup_records (consumer_group, message_id, message_type, status, handler_mode,
      attempts, max_attempts, payload_hash, payload, headers, content_type, source_broker, last_error, error_class)
    VALUES ('order-service', 'ORDER.PAY.VIEWER:1', 'ORDER.PAY', 'dead', 'transactional', 5, 5, '\\x00',
      convert_to('{}', 'UTF8'), '{}', 'application/json', 'rabbitmq', 'boom', 'E2E') RETURNING id`);
  const page = watch(await viewer.newPage());
  await page.goto(`${server.base}/records/${id}`);
  await waitForHydration(page);
  await page.getByText('ORDER.PAY.VIEWER:1').first().waitFor();
  assert.equal(await page.locator('[data-testid="record-actions"]').count(), 0, 'no action buttons');
  assert.equal(await page.locator('[data-testid="drill"]').count(), 0, 'no drill button');
  const forged = await page.evaluate(async (recordId) => {
    const token = document.querySelector('meta[name="csrf-token"]').content;
    const post = (path, body) =>
      fetch(path, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-csrf-token': token },
        body: JSON.stringify(body),
      }).then((r) => r.status);
    return {
      rest: await post(`/api/v1/records/${recordId}/requeue`, { reason: 'forged' }),
      serverFn: await post('/api/fn/act_on_record', {}),
    };
  }, id);
  assert.deepEqual(forged, { rest: 403, serverFn: 403 });
  assert.equal(server.sql(`SELECT status FROM dedup_records WHERE id = ${id}`), 'dead');
  await page.close();
});

test('an admin adds a user and changes its role on the Users page', async () => {
  await login(admin, server, server.users.admin);
  const page = watch(await admin.newPage());
  await page.goto(`${server.base}/users`);
  await waitForHydration(page);
  const form = page.locator('[data-testid="add-user"]');
  await form.locator('input[name="name"]').fill('carol');
  await form.locator('select[name="role"]').selectOption('operator');
  await form.locator('input[name="password"]').fill('carol password 1');
  await form.locator('button[type="submit"]').click();
  const row = page.locator('tr[data-user="carol"]');
  await row.waitFor();
  await row.locator('select[name="role"]').selectOption('viewer');
  await row.getByRole('button', { name: 'Set role' }).click();
  const deadline = Date.now() + 10_000;
  while (server.sql("SELECT role FROM users WHERE name = 'carol'") !== 'viewer' && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 200));
  }
  assert.equal(server.sql("SELECT role FROM users WHERE name = 'carol'"), 'viewer');
  await screenshot(page, 'users');
  const audit = server.sql("SELECT string_agg(action, ',' ORDER BY id) FROM audit_log WHERE actor = 'user:admin'");
  assert.match(audit, /auth\.login,.*user\.add,user\.update/);
  await page.close();
});

test('sign-out ends the session', async () => {
  const page = watch(await admin.newPage());
  await page.goto(`${server.base}/account`);
  await waitForHydration(page);
  await Promise.all([page.waitForURL(/\/login/), page.click('[data-testid="logout"]')]);
  await page.goto(`${server.base}/records`);
  assert.match(page.url(), /\/login\?next=%2Frecords$/);
  await page.close();
  assert.deepEqual(cspErrors, [], 'no CSP violations or page errors');
});
