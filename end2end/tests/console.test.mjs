// The console's read side in Chromium: every page loads (screenshots kept), filters change the
// URL and the rows, keyset paging forward and back, a payload with markup shown as text, live
// updates while the overview is open, and pause stopping them.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { startServer, launchBrowser, login, screenshot, openPage } from './support/harness.mjs';

let server;
let browser;
let xssId;

before(async () => {
  // A broker topology of its own, so no other server consumes this test's messages.
  const tag = randomBytes(4).toString('hex');
  server = await startServer({
    DEDUP_CONSUMER__RABBITMQ__EXCHANGE: `e2e.console.${tag}`,
    DEDUP_CONSUMER__RABBITMQ__QUEUE: `e2e.console.${tag}`,
  });
  server.cli(['seed', '--records', '3000', '--days', '3', '--batch', '1000']);
  xssId = server.sql(`INSERT INTO dedup_records (consumer_group, message_id, message_type, status, attempts,
      max_attempts, payload_hash, payload, headers, content_type, source_broker, last_error, error_class)
    VALUES ('order-service', 'ORDER.PAY.XSS:1', 'ORDER.PAY', 'dead', 5, 5, '\\x00',
      convert_to('{"note": "<script>alert(1)</script>"}', 'UTF8'), '{"x-message-id": "ORDER.PAY.XSS:1"}',
      'application/json', 'rabbitmq', '<img src=x onerror=alert(2)>', 'X: markup')
    RETURNING id`);
  browser = await launchBrowser();
  await login(browser, server, server.users.viewer);
});

after(async () => {
  await browser?.close();
  await server?.stop();
});

const open = (path) => openPage(browser, server, path);

const rowIds = (page) =>
  page.locator('[data-testid="records-table"] tbody tr').evaluateAll((rows) => rows.map((r) => r.dataset.recordId));

test('every page loads and is kept as a screenshot', async () => {
  for (const [path, heading, name] of [
    ['/', 'Overview', 'overview-seeded'],
    ['/records', 'Records', 'records'],
    ['/stuck', 'Stuck', 'stuck'],
    ['/retries', 'Retries', 'retries'],
    ['/dead-letters', 'Dead letters', 'dead-letters'],
    [`/records/${xssId}`, `Record ${xssId}`, 'record-detail'],
  ]) {
    const { page, errors } = await open(path);
    await page.getByRole('heading', { level: 1, name: heading }).waitFor();
    await screenshot(page, name);
    assert.deepEqual(errors, [], `${path}: no script errors`);
    await page.close();
  }
});

test('filters change the URL and the rows; selection counts rows', async () => {
  const { page, errors } = await open('/records');
  const all = await rowIds(page);
  assert.equal(all.length, 50);

  await page.getByTestId('filter-status').selectOption('dead');
  await page.getByTestId('apply-filters').click();
  await page.waitForURL(/status=dead/);
  await page.waitForFunction(() =>
    [...document.querySelectorAll('[data-testid="records-table"] tbody tr')].every((r) => r.dataset.status === 'dead'));
  const dead = await rowIds(page);
  assert.ok(dead.length > 0 && dead.join() !== all.join(), 'other rows');

  await page.getByTestId('filter-type').selectOption('ORDER.PAY');
  await page.getByTestId('apply-filters').click();
  await page.waitForURL(/type=ORDER.PAY/);
  assert.match(page.url(), /status=dead/, 'filters combine in the URL');

  await page.getByTestId('select-page').check();
  const count = await page.getByTestId('selection-count').textContent();
  assert.equal(count, `${(await rowIds(page)).length} selected`);

  await page.getByTestId('filter-status').selectOption('');
  await page.getByTestId('filter-type').selectOption('');
  await page.getByTestId('filter-prefix').fill('x'.repeat(600));
  await page.getByTestId('apply-filters').click();
  await page.getByTestId('records-error').waitFor();
  assert.match(await page.getByTestId('records-error').textContent(), /limit is 512/);
  assert.deepEqual(errors, []);
});

test('paging goes forward and back by keyset', async () => {
  const { page } = await open('/records?limit=20');
  const first = await rowIds(page);
  await page.getByTestId('pager-next').click();
  await page.waitForURL(/after=/);
  await page.waitForFunction((old) =>
    document.querySelector('[data-testid="records-table"] tbody tr')?.dataset.recordId !== old, first[0]);
  const second = await rowIds(page);
  assert.equal(second.length, 20);
  assert.ok(second.every((id) => !first.includes(id)), 'no row twice');
  await page.getByTestId('pager-next').click();
  await page.waitForURL(/after=/);
  await page.waitForFunction((old) =>
    document.querySelector('[data-testid="records-table"] tbody tr')?.dataset.recordId !== old, second[0]);
  await page.getByTestId('pager-prev').click();
  await page.waitForURL(/before=/);
  await page.waitForFunction((want) =>
    document.querySelector('[data-testid="records-table"] tbody tr')?.dataset.recordId === want, second[0]);
  assert.deepEqual(await rowIds(page), second, 'back to the same page');
});

test('record detail shows a payload with markup as text', async () => {
  const { page, errors } = await open(`/records/${xssId}`);
  const payload = page.getByTestId('record-payload');
  assert.match(await payload.textContent(), /<script>alert\(1\)<\/script>/);
  assert.equal(await payload.locator('script').count(), 0, 'no script element inside the payload');
  assert.equal(await page.locator('img[src="x"]').count(), 0, 'the error text is not markup either');
  await page.waitForTimeout(500);
  assert.deepEqual(errors, [], 'nothing ran');
});

test('live updates arrive while the overview is open, and pause stops them', async () => {
  const { page, errors } = await open('/');
  const total = () => page.getByTestId('live-total').getAttribute('data-value');
  const updatedAt = () => page.getByTestId('live-updated-at').textContent();
  const before = await total();
  // The feed is running: the update time moves without a reload.
  const firstUpdate = await updatedAt();
  await page.waitForFunction((old) => document.querySelector('[data-testid="live-updated-at"]')?.textContent !== old,
    firstUpdate, { timeout: 10_000 });

  server.cli(['simulate', '--orders', '1', '--rate', '0', '--duplicate-rate', '0', '--poison-rate', '0']);
  await page.waitForFunction((old) => document.querySelector('[data-testid="live-total"]')?.dataset.value !== old,
    before, { timeout: 30_000 });
  assert.ok(Number(await total()) > Number(before), 'the new records show up');

  await page.getByTestId('live-toggle').click();
  assert.equal(await page.getByTestId('live-state').textContent(), 'paused');
  const pausedTotal = await total();
  const pausedAt = await updatedAt();
  server.cli(['simulate', '--orders', '1', '--rate', '0', '--duplicate-rate', '0', '--poison-rate', '0']);
  await page.waitForTimeout(4000);
  assert.equal(await total(), pausedTotal, 'no update while paused');
  assert.equal(await updatedAt(), pausedAt);

  await page.getByTestId('live-toggle').click();
  assert.equal(await page.getByTestId('live-state').textContent(), 'live');
  await page.waitForFunction((old) => document.querySelector('[data-testid="live-total"]')?.dataset.value !== old,
    pausedTotal, { timeout: 15_000 });
  await screenshot(page, 'overview-live');
  assert.deepEqual(errors, []);
});
