// Operator actions in Chromium: release a stuck record and requeue a dead one (confirmation
// dialogs), a bulk requeue with its preview and live progress, a cleanup schedule (invalid cron
// refused, dry run, run now), a duplicate drill, conflicting copies settled, and the audit
// entries of all of them.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { startServer, launchBrowser, login, screenshot, openPage } from './support/harness.mjs';

let server;
let browser;
let exchange;

before(async () => {
  const tag = randomBytes(4).toString('hex');
  exchange = `e2e.actions.${tag}`;
  server = await startServer({
    DEDUP_CONSUMER__RABBITMQ__EXCHANGE: exchange,
    DEDUP_CONSUMER__RABBITMQ__QUEUE: `e2e.actions.${tag}`,
  });
  browser = await launchBrowser();
  // Actions need the operator role, cleanup schedules the admin role.
  await login(browser, server, server.users.admin);
});

after(async () => {
  await browser?.close();
  await server?.stop();
});

const open = (path) => openPage(browser, server, path);

/**
 * Inserts a record; returns its id. A record `age` old was first seen then too, and the engine
 * hands out record ids in arrival order (cleanup relies on it): give it a `rowId` below those of
 * the records the test run made before it.
 */
function insert({ id, status, lease = false, payload = true, age = '0 days', errorClass = 'E2E: gateway #', rowId }) {
  const [idColumn, overriding, idValue] = rowId === undefined ? ['', '', ''] : ['id, ', 'OVERRIDING SYSTEM VALUE', `${rowId}, `];
  return server.sql(`INSERT INTO dedup_records (${idColumn}consumer_group, message_id, message_type, status, handler_mode,
      attempts, max_attempts, lease_owner, lease_token, lease_expires_at, payload_hash, payload, headers, content_type,
      source_broker, source_exchange, source_routing_key, first_seen_at, completed_at, last_error, error_class)
    ${overriding} VALUES (${idValue}'order-service', '${id}', 'ORDER.NOTIFY', '${status}', 'leased', 2, 5,
      ${lease ? "'w:1', gen_random_uuid(), now() - interval '5 minutes'" : 'NULL, NULL, NULL'}, '\\x00',
      ${payload ? "convert_to('{\"orderNo\": \"E2E\"}', 'UTF8')" : 'NULL'}, '{}', 'application/json', 'rabbitmq',
      '${exchange}', 'order.notify', now() - interval '${age}', ${status === 'succeeded' ? `now() - interval '${age}'` : 'NULL'},
      ${status === 'dead' ? `'gateway 503', '${errorClass}'` : 'NULL, NULL'})
    RETURNING id`);
}

test('release a stuck record from its detail page, with reason and confirmation', async () => {
  const id = insert({ id: 'ORDER.NOTIFY.E2E1:1', status: 'processing', lease: true });
  const { page, errors } = await open(`/records/${id}`);
  await page.click('[data-testid="record-actions"] button[data-action="Release"]');
  const dialog = page.locator('[data-testid="confirm-dialog"]');
  await dialog.waitFor();
  assert.match(await dialog.locator('h3').innerText(), /Release 1 record\?/);
  assert.equal(await dialog.locator('[data-testid="confirm-submit"]').isDisabled(), true, 'a reason is required');
  await dialog.locator('[data-testid="confirm-reason"]').fill('worker host w:1 is gone');
  await dialog.locator('[data-testid="confirm-submit"]').click();
  await page.waitForSelector('[data-testid="action-result"]');
  assert.match(await page.innerText('[data-testid="action-result"]'), /is failed now/);
  assert.equal(server.sql(`SELECT status FROM dedup_records WHERE id = ${id}`), 'failed');
  await screenshot(page, 'action-release');
  await page.click('[data-testid="confirm-cancel"]');
  await page.waitForFunction(() => !document.querySelector('[data-testid="confirm-dialog"]'));
  await page.waitForFunction(() => document.querySelector('[data-testid="record-facts"]')?.innerText.includes('failed'));
  assert.deepEqual(errors, []);
});

test('requeue a dead record: its message is published again', async () => {
  const id = insert({ id: 'ORDER.NOTIFY.E2E2:1', status: 'dead' });
  const { page } = await open(`/records/${id}`);
  await page.click('[data-testid="record-actions"] button[data-action="Requeue"]');
  await page.locator('[data-testid="confirm-submit"]').click();
  await page.waitForSelector('[data-testid="action-result"]');
  assert.match(await page.innerText('[data-testid="action-result"]'), /published again/);
});

test('bulk requeue: preview with the exact count and skips, confirm, progress to completed', async () => {
  for (let i = 0; i < 6; i += 1) {
    insert({ id: `ORDER.NOTIFY.E2EB${i}:1`, status: 'dead', payload: i > 0, errorClass: 'E2E: bulk #' });
  }
  const { page } = await open('/dead-letters');
  await page.click('[data-testid="dead-letter-groups"] tr:has-text("E2E: bulk #") [data-testid="bulk-requeue"]');
  await page.waitForSelector('[data-testid="bulk-preview"]');
  assert.equal(await page.innerText('[data-testid="bulk-would-requeue"]'), '5');
  assert.match(await page.innerText('[data-testid="bulk-preview"]'), /payload missing/);
  await page.locator('[data-testid="bulk-rate"]').fill('20');
  await screenshot(page, 'action-bulk-preview');
  await page.click('[data-testid="bulk-confirm"]');
  await page.waitForSelector('[data-testid="bulk-started"]');
  await page.click('[data-testid="bulk-started"] a');
  await page.waitForSelector('[data-testid="requeue-jobs"] tr[data-state="completed"]', { timeout: 20_000 });
  const done = await page.innerText('[data-testid="requeue-jobs"] tr[data-state="completed"] [data-testid="job-done"]');
  assert.equal(done, '5');
  await screenshot(page, 'action-bulk-done');
});

test('cleanup schedule: invalid cron refused, dry run shows the count, run now deletes it', async () => {
  for (let i = 0; i < 7; i += 1) {
    insert({ id: `ORDER.NOTIFY.E2EC${i}:1`, status: 'succeeded', payload: false, age: '45 days', rowId: -7 + i });
  }
  const { page } = await open('/cleanup');
  await page.click('[data-testid="new-schedule"]');
  await page.locator('[data-testid="schedule-name"]').fill('e2e nightly');
  await page.locator('[data-testid="schedule-cron"]').fill('0 25 * * *');
  await page.click('[data-testid="schedule-save"]');
  await page.waitForSelector('[data-testid="schedule-error"]');
  assert.match(await page.innerText('[data-testid="schedule-error"]'), /invalid cron expression "0 25 \* \* \*"/);
  await page.locator('[data-testid="schedule-cron"]').fill('0 3 * * *');
  await page.click('[data-testid="schedule-save"]');
  const row = page.locator('tr[data-schedule-name="e2e nightly"]');
  await row.waitFor();
  await row.locator('[data-testid="dry-run"]').click();
  await row.locator('[data-testid="dry-run-result"]').waitFor();
  assert.equal(await row.locator('[data-testid="dry-run-result"]').getAttribute('data-value'), '7');
  await row.locator('[data-testid="run-now"]').click();
  assert.match(await page.innerText('[data-testid="run-confirm"]'), /7 records would be deleted/);
  await page.click('[data-testid="run-confirm-submit"]');
  await page.waitForSelector('[data-testid="cleanup-runs"] tr[data-finished="true"]', { timeout: 20_000 });
  assert.equal(await page.innerText('[data-testid="cleanup-runs"] tr[data-finished="true"] [data-testid="rows-deleted"]'), '7');
  await screenshot(page, 'action-cleanup');
});

test('duplicate drill on a succeeded record: caught, nothing happened twice', async () => {
  server.cli(['simulate', '--orders', '2', '--rate', '0', '--duplicate-rate', '0', '--poison-rate', '0']);
  let id = '';
  for (let i = 0; i < 100 && !id; i += 1) {
    id = server.sql("SELECT id FROM dedup_records WHERE status = 'succeeded' AND message_type = 'ORDER.CREATE' LIMIT 1");
    if (!id) await new Promise((r) => setTimeout(r, 200));
  }
  assert.ok(id, 'the consumer processed the simulated orders');
  const { page } = await open(`/records/${id}`);
  await page.click('[data-testid="drill"]');
  await page.click('[data-testid="drill-submit"]');
  await page.waitForSelector('[data-testid="drill-report"][data-passed="true"]', { timeout: 20_000 });
  assert.equal(await page.getAttribute('[data-testid="drill-report"]', 'data-caught-by'), 'database');
  await screenshot(page, 'action-drill');
});

test('conflicting copies on a record: one requeued under a new id, one dismissed with a reason', async () => {
  const id = insert({ id: 'order-E2E7', status: 'succeeded', payload: false });
  const copy = (kind, type, payload) => server.sql(`INSERT INTO record_conflicts (record_id, consumer_group, message_id,
      kind, message_type, id_source, payload_hash, payload, headers, content_type, source_broker, source_exchange,
      source_routing_key) VALUES (${id}, 'order-service', 'order-E2E7', '${kind}', '${type}', 'key', '\\x0${kind === 'type' ? 1 : 2}',
      convert_to('${payload}', 'UTF8'), '{}', 'application/json', 'rabbitmq', '${exchange}', 'order.pay') RETURNING id`);
  const reused = copy('type', 'ORDER.PAY', '{"orderNo": "E2E7", "paid": 1}');
  const retried = copy('payload', 'ORDER.NOTIFY', '{"orderNo": "E2E7", "sentAt": 2}');
  const { page, errors } = await open(`/records/${id}`);
  const row = (conflict) => page.locator(`[data-testid="conflicts"] tr[data-conflict-id="${conflict}"]`);
  await row(reused).locator('[data-testid="conflict-requeue"]').click();
  await row(reused).locator('[data-testid="conflict-settled"]').waitFor();
  assert.match(await row(reused).innerText(), new RegExp(`requeued as order-E2E7#conflict-${reused} by user:admin`));
  const dismiss = row(retried).locator('[data-testid="conflict-dismiss"]');
  assert.equal(await dismiss.isDisabled(), true, 'a reason is required');
  await row(retried).locator('[data-testid="conflict-dismiss-reason"]').fill('a producer retry with a new send time');
  await dismiss.click();
  await row(retried).locator('[data-testid="conflict-settled"]').waitFor();
  assert.match(await row(retried).innerText(), /dismissed by user:admin/);
  assert.equal(server.sql(`SELECT count(*) FROM record_conflicts WHERE record_id = ${id} AND settled_at IS NOT NULL`), '2');
  await screenshot(page, 'action-conflicts');
  assert.deepEqual(errors, []);
});

test('the audit page lists every action, filters by outcome, and the record page shows its entries', async () => {
  const { page } = await open('/audit');
  const actions = await page.locator('[data-testid="audit-table"] tbody tr').evaluateAll((rows) =>
    rows.map((r) => `${r.dataset.action}:${r.dataset.outcome}`));
  for (const expected of ['record.release:ok', 'record.requeue:ok', 'bulk.requeue.start:ok', 'cleanup.schedule.create:refused',
    'cleanup.schedule.create:ok', 'cleanup.run:ok', 'record.drill:ok', 'conflict.requeue:ok', 'conflict.dismiss:ok']) {
    assert.ok(actions.includes(expected), `${expected} in ${actions}`);
  }
  await page.selectOption('select[name="outcome"]', 'refused');
  // The filter form's button (the top bar's sign-out is a submit button too).
  await page.click('form:has(select[name="outcome"]) button[type="submit"]');
  await page.waitForURL(/outcome=refused/);
  await page.waitForFunction(() => [...document.querySelectorAll('[data-testid="audit-table"] tbody tr')]
    .every((r) => r.dataset.outcome === 'refused'));
  await screenshot(page, 'action-audit');
  const id = server.sql("SELECT id FROM dedup_records WHERE message_id = 'ORDER.NOTIFY.E2E1:1'");
  const record = await open(`/records/${id}`);
  await record.page.waitForSelector('[data-testid="audit-table"] tr[data-action="record.release"]');
});
